# Least privilege: each task and function role gets the actions its code
# calls (grep the SDK calls in subscriber/, publisher/ and internal/payload)
# on the ARNs it uses, and nothing else. The GPU instances' role is the
# exception: two AWS managed policies (the ECS agent's, Session Manager's),
# whose actions are on "*" and which AWS changes; the tasks cannot reach it. Batch calls are authorised by their single-message
# action: SendMessageBatch by sqs:SendMessage, DeleteMessageBatch by
# sqs:DeleteMessage, ChangeMessageVisibilityBatch by
# sqs:ChangeMessageVisibility. infra/infra_test.go fails on any allowed
# wildcard action, and on a "*" resource for SQS or S3.
#
# s3:ListBucket is there for missing objects: without it S3 answers GetObject
# on a missing key with 403 instead of 404 (S3 API reference, GetObject:
# "If you don't have the s3:ListBucket permission, Amazon S3 returns an HTTP
# status code 403"), and vramq tells "not there yet" (PutIfAbsent, a job not
# found, an expired claim-check) from a real failure by the 404. The prefix
# condition keeps listing to the role's own prefixes, and covers every prefix
# the role reads (infra_test.go checks that): which s3:prefix S3 evaluates for
# that implicit check is not documented, so the code should not need it where
# it can do without (a conditional write answered 412 says "exists" unread).

locals {
  bucket_arn = aws_s3_bucket.payloads.arn

  kms_statements = var.kms_key_arn == null ? [] : [var.kms_key_arn]

  # ECS services and what their execution roles pull and log to.
  ecs_services = merge(
    {
      subscriber = {
        images        = compact([var.subscriber_image, local.model_server_sidecar ? var.model_server_image : ""])
        log_group_arn = aws_cloudwatch_log_group.subscriber.arn
        # The model server's key and the sidecar's secrets (subscriber.tf).
        secret_arns = local.model_server_secret_arns
      }
    },
    local.publisher_fargate ? {
      publisher = {
        images        = compact([var.publisher_image == null ? "" : var.publisher_image])
        log_group_arn = aws_cloudwatch_log_group.publisher.arn
        secret_arns   = var.publisher_api_keys_secret_arn == null ? [] : [var.publisher_api_keys_secret_arn]
      }
    } : {},
  )

  # An image in ECR (<account>.dkr.ecr.<region>.amazonaws.com/<repository>[:tag|@digest])
  # gets pull rights on exactly its repository; any other registry needs none.
  # A task may have several images (the subscriber and a model server).
  ecr_repository_arns = {
    for k, s in local.ecs_services : k => distinct(compact([for image in s.images : try(format("arn:%s:ecr:%s:%s:repository/%s", local.partition,
      regex("^(\\d{12})\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com(?:\\.cn)?/([^:@]+)", image)[1],
      regex("^(\\d{12})\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com(?:\\.cn)?/([^:@]+)", image)[0],
      regex("^(\\d{12})\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com(?:\\.cn)?/([^:@]+)", image)[2],
    ), "")]))
  }
}

################################################################################
# GPU container instances
################################################################################

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "gpu_instance" {
  name_prefix        = "${local.name}-gpu-instance-"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json

  tags = local.tags
}

# The AWS managed policy of the ECS agent (register the instance, poll for
# tasks, report state). The tasks cannot reach these credentials
# (ECS_AWSVPC_BLOCK_IMDS, hop limit 1): they get their own task roles.
resource "aws_iam_role_policy_attachment" "gpu_instance_ecs" {
  role       = aws_iam_role.gpu_instance.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"
}

# Session Manager instead of SSH: no inbound port, every session logged.
resource "aws_iam_role_policy_attachment" "gpu_instance_ssm" {
  role       = aws_iam_role.gpu_instance.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_instance_profile" "gpu_instance" {
  name_prefix = "${local.name}-gpu-instance-"
  role        = aws_iam_role.gpu_instance.name

  tags = local.tags
}

################################################################################
# ECS task execution roles (pull the image, write the logs)
################################################################################

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    # Only ECS acting for this account (the confused-deputy guard).
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

