# The publisher, one of two ways (publisher_mode):
#
#   lambda   the make lambda zip (provided.al2023, bootstrap) behind an API
#            Gateway HTTP API, authorised by IAM (SigV4), a JWT issuer, or
#            the publisher's own bearer keys. Nothing runs while no job comes.
#   fargate  the container image as an ECS service on Fargate behind an
#            Application Load Balancer: no 6 MB Lambda payload limit, no cold
#            starts, /metrics to scrape on a port of its own that the load
#            balancer does not reach.
#
# Both run the same handler (cmd/publisher switches to Lambda when
# AWS_LAMBDA_RUNTIME_API is set) with the same role policy (iam.tf).

locals {
  publisher_lambda  = var.publisher_mode == "lambda"
  publisher_fargate = var.publisher_mode == "fargate"

  # The gateway's authorization of the authorised routes (publisher_routes).
  # With bearer keys the publisher checks the Authorization header of every
  # route itself, so the gateway must let it through unchecked; that is
  # also what lets the OpenAI SDKs (Authorization: Bearer <key>) reach the
  # Files and Batch routes. Without keys, SigV4.
  publisher_authorization = var.publisher_authorization != null ? var.publisher_authorization : (var.publisher_api_keys_secret_arn == null ? "AWS_IAM" : "NONE")

  publisher_lambda_zip   = coalesce(var.publisher_lambda_zip, "${path.module}/../bin/publisher-lambda.zip")
  publisher_port         = 8080
  publisher_metrics_port = 9090

  # The API's paths, the only ones the load balancer forwards (Fargate);
  # anything else, /metrics included, gets a 404 from the balancer itself.
  # A listener rule takes at most 5 condition values ("Quotas for your
  # Application Load Balancers": condition values per rule 5, not
  # adjustable), so the paths are two rules' worth.
  publisher_alb_paths_jobs    = ["/v1/jobs", "/v1/jobs/*", "/v1/files", "/v1/files/*", "/healthz"]
  publisher_alb_paths_batches = ["/v1/batches", "/v1/batches/*", "/v1/messages/batches", "/v1/messages/batches/*"]
  publisher_alb_paths         = concat(local.publisher_alb_paths_jobs, local.publisher_alb_paths_batches)

  publisher_environment = merge(local.publisher_file_environment, var.publisher_environment, local.publisher_body_environment, {
    QUEUE_URL        = aws_sqs_queue.work.url
    PAYLOAD_BUCKET   = aws_s3_bucket.payloads.id
    VRAMQ_LOG_FORMAT = "json"
  })

  # The routes of the publisher's API, as publisher.Handler's mux has them
  # (infra_test.go compares the two): an HTTP API answers 404 itself for a
  # method and path no route names, so a route left out here is an endpoint
  # clients cannot reach in lambda mode. {id} is a path variable in both
  # (API Gateway: "Working with routes for HTTP APIs"). /healthz stays open
  # for probes. /metrics is not routed: under Lambda each instance counts
  # only its own requests.
  publisher_routes = {
    "POST /v1/jobs"                = true
    "GET /v1/jobs/{id}"            = true
    "DELETE /v1/jobs/{id}"         = true
    "POST /v1/files"               = true
    "GET /v1/files"                = true
    "GET /v1/files/{id}"           = true
    "DELETE /v1/files/{id}"        = true
    "GET /v1/files/{id}/content"   = true
    "POST /v1/batches"             = true
    "GET /v1/batches"              = true
    "GET /v1/batches/{id}"         = true
    "POST /v1/batches/{id}/cancel" = true
    # Anthropic's Message Batches
    "POST /v1/messages/batches"             = true
    "GET /v1/messages/batches"              = true
    "GET /v1/messages/batches/{id}"         = true
    "DELETE /v1/messages/batches/{id}"      = true
    "POST /v1/messages/batches/{id}/cancel" = true
    "GET /v1/messages/batches/{id}/results" = true
    "GET /healthz"                          = false
  }

  # The largest request body the publisher takes (VRAMQ_MAX_BODY_BYTES).
  # Under Lambda the whole request travels inside the invocation event,
  # which Lambda caps at 6 MB (6291456 bytes) for a synchronous call, and
  # API Gateway may hand it over base64-encoded (4/3 of the body): 4 MiB
  # becomes 5592408 bytes, leaving about 700 KB for the headers and the
  # event's own fields. So a body the publisher accepts reaches it, and
  # a larger one gets the publisher's JSON 413 instead of API Gateway's bare
  # 500 (an HTTP API takes payloads of up to 10 MB, so the 6 MB one is what
  # binds). On Fargate the publisher's own default (32 MiB) applies unless
  # publisher_max_body_bytes says otherwise.
  publisher_lambda_max_body_bytes = 4194304
  publisher_max_body_bytes        = local.publisher_lambda ? coalesce(var.publisher_max_body_bytes, local.publisher_lambda_max_body_bytes) : var.publisher_max_body_bytes
  publisher_body_environment      = local.publisher_max_body_bytes == null ? {} : { VRAMQ_MAX_BODY_BYTES = tostring(local.publisher_max_body_bytes) }
  # A file uploaded to POST /v1/files travels in the invocation event too,
  # so under Lambda it is bounded alike (docs/api.md, Files): a file the
  # publisher takes reaches it, and GET /v1/files/{id}/content answers it
  # within Lambda's 6 MB response (base64: 4/3 of 4 MiB is 5592408
  # bytes). On Fargate the publisher streams files of up to 200 MiB. A
  # VRAMQ_MAX_FILE_BYTES in publisher_environment wins over this one.
  publisher_file_environment = local.publisher_lambda ? { VRAMQ_MAX_FILE_BYTES = tostring(local.publisher_lambda_max_body_bytes) } : {}
  # The file limit the function gets, in bytes, as the publisher reads it
  # (internal/bytesize: a number, then an optional unit; 0 is its 200 MiB
  # default): -1 where it does not parse here, which the precondition
  # refuses with the rest.
  publisher_size_units     = { "" = 1, b = 1, kb = 1000, mb = 1000000, gb = 1000000000, kib = 1024, mib = 1048576, gib = 1073741824 }
  publisher_max_file_given = regexall("^\\s*([0-9]+(?:\\.[0-9]+)?)\\s?([A-Za-z]*)\\s*$", lookup(merge(local.publisher_file_environment, var.publisher_environment), "VRAMQ_MAX_FILE_BYTES", "0"))
  publisher_max_file_bytes = try(floor(tonumber(local.publisher_max_file_given[0][0]) * local.publisher_size_units[lower(local.publisher_max_file_given[0][1])]), -1)
}

