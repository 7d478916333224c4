# Alarms, each notifying alarm_sns_topic_arn (if given) when it fires and when
# it clears.

locals {
  alarm_actions = var.alarm_sns_topic_arn == null ? [] : [var.alarm_sns_topic_arn]

  # The namespace of the metrics the subscriber publishes through its logs
  # (metric filters below).
  log_metric_namespace = "vramq/${local.name}"

  # The OOM-retries metric: how the subscriber publishes it to CloudWatch.
  # Every batch that runs out of memory and is split or set aside to run alone
  # (the vramq_subscriber_oom_retries_total counter on /metrics) logs exactly
  # one of these two WARN lines (subscriber/run.go); the filter counts them in
  # the task's JSON logs. No CloudWatch agent, no PutMetricData permission.
  oom_log_messages = [
    "out of memory; splitting the batch in halves",
    "out of memory in a batch of one; will run it alone",
  ]

  # The operator state: a subscriber whose model said nothing runs until a
  # person acts (a spent quota, a refused key, an unknown model) logs this
  # line once, at ERROR (subscriber/pause.go), and sets
  # vramq_subscriber_needs_operator to 1; it probes every -operator-probe and
  # resumes by itself once a probe gets through. The task stays up: its
  # liveness check ignores the state (a replacement has the same key and
  # quota).
  operator_log_message = "the model needs an operator: nothing is received, held messages wait holding their leases, and one message runs as a probe every operator_probe until it gets through"
}

resource "aws_cloudwatch_metric_alarm" "dlq_not_empty" {
  alarm_name        = "${local.name}-dlq-not-empty"
  alarm_description = "Messages are waiting in ${aws_sqs_queue.dlq.name}: poison (see their vramq-dlq-reason attribute and failed/ in the payload bucket) or failing on every receive. Inspect, fix, then redrive them (README: Deploying to AWS)."
  namespace         = "AWS/SQS"
  metric_name       = "ApproximateNumberOfMessagesVisible"
  dimensions        = { QueueName = aws_sqs_queue.dlq.name }

  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  # SQS stops reporting a queue nobody touches (after about six hours), even
  # one that still holds messages: missing data keeps the alarm as it was, so
  # a DLQ that is full and quiet stays in ALARM until it is emptied.
  treat_missing_data = "ignore"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}

# Dead letters expire with the DLQ's retention; warn while there is time to
# look at them. Missing data keeps the state, as above.
resource "aws_cloudwatch_metric_alarm" "dlq_oldest_message_age" {
  alarm_name        = "${local.name}-dlq-oldest-message-age"
  alarm_description = "The oldest message in ${aws_sqs_queue.dlq.name} is older than ${var.dlq_message_age_alarm_seconds} s; the queue deletes messages older than ${var.dlq_message_retention_seconds} s. Inspect and redrive or discard (README: Deploying to AWS)."
  namespace         = "AWS/SQS"
  metric_name       = "ApproximateAgeOfOldestMessage"
  dimensions        = { QueueName = aws_sqs_queue.dlq.name }

  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  threshold           = var.dlq_message_age_alarm_seconds
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "ignore"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}

resource "aws_cloudwatch_metric_alarm" "work_oldest_message_age" {
  alarm_name        = "${local.name}-work-oldest-message-age"
  alarm_description = "The oldest message on ${aws_sqs_queue.work.name} is older than ${var.oldest_message_age_alarm_seconds} s: the subscribers are not keeping up (at max count, or no GPU capacity), or none is running."
  namespace         = "AWS/SQS"
  metric_name       = "ApproximateAgeOfOldestMessage"
  dimensions        = { QueueName = aws_sqs_queue.work.name }

  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  threshold           = var.oldest_message_age_alarm_seconds
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}

