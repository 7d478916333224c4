# Outputs never fail: anything that exists in one publisher_mode only is
# wrapped in try().

output "queue_url" {
  description = "URL of the work queue (QUEUE_URL)."
  value       = aws_sqs_queue.work.url
}

output "queue_arn" {
  description = "ARN of the work queue, the destination of a redrive from the DLQ (messages the subscriber dead-lettered itself record no source, so start-message-move-task needs --destination-arn)."
  value       = aws_sqs_queue.work.arn
}

output "results_queue_url" {
  description = "URL of the results queue (RESULTS_QUEUE_URL): where your consumer reads results."
  value       = aws_sqs_queue.results.url
}

output "results_queue_arn" {
  description = "ARN of the results queue, to grant your consumer sqs:ReceiveMessage and sqs:DeleteMessage on."
  value       = aws_sqs_queue.results.arn
}

output "dlq_url" {
  description = "URL of the dead-letter queue (DLQ_URL)."
  value       = aws_sqs_queue.dlq.url
}

output "dlq_arn" {
  description = "ARN of the dead-letter queue, the source of a redrive: aws sqs start-message-move-task --source-arn <dlq_arn> --destination-arn <queue_arn>."
  value       = aws_sqs_queue.dlq.arn
}

output "queue_names" {
  description = "Names of the work, results and dead-letter queues."
  value       = { for k, q in local.queues : k => q.name }
}

output "payload_bucket" {
  description = "Name of the payload bucket (PAYLOAD_BUCKET)."
  value       = aws_s3_bucket.payloads.id
}

output "payload_bucket_arn" {
  description = "ARN of the payload bucket."
  value       = aws_s3_bucket.payloads.arn
}

output "environment" {
  description = "The contract's environment variables, as bin/queues prints them: for running loadgen or a local publisher against this deployment."
  value = {
    QUEUE_URL         = aws_sqs_queue.work.url
    RESULTS_QUEUE_URL = aws_sqs_queue.results.url
    DLQ_URL           = aws_sqs_queue.dlq.url
    PAYLOAD_BUCKET    = aws_s3_bucket.payloads.id
  }
}

output "api_url" {
  description = "Base URL of the publisher's job API (POST {api_url}/v1/jobs): the edge's with publisher_edge, else the HTTP API's in lambda mode, the load balancer's in fargate mode."
  value = try(
    "https://${aws_cloudfront_distribution.publisher[0].domain_name}",
    # The $default stage's URL ends in a slash; {api_url}/v1/jobs must not get two.
    trimsuffix(aws_apigatewayv2_stage.publisher[0].invoke_url, "/"),
    format("%s://%s", var.publisher_certificate_arn == null ? "http" : "https", aws_lb.publisher[0].dns_name),
    null,
  )
}

output "publisher_function_name" {
  description = "Name of the publisher Lambda function (lambda mode), else null."
  value       = try(aws_lambda_function.publisher[0].function_name, null)
}

output "publisher_service_name" {
  description = "Name of the publisher ECS service (fargate mode), else null."
  value       = try(aws_ecs_service.publisher[0].name, null)
}

output "publisher_role_arn" {
  description = "ARN of the publisher's role (the function's or the task's)."
  value       = aws_iam_role.publisher.arn
}

output "cluster_name" {
  description = "Name of the ECS cluster."
  value       = aws_ecs_cluster.this.name
}

output "cluster_arn" {
  description = "ARN of the ECS cluster."
  value       = aws_ecs_cluster.this.arn
}

output "subscriber_service_name" {
  description = "Name of the subscriber ECS service."
  value       = aws_ecs_service.subscriber.name
}

output "subscriber_task_role_arn" {
  description = "ARN of the subscriber's task role."
  value       = aws_iam_role.subscriber_task.arn
}

output "subscriber_log_group" {
  description = "CloudWatch log group of the subscriber (JSON lines)."
  value       = aws_cloudwatch_log_group.subscriber.name
}

output "publisher_log_group" {
  description = "CloudWatch log group of the publisher."
  value       = aws_cloudwatch_log_group.publisher.name
}

output "gpu_capacity_provider_name" {
  description = "Name of the ECS capacity provider of the GPU instances."
  value       = aws_ecs_capacity_provider.gpu.name
}

output "gpu_autoscaling_group_name" {
  description = "Name of the GPU instances' Auto Scaling group."
  value       = aws_autoscaling_group.gpu.name
}

output "alarm_names" {
  description = "Names of the CloudWatch alarms."
  value = compact([
    aws_cloudwatch_metric_alarm.dlq_not_empty.alarm_name,
    aws_cloudwatch_metric_alarm.dlq_oldest_message_age.alarm_name,
    aws_cloudwatch_metric_alarm.work_oldest_message_age.alarm_name,
    aws_cloudwatch_metric_alarm.oom_retries.alarm_name,
    aws_cloudwatch_metric_alarm.needs_operator.alarm_name,
    aws_cloudwatch_metric_alarm.subscriber_tasks_below_desired.alarm_name,
    try(aws_cloudwatch_metric_alarm.publisher_api_5xx[0].alarm_name, ""),
    try(aws_cloudwatch_metric_alarm.publisher_lambda_errors[0].alarm_name, ""),
    try(aws_cloudwatch_metric_alarm.publisher_alb_5xx[0].alarm_name, ""),
    try(aws_cloudwatch_metric_alarm.publisher_unhealthy_targets[0].alarm_name, ""),
  ])
}

output "events_topic_arn" {
  description = "ARN of the completion events' SNS topic (docs/events.md); null unless completion_events."
  value       = local.events_topic_arn
}