resource "aws_cloudwatch_log_group" "publisher" {
  name              = local.publisher_lambda ? "/aws/lambda/${local.name}-publisher" : "/ecs/${local.name}/publisher"
  retention_in_days = var.log_retention_days

  tags = local.tags
}

################################################################################
# Lambda + API Gateway HTTP API
################################################################################

resource "aws_lambda_function" "publisher" {
  count = local.publisher_lambda ? 1 : 0

  function_name    = "${local.name}-publisher"
  role             = aws_iam_role.publisher.arn
  runtime          = "provided.al2023"
  handler          = "bootstrap"
  architectures    = [var.publisher_lambda_architecture]
  filename         = local.publisher_lambda_zip
  source_code_hash = filebase64sha256(local.publisher_lambda_zip)
  memory_size      = var.publisher_lambda_memory_size
  timeout          = var.publisher_lambda_timeout

  reserved_concurrent_executions = var.publisher_lambda_reserved_concurrency

  environment {
    # Lambda cannot inject a secret into the environment as ECS does: the
    # function reads the keys itself, once per cold start
    # (cmd/publisher/secret.go), given the secret's ARN.
    variables = merge(local.publisher_environment, var.publisher_api_keys_secret_arn == null ? {} : {
      VRAMQ_API_KEYS_SECRET = var.publisher_api_keys_secret_arn
      }, local.publisher_edge ? {
      # Large downloads redirect within the edge's origin (edge.tf).
      VRAMQ_PUBLIC_URL = "https://${aws_cloudfront_distribution.publisher[0].domain_name}"
    } : {})
  }

  logging_config {
    # The publisher writes JSON lines itself.
    log_format = "Text"
    log_group  = aws_cloudwatch_log_group.publisher.name
  }

  tags = local.tags

  depends_on = [aws_iam_role_policy.publisher]

  lifecycle {
    precondition {
      condition     = local.publisher_max_body_bytes <= local.publisher_lambda_max_body_bytes
      error_message = "publisher_max_body_bytes: at most 4194304 (4 MiB) in lambda mode: Lambda takes a request event of at most 6 MB, and API Gateway may base64-encode the body (4/3 of it) into that event."
    }
    # A file the publisher takes must reach it in the invocation event and
    # go back out in the 6 MB response, as bodies must.
    precondition {
      condition     = local.publisher_max_file_bytes >= 1 && local.publisher_max_file_bytes <= local.publisher_lambda_max_body_bytes
      error_message = "VRAMQ_MAX_FILE_BYTES in publisher_environment: 1 byte to 4194304 (4 MiB) in lambda mode, in bytes or with a unit (B, KB, MB, GB, KiB, MiB, GiB): an upload travels in Lambda's 6 MB request event and a download in its 6 MB response, both base64-encoded (4/3). Larger files need publisher_mode = \"fargate\"."
    }
    precondition {
      condition     = var.publisher_api_keys_secret_arn == null || can(regex("^arn:[^:]+:secretsmanager:", var.publisher_api_keys_secret_arn))
      error_message = "publisher_api_keys_secret_arn: under Lambda the function reads the keys from Secrets Manager itself: give a Secrets Manager secret's ARN (an SSM parameter works with publisher_mode = \"fargate\", where ECS injects it)."
    }
  }
}