resource "aws_cloudwatch_log_metric_filter" "oom_retries" {
  name           = "${local.name}-subscriber-oom-retries"
  log_group_name = aws_cloudwatch_log_group.subscriber.name
  pattern        = "{ $.level = \"WARN\" && ($.msg = \"${local.oom_log_messages[0]}\" || $.msg = \"${local.oom_log_messages[1]}\") }"

  metric_transformation {
    namespace     = local.log_metric_namespace
    name          = "SubscriberOOMRetries"
    value         = "1"
    default_value = "0"
    unit          = "Count"
  }
}

resource "aws_cloudwatch_metric_alarm" "oom_retries" {
  alarm_name        = "${local.name}-subscriber-oom-retries"
  alarm_description = "The subscribers split or isolated more than ${var.oom_retries_alarm_threshold} batches for out-of-memory in 5 minutes: a model's Cost under-estimates what Run allocates, or something else uses the GPU. Nothing is lost, but throughput suffers."
  namespace         = local.log_metric_namespace
  metric_name       = aws_cloudwatch_log_metric_filter.oom_retries.metric_transformation[0].name

  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  threshold           = var.oom_retries_alarm_threshold
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}

resource "aws_cloudwatch_log_metric_filter" "needs_operator" {
  name           = "${local.name}-subscriber-needs-operator"
  log_group_name = aws_cloudwatch_log_group.subscriber.name
  pattern        = "{ $.level = \"ERROR\" && $.msg = \"${local.operator_log_message}\" }"

  metric_transformation {
    namespace     = local.log_metric_namespace
    name          = "SubscriberNeedsOperator"
    value         = "1"
    default_value = "0"
    unit          = "Count"
  }
}

# Each task logs the line once, when it stops, so this fires when
# subscribers stop for an operator and clears 5 minutes later, while the
# tasks still wait: /healthz (readiness) and vramq_subscriber_needs_operator
# keep saying so until the tasks are restarted.
resource "aws_cloudwatch_metric_alarm" "needs_operator" {
  alarm_name        = "${local.name}-subscriber-needs-operator"
  alarm_description = "A subscriber stopped taking work until someone acts: its model server refused with a spent quota (429 insufficient_quota), a refused key (401) or an unknown model (see the ERROR lines in ${aws_cloudwatch_log_group.subscriber.name}). The task stays up and ECS does not replace it (its health check is liveness); its messages wait on the queue. Fix the cause, then restart the tasks: aws ecs update-service --cluster ${aws_ecs_cluster.this.name} --service ${aws_ecs_service.subscriber.name} --force-new-deployment."
  namespace         = local.log_metric_namespace
  metric_name       = aws_cloudwatch_log_metric_filter.needs_operator.metric_transformation[0].name

  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}

# Fewer tasks running than the service wants, for long enough that it is not a
# scale-out in progress: tasks failing their health check (ECS replaces them),
# crashing at start, or no GPU capacity to place them.
resource "aws_cloudwatch_metric_alarm" "subscriber_tasks_below_desired" {
  alarm_name          = "${local.name}-subscriber-tasks-below-desired"
  alarm_description   = "Fewer subscriber tasks run than desired for ${var.tasks_below_desired_alarm_periods * 5} minutes: failing health checks (/livez answers 503 after a minute of failed receives, or a lost device), crashes at start (see the log group ${aws_cloudwatch_log_group.subscriber.name} and stopped tasks' reasons), or no GPU instances to be had."
  evaluation_periods  = var.tasks_below_desired_alarm_periods
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"

  metric_query {
    id          = "missing"
    expression  = "desired - running"
    label       = "Desired minus running subscriber tasks"
    return_data = true
  }

  metric_query {
    id = "desired"

    metric {
      namespace   = "ECS/ContainerInsights"
      metric_name = "DesiredTaskCount"
      dimensions  = { ClusterName = aws_ecs_cluster.this.name, ServiceName = aws_ecs_service.subscriber.name }
      stat        = "Minimum"
      period      = 300
    }
  }

  metric_query {
    id = "running"

    metric {
      namespace   = "ECS/ContainerInsights"
      metric_name = "RunningTaskCount"
      dimensions  = { ClusterName = aws_ecs_cluster.this.name, ServiceName = aws_ecs_service.subscriber.name }
      stat        = "Maximum"
      period      = 300
    }
  }

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}