data "aws_iam_policy_document" "execution" {
  for_each = local.ecs_services

  dynamic "statement" {
    for_each = local.ecr_repository_arns[each.key]

    content {
      sid = "PullImage${statement.key}"
      actions = [
        "ecr:BatchCheckLayerAvailability",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
      ]
      resources = [statement.value]
    }
  }

  # GetAuthorizationToken has no resource-level permissions: AWS requires "*".
  dynamic "statement" {
    for_each = length(local.ecr_repository_arns[each.key]) == 0 ? [] : [1]

    content {
      sid       = "LogInToECR"
      actions   = ["ecr:GetAuthorizationToken"]
      resources = ["*"]
    }
  }

  statement {
    sid       = "WriteLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${each.value.log_group_arn}:log-stream:*"]
  }

  # The container's `secrets`, read by ECS when the task starts: exactly
  # those secrets or parameters. One kept with a customer managed KMS key
  # also needs kms:Decrypt on that key, granted in the key's policy.
  dynamic "statement" {
    for_each = [for arn in each.value.secret_arns : arn if startswith(arn, "arn:${local.partition}:secretsmanager:")]

    content {
      sid       = "ReadSecret${statement.key}"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = [statement.value]
    }
  }

  dynamic "statement" {
    for_each = [for arn in each.value.secret_arns : arn if startswith(arn, "arn:${local.partition}:ssm:")]

    content {
      sid       = "ReadParameter${statement.key}"
      actions   = ["ssm:GetParameters"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role" "execution" {
  for_each = local.ecs_services

  name_prefix        = "${local.name}-${each.key}-exec-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json

  tags = local.tags
}

resource "aws_iam_role_policy" "execution" {
  for_each = local.ecs_services

  name   = "pull-and-log"
  role   = aws_iam_role.execution[each.key].id
  policy = data.aws_iam_policy_document.execution[each.key].json
}

################################################################################
# Subscriber task role
################################################################################

data "aws_iam_policy_document" "subscriber" {
  # ReceiveMessage, DeleteMessageBatch, ChangeMessageVisibilityBatch (the
  # heartbeat and releases): subscriber/sqsqueue.
  statement {
    sid = "ConsumeWork"
    actions = [
      "sqs:ChangeMessageVisibility",
      "sqs:DeleteMessage",
      "sqs:ReceiveMessage",
    ]
    resources = [aws_sqs_queue.work.arn]
  }

  # SendMessageBatch of results, and of poison messages with a reason.
  statement {
    sid       = "SendResultsAndPoison"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.results.arn, aws_sqs_queue.dlq.arn]
  }

  # Claim-checked items; a job's cancel record; its manifest (a failed
  # marker is written only for a chunk below the manifest's chunk count,
  # subscriber/failedmarker.go's manifestChunks: without the read a forged
  # message could mark any chunk number); and everything it writes: a
  # chunk's stored result, failed and cancelled markers are written with
  # PutIfAbsent, which reads first, and the item-error marker is kept
  # readable by the same rule (read what you write).
  statement {
    sid     = "ReadItemsAndResults"
    actions = ["s3:GetObject"]
    resources = [
      "${local.bucket_arn}/payloads/*",
      "${local.bucket_arn}/jobs/*",
      "${local.bucket_arn}/results/*",
      "${local.bucket_arn}/failed/*",
      "${local.bucket_arn}/cancel/*",
      "${local.bucket_arn}/cancelled/*",
      "${local.bucket_arn}/itemerrors/*",
      "${local.bucket_arn}/answers/*",
    ]
  }

  statement {
    sid     = "WriteResultsAndFailedMarkers"
    actions = ["s3:PutObject"]
    resources = [
      "${local.bucket_arn}/results/*",
      "${local.bucket_arn}/failed/*",
      "${local.bucket_arn}/cancelled/*",
      "${local.bucket_arn}/itemerrors/*",
      "${local.bucket_arn}/answers/*",
    ]
  }

  # Items' answers are kept until their chunk's result is out, then deleted
  # (subscriber/answers.go); what a delete misses expires (bucket.tf).
  statement {
    sid       = "ForgetAnswers"
    actions   = ["s3:DeleteObject"]
    resources = ["${local.bucket_arn}/answers/*"]
  }

  statement {
    sid       = "TellMissingObjects"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["payloads/*", "jobs/*", "results/*", "failed/*", "cancel/*", "cancelled/*", "itemerrors/*", "answers/*"]
    }
  }

  # With subscriber_task_protection only: the agent's task-protection
  # endpoint ($ECS_AGENT_URI/task-protection/v1/state) calls these with the
  # task role's credentials.
  dynamic "statement" {
    for_each = var.subscriber_task_protection ? [1] : []

    content {
      sid       = "ScaleInProtection"
      actions   = ["ecs:GetTaskProtection", "ecs:UpdateTaskProtection"]
      resources = ["arn:${local.partition}:ecs:${local.region}:${local.account_id}:task/${aws_ecs_cluster.this.name}/*"]
    }
  }

  # Receiving from a KMS-encrypted queue and reading objects needs Decrypt;
  # sending and writing need GenerateDataKey.
  dynamic "statement" {
    for_each = local.kms_statements

    content {
      sid       = "UseTheKey"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role" "subscriber_task" {
  name_prefix        = "${local.name}-subscriber-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json

  tags = local.tags
}

resource "aws_iam_role_policy" "subscriber_task" {
  name   = "vramq-subscriber"
  role   = aws_iam_role.subscriber_task.id
  policy = data.aws_iam_policy_document.subscriber.json
}

################################################################################
# Publisher role (the Lambda function's, or the Fargate task's)
################################################################################

data "aws_iam_policy_document" "publisher_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = [local.publisher_lambda ? "lambda.amazonaws.com" : "ecs-tasks.amazonaws.com"]
    }

    dynamic "condition" {
      for_each = local.publisher_fargate ? [local.account_id] : []

      content {
        test     = "StringEquals"
        variable = "aws:SourceAccount"
        values   = [condition.value]
      }
    }
  }
}