resource "aws_apigatewayv2_api" "publisher" {
  count = local.publisher_lambda ? 1 : 0

  name          = "${local.name}-publisher"
  protocol_type = "HTTP"
  description   = "vramq job API: /v1/jobs, and OpenAI's Files and Batch API: /v1/files, /v1/batches"

  tags = local.tags

  lifecycle {
    # SigV4 and a JWT travel in the Authorization header, where the
    # publisher looks for its bearer key on every route: a request the
    # gateway lets through would be refused 401 by the publisher, and the
    # other way round.
    precondition {
      condition     = var.publisher_api_keys_secret_arn == null || local.publisher_authorization == "NONE"
      error_message = "publisher_api_keys_secret_arn with publisher_authorization = \"AWS_IAM\" or \"JWT\": the publisher checks its bearer keys in the Authorization header that SigV4 and JWT use, so no request could pass both. Leave publisher_authorization null (NONE with keys), or give no keys."
    }
  }
}

resource "aws_apigatewayv2_integration" "publisher" {
  count = local.publisher_lambda ? 1 : 0

  api_id           = aws_apigatewayv2_api.publisher[0].id
  integration_type = "AWS_PROXY"
  integration_uri  = aws_lambda_function.publisher[0].invoke_arn
  # Required for every type but MOCK; API Gateway invokes a Lambda function
  # with POST whatever the client's method was.
  integration_method     = "POST"
  payload_format_version = "2.0"
  timeout_milliseconds   = 30000
}

resource "aws_apigatewayv2_authorizer" "jwt" {
  count = local.publisher_lambda && local.publisher_authorization == "JWT" ? 1 : 0

  api_id           = aws_apigatewayv2_api.publisher[0].id
  name             = "jwt"
  authorizer_type  = "JWT"
  identity_sources = ["$request.header.Authorization"]

  jwt_configuration {
    issuer   = var.publisher_jwt_issuer
    audience = var.publisher_jwt_audience
  }

  lifecycle {
    precondition {
      condition     = var.publisher_jwt_issuer != null && length(var.publisher_jwt_audience) > 0
      error_message = "publisher_authorization = \"JWT\" needs publisher_jwt_issuer and publisher_jwt_audience."
    }
  }
}

resource "aws_apigatewayv2_route" "publisher" {
  for_each = local.publisher_lambda ? local.publisher_routes : {}

  api_id             = aws_apigatewayv2_api.publisher[0].id
  route_key          = each.key
  target             = "integrations/${aws_apigatewayv2_integration.publisher[0].id}"
  authorization_type = each.value ? local.publisher_authorization : "NONE"
  authorizer_id      = each.value && local.publisher_authorization == "JWT" ? aws_apigatewayv2_authorizer.jwt[0].id : null
}

resource "aws_cloudwatch_log_group" "publisher_access" {
  count = local.publisher_lambda ? 1 : 0

  name              = "/aws/apigateway/${local.name}-publisher"
  retention_in_days = var.log_retention_days

  tags = local.tags
}