# What clients got: every 5xx the HTTP API answered, whether the function
# answered it (a 500 internal error, a 503 overloaded: a response, which
# Lambda counts as a success), API Gateway did (the function crashed, timed
# out, or its event or response was over Lambda's 6 MB), or the function
# never ran. Lambda's Errors metric counts only the second kind. HTTP APIs
# publish "5xx" (lower case, unlike REST APIs' 5XXError) by ApiId
# (API Gateway: "Working with metrics for HTTP APIs").
resource "aws_cloudwatch_metric_alarm" "publisher_api_5xx" {
  count = local.publisher_lambda ? 1 : 0

  alarm_name        = "${local.name}-publisher-5xx"
  alarm_description = "The job API answered 5xx in the last 5 minutes: the publisher's own 500s and 503s (overloaded, an SQS or S3 failure) and API Gateway's for a function that failed. See the access log group ${aws_cloudwatch_log_group.publisher_access[0].name} (status, error) and the function's logs."
  namespace         = "AWS/ApiGateway"
  metric_name       = "5xx"
  dimensions        = { ApiId = aws_apigatewayv2_api.publisher[0].id }

  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}

resource "aws_cloudwatch_metric_alarm" "publisher_lambda_errors" {
  count = local.publisher_lambda ? 1 : 0

  alarm_name        = "${local.name}-publisher-errors"
  alarm_description = "The publisher function failed (crashed or timed out) in the last 5 minutes; API Gateway answered those requests 500. The publisher's own 5xx answers are responses, not function errors: the 5xx alarm counts them."
  namespace         = "AWS/Lambda"
  metric_name       = "Errors"
  dimensions        = { FunctionName = aws_lambda_function.publisher[0].function_name }

  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}

# Fargate's counterpart of the 5xx alarm: answers of the publisher tasks
# (HTTPCode_Target_5XX_Count) and of the balancer itself, for a target that
# failed or could not be reached (HTTPCode_ELB_5XX_Count).
resource "aws_cloudwatch_metric_alarm" "publisher_alb_5xx" {
  count = local.publisher_fargate ? 1 : 0

  alarm_name          = "${local.name}-publisher-5xx"
  alarm_description   = "The job API answered 5xx in the last 5 minutes: the publisher's own 500s and 503s (overloaded, an SQS or S3 failure), or the load balancer's for tasks it could not reach. See the log group ${aws_cloudwatch_log_group.publisher.name}."
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"

  metric_query {
    id          = "errors"
    expression  = "targets + balancer"
    label       = "5xx answers of the publisher and its load balancer"
    return_data = true
  }

  metric_query {
    id = "targets"

    metric {
      namespace   = "AWS/ApplicationELB"
      metric_name = "HTTPCode_Target_5XX_Count"
      dimensions  = { LoadBalancer = aws_lb.publisher[0].arn_suffix }
      stat        = "Sum"
      period      = 300
    }
  }

  metric_query {
    id = "balancer"

    metric {
      namespace   = "AWS/ApplicationELB"
      metric_name = "HTTPCode_ELB_5XX_Count"
      dimensions  = { LoadBalancer = aws_lb.publisher[0].arn_suffix }
      stat        = "Sum"
      period      = 300
    }
  }

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}

resource "aws_cloudwatch_metric_alarm" "publisher_unhealthy_targets" {
  count = local.publisher_fargate ? 1 : 0

  alarm_name        = "${local.name}-publisher-unhealthy"
  alarm_description = "Publisher tasks fail the load balancer's /healthz check."
  namespace         = "AWS/ApplicationELB"
  metric_name       = "UnHealthyHostCount"
  dimensions = {
    LoadBalancer = aws_lb.publisher[0].arn_suffix
    TargetGroup  = aws_lb_target_group.publisher[0].arn_suffix
  }

  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 3
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions

  tags = local.tags
}