data "aws_iam_policy_document" "publisher" {
  # SendMessageBatch of chunks, and GetQueueAttributes (MaximumMessageSize,
  # FifoQueue) once at start: publisher/queue.go.
  statement {
    sid       = "SendWork"
    actions   = ["sqs:GetQueueAttributes", "sqs:SendMessage"]
    resources = [aws_sqs_queue.work.arn]
  }

  # Claim-checked items, job manifests, idempotency records, cancel records.
  statement {
    sid     = "WriteItemsManifestsAndKeys"
    actions = ["s3:PutObject"]
    resources = [
      "${local.bucket_arn}/payloads/*",
      "${local.bucket_arn}/jobs/*",
      "${local.bucket_arn}/idempotency/*",
      "${local.bucket_arn}/cancel/*",
    ]
  }

  # GET /v1/jobs/{id}: the manifest, stored results and failed markers;
  # idempotency records are read before they are written.
  statement {
    sid     = "ReadJobStatus"
    actions = ["s3:GetObject"]
    resources = [
      "${local.bucket_arn}/jobs/*",
      "${local.bucket_arn}/idempotency/*",
      "${local.bucket_arn}/results/*",
      "${local.bucket_arn}/failed/*",
      "${local.bucket_arn}/cancel/*",
      "${local.bucket_arn}/cancelled/*",
      "${local.bucket_arn}/itemerrors/*",
    ]
  }

  # Listing results/{job}/, failed/{job}/, cancelled/{job}/ and itemerrors/{job}/ for status, files/{owner}/ for
  # GET /v1/files, batches/{owner}/ for GET /v1/batches, and 404s for the rest.
  statement {
    sid       = "ListJobStatus"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["jobs/*", "idempotency/*", "results/*", "failed/*", "cancel/*", "cancelled/*", "itemerrors/*", "files/*", "batches/*"]
    }
  }

  # OpenAI's Files API (publisher/files.go): an upload is a PutObject, or a
  # multipart upload (s3:PutObject covers its create, parts and complete)
  # that a refused upload aborts; a file is read, and deleted with its
  # record (DELETE /v1/files/{id}, or a refused upload's content).
  statement {
    sid       = "Files"
    actions   = ["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    resources = ["${local.bucket_arn}/files/*"]
  }

  # OpenAI's Batch API (publisher/batches.go): a batch's record and its
  # lines' custom ids, written at create and moved by conditional writes
  # until it ends, and its open marker (batches/open/), deleted when it ends
  # (publisher/batchstate.go); its output and error files are files/
  # (above), its job the prefixes above.
  statement {
    sid       = "Batches"
    actions   = ["s3:PutObject", "s3:GetObject", "s3:DeleteObject"]
    resources = ["${local.bucket_arn}/batches/*"]
  }

  # Under Lambda the function reads its bearer keys itself at a cold start
  # (on Fargate the execution role injects them): exactly that secret.
  dynamic "statement" {
    for_each = local.publisher_lambda && var.publisher_api_keys_secret_arn != null ? [var.publisher_api_keys_secret_arn] : []

    content {
      sid       = "ReadAPIKeys"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = [statement.value]
    }
  }

  # Under Lambda the function writes its own logs; on Fargate the execution
  # role does.
  dynamic "statement" {
    for_each = local.publisher_lambda ? [aws_cloudwatch_log_group.publisher.arn] : []

    content {
      sid       = "WriteLogs"
      actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
      resources = ["${statement.value}:log-stream:*"]
    }
  }

  dynamic "statement" {
    for_each = local.kms_statements

    content {
      sid       = "UseTheKey"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role" "publisher" {
  name_prefix        = "${local.name}-publisher-"
  assume_role_policy = data.aws_iam_policy_document.publisher_assume.json

  tags = local.tags
}

resource "aws_iam_role_policy" "publisher" {
  name   = "vramq-publisher"
  role   = aws_iam_role.publisher.id
  policy = data.aws_iam_policy_document.publisher.json
}