resource "aws_apigatewayv2_stage" "publisher" {
  count = local.publisher_lambda ? 1 : 0

  api_id      = aws_apigatewayv2_api.publisher[0].id
  name        = "$default"
  auto_deploy = true

  # The API's global limit, in front of the function: requests over it are
  # answered 429 by API Gateway and never invoke it. Per client, the
  # publisher's own limit (VRAMQ_RATE_LIMIT, by sourceIp or API key) applies
  # within each instance.
  default_route_settings {
    throttling_burst_limit = var.publisher_throttling_burst_limit
    throttling_rate_limit  = var.publisher_throttling_rate_limit
  }

  access_log_settings {
    destination_arn = aws_cloudwatch_log_group.publisher_access[0].arn
    format = jsonencode({
      requestId      = "$context.requestId"
      ip             = "$context.identity.sourceIp"
      caller         = "$context.identity.caller"
      routeKey       = "$context.routeKey"
      status         = "$context.status"
      responseLength = "$context.responseLength"
      latency        = "$context.integrationLatency"
      error          = "$context.integrationErrorMessage"
    })
  }

  tags = local.tags
}

resource "aws_lambda_permission" "publisher_api" {
  count = local.publisher_lambda ? 1 : 0

  statement_id  = "AllowInvokeFromTheHttpApi"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.publisher[0].function_name
  principal     = "apigateway.amazonaws.com"
  source_arn    = "${aws_apigatewayv2_api.publisher[0].execution_arn}/*/*"
}

# The batch sweeper (publisher/sweeper.go): under Lambda nothing runs
# between requests, so an EventBridge schedule invokes the same function
# with a Scheduled Event, which runs one pass (publisher.LambdaEvents): it
# expires batches at their window and finalizes those whose job has settled.
# A batch therefore ends at most a minute (plus the pass) after its job
# settles, read or not (at once with completion_events, below). A pass that finalizes a batch larger than the
# function's timeout allows is cut off; the next pass after 10 minutes takes
# its claim over (finalizeStale).
resource "aws_cloudwatch_event_rule" "publisher_batch_sweep" {
  count = local.publisher_lambda ? 1 : 0

  name                = "${local.name}-publisher-batch-sweep"
  description         = "vramq: the publisher's batch sweeper (expiry and finalization of batches)"
  schedule_expression = "rate(1 minute)"

  tags = local.tags
}

resource "aws_cloudwatch_event_target" "publisher_batch_sweep" {
  count = local.publisher_lambda ? 1 : 0

  rule = aws_cloudwatch_event_rule.publisher_batch_sweep[0].name
  arn  = aws_lambda_function.publisher[0].arn
}

resource "aws_lambda_permission" "publisher_batch_sweep" {
  count = local.publisher_lambda ? 1 : 0

  statement_id  = "AllowInvokeFromTheBatchSweepSchedule"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.publisher[0].function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.publisher_batch_sweep[0].arn
}

# With completion_events, the function also takes the events of batches'
# jobs (those with a batch_id) from the topic, and finalizes each batch as
# soon as its job settles (publisher.LambdaEvents); the schedule above is
# then the backstop.
resource "aws_sns_topic_subscription" "publisher_batch_events" {
  count = local.publisher_lambda && var.completion_events ? 1 : 0

  topic_arn           = aws_sns_topic.events[0].arn
  protocol            = "lambda"
  endpoint            = aws_lambda_function.publisher[0].arn
  filter_policy_scope = "MessageBody"
  filter_policy       = jsonencode({ batch_id = [{ exists = true }] })
}

resource "aws_lambda_permission" "publisher_batch_events" {
  count = local.publisher_lambda && var.completion_events ? 1 : 0

  statement_id  = "AllowInvokeFromTheCompletionEvents"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.publisher[0].function_name
  principal     = "sns.amazonaws.com"
  source_arn    = aws_sns_topic.events[0].arn
}

################################################################################
# Fargate + Application Load Balancer
################################################################################

data "aws_vpc" "this" {
  count = local.publisher_fargate ? 1 : 0

  id = var.vpc_id
}

# The load balancer's subnets: its nodes take their addresses there, so these
# blocks are the only proxies the publisher trusts for X-Forwarded-For.
# Keyed by position, not by id: for_each keys must be known at plan time
# ("The for_each meta-argument": "keys ... must be known values"), and a
# subnet created in the same apply has no id until then; the list's length is
# known.
data "aws_subnet" "publisher_alb" {
  for_each = local.publisher_fargate ? { for i, id in var.publisher_alb_subnet_ids : tostring(i) => id } : {}

  id = each.value
}

resource "aws_security_group" "publisher_alb" {
  count = local.publisher_fargate ? 1 : 0

  name_prefix = "${local.name}-publisher-alb-"
  description = "vramq publisher load balancer"
  vpc_id      = var.vpc_id

  ingress {
    description = var.publisher_certificate_arn == null ? "HTTP" : "HTTPS"
    from_port   = var.publisher_certificate_arn == null ? 80 : 443
    to_port     = var.publisher_certificate_arn == null ? 80 : 443
    protocol    = "tcp"
    cidr_blocks = length(var.publisher_alb_ingress_cidr_blocks) > 0 ? var.publisher_alb_ingress_cidr_blocks : [data.aws_vpc.this[0].cidr_block]
  }

  # The API port only: the balancer cannot reach the metrics port.
  egress {
    description = "To the publisher tasks"
    from_port   = local.publisher_port
    to_port     = local.publisher_port
    protocol    = "tcp"
    cidr_blocks = [data.aws_vpc.this[0].cidr_block]
  }

  tags = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "publisher_tasks" {
  count = local.publisher_fargate ? 1 : 0

  name_prefix = "${local.name}-publisher-"
  description = "vramq publisher tasks: HTTP from the load balancer, metrics from the scrapers named, HTTPS out to SQS, S3 and ECR"
  vpc_id      = var.vpc_id

  ingress {
    description     = "The job API, from the load balancer"
    from_port       = local.publisher_port
    to_port         = local.publisher_port
    protocol        = "tcp"
    security_groups = [aws_security_group.publisher_alb[0].id]
  }

  # /metrics names every tenant label and the process's internals: only the
  # scrapers named (metrics_ingress_cidr_blocks, as for the subscriber), not
  # the whole VPC. Empty: nobody.
  dynamic "ingress" {
    for_each = length(var.metrics_ingress_cidr_blocks) > 0 ? [1] : []

    content {
      description = "Prometheus scrapes of /metrics"
      from_port   = local.publisher_metrics_port
      to_port     = local.publisher_metrics_port
      protocol    = "tcp"
      cidr_blocks = var.metrics_ingress_cidr_blocks
    }
  }

  egress {
    description = "HTTPS to AWS APIs (through a NAT gateway or VPC endpoints)"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  tags = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb" "publisher" {
  count = local.publisher_fargate ? 1 : 0

  name_prefix        = "vramq-"
  internal           = var.publisher_alb_internal
  load_balancer_type = "application"
  subnets            = var.publisher_alb_subnet_ids
  security_groups    = [aws_security_group.publisher_alb[0].id]

  drop_invalid_header_fields = true
  # Jobs of up to -max-body-bytes from slow clients.
  idle_timeout = 120

  tags = local.tags

  lifecycle {
    precondition {
      condition     = length(var.publisher_alb_subnet_ids) >= 2
      error_message = "publisher_mode = \"fargate\" needs publisher_alb_subnet_ids: subnets in two zones or more (public ones for an internet-facing load balancer)."
    }
    # The publisher trusts X-Forwarded-For from these subnets' addresses: a
    # task or instance of this module there could forge a client address.
    precondition {
      condition     = length(setintersection(var.publisher_alb_subnet_ids, var.subnet_ids)) == 0
      error_message = "publisher_alb_subnet_ids must not be among subnet_ids: the publisher trusts every address of the load balancer's subnets as a proxy, so they must hold load balancers only."
    }
    precondition {
      condition     = var.publisher_alb_internal || var.publisher_certificate_arn != null
      error_message = "An internet-facing load balancer (publisher_alb_internal = false) needs publisher_certificate_arn: the job API and its bearer keys must not cross the internet in plain HTTP."
    }
  }
}

resource "aws_lb_target_group" "publisher" {
  count = local.publisher_fargate ? 1 : 0

  name_prefix = "vramq-"
  port        = local.publisher_port
  protocol    = "HTTP"
  target_type = "ip"
  vpc_id      = var.vpc_id

  # Longer than the publisher's shutdown grace would only delay deployments.
  deregistration_delay = var.publisher_shutdown_grace_seconds

  health_check {
    path                = "/healthz"
    matcher             = "200"
    interval            = 15
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }

  tags = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "publisher" {
  count = local.publisher_fargate ? 1 : 0

  load_balancer_arn = aws_lb.publisher[0].arn
  port              = var.publisher_certificate_arn == null ? 80 : 443
  protocol          = var.publisher_certificate_arn == null ? "HTTP" : "HTTPS"
  certificate_arn   = var.publisher_certificate_arn
  ssl_policy        = var.publisher_certificate_arn == null ? null : "ELBSecurityPolicy-TLS13-1-2-2021-06"

  # Only the job API's paths are forwarded (the rule below); anything else,
  # /metrics included, is answered here, in the JSON the API answers with.
  default_action {
    type = "fixed-response"

    fixed_response {
      content_type = "application/json"
      message_body = jsonencode({ error = "not found" })
      status_code  = "404"
    }
  }

  tags = local.tags
}

resource "aws_lb_listener_rule" "publisher_api" {
  count = local.publisher_fargate ? 1 : 0

  listener_arn = aws_lb_listener.publisher[0].arn
  priority     = 1

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.publisher[0].arn
  }

  condition {
    path_pattern {
      values = local.publisher_alb_paths_jobs
    }
  }

  tags = local.tags
}

resource "aws_lb_listener_rule" "publisher_batches" {
  count = local.publisher_fargate ? 1 : 0

  listener_arn = aws_lb_listener.publisher[0].arn
  priority     = 2

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.publisher[0].arn
  }

  condition {
    path_pattern {
      values = local.publisher_alb_paths_batches
    }
  }

  tags = local.tags
}

resource "aws_ecs_task_definition" "publisher" {
  count = local.publisher_fargate ? 1 : 0

  family                   = "${local.name}-publisher"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.publisher_cpu
  memory                   = var.publisher_memory
  execution_role_arn       = aws_iam_role.execution["publisher"].arn
  task_role_arn            = aws_iam_role.publisher.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.publisher_cpu_architecture
  }

  # The image is distroless (no shell): the load balancer's /healthz check
  # is the health check.
  container_definitions = jsonencode([
    {
      name      = "publisher"
      image     = var.publisher_image
      essential = true

      # The rate limits key on the client's address, which the balancer
      # appends to X-Forwarded-For. The publisher reads that header from the
      # right, skipping trusted proxies: trusting the VPC's block would skip
      # the true address of any client inside the VPC and take whatever the
      # client wrote further left (a fresh rate-limit bucket per request).
      # So only the balancer's own subnets are trusted (its nodes' addresses
      # are there and nothing else may be: see the preconditions of aws_lb).
      # Behind another proxy as well (CloudFront), set VRAMQ_TRUSTED_PROXIES
      # in publisher_environment.
      environment = [for k, v in merge(
        { VRAMQ_TRUSTED_PROXIES = join(",", sort([for s in data.aws_subnet.publisher_alb : s.cidr_block])) },
        local.publisher_environment,
        {
          VRAMQ_ADDR           = ":${local.publisher_port}"
          VRAMQ_METRICS_ADDR   = ":${local.publisher_metrics_port}"
          VRAMQ_SHUTDOWN_GRACE = "${var.publisher_shutdown_grace_seconds}s"
        },
      ) : { name = k, value = v }]

      # Bearer keys come from Secrets Manager or SSM Parameter Store when the
      # task starts: never in the task definition, the environment variables
      # it shows, or the Terraform state (which holds only the ARN).
      secrets = var.publisher_api_keys_secret_arn == null ? null : [
        { name = "VRAMQ_API_KEYS", valueFrom = var.publisher_api_keys_secret_arn },
      ]

      stopTimeout = min(var.publisher_shutdown_grace_seconds + 5, 120)

      portMappings = [
        { containerPort = local.publisher_port, protocol = "tcp" },
        { containerPort = local.publisher_metrics_port, protocol = "tcp" },
      ]

      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.publisher.name
          awslogs-region        = local.region
          awslogs-stream-prefix = "publisher"
          mode                  = "non-blocking"
          max-buffer-size       = "25m"
        }
      }
    },
  ])

  tags = local.tags

  lifecycle {
    precondition {
      condition     = var.publisher_image != null
      error_message = "publisher_mode = \"fargate\" needs publisher_image."
    }
  }
}

resource "aws_ecs_service" "publisher" {
  count = local.publisher_fargate ? 1 : 0

  name            = "publisher"
  cluster         = aws_ecs_cluster.this.id
  task_definition = aws_ecs_task_definition.publisher[0].arn
  desired_count   = var.publisher_desired_count

  capacity_provider_strategy {
    capacity_provider = "FARGATE"
    weight            = 1
  }

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.publisher_tasks[0].id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.publisher[0].arn
    container_name   = "publisher"
    container_port   = local.publisher_port
  }

  health_check_grace_period_seconds = 30

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  propagate_tags = "SERVICE"

  tags = local.tags

  depends_on = [aws_lb_listener_rule.publisher_api, aws_lb_listener_rule.publisher_batches, aws_ecs_cluster_capacity_providers.this]
}
