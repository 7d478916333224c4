output "api_url" {
  description = "Base URL of the job API: POST {api_url}/v1/jobs."
  value       = module.vramq.api_url
}

output "publisher_keys_secret_arn" {
  description = "The secret of the publisher's bearer keys: put them in it (aws secretsmanager put-secret-value --secret-id <arn> --secret-string 'team-a:KEY')."
  value       = var.publisher_api_keys_secret_arn != null ? var.publisher_api_keys_secret_arn : aws_secretsmanager_secret.publisher_keys[0].arn
}

output "environment" {
  description = "QUEUE_URL, RESULTS_QUEUE_URL, DLQ_URL and PAYLOAD_BUCKET of this deployment."
  value       = module.vramq.environment
}

output "cluster_name" {
  description = "ECS cluster of the subscriber."
  value       = module.vramq.cluster_name
}

output "subscriber_service_name" {
  description = "ECS service of the subscriber."
  value       = module.vramq.subscriber_service_name
}

output "subscriber_log_group" {
  description = "CloudWatch log group of the subscriber."
  value       = module.vramq.subscriber_log_group
}

output "alarms_topic_arn" {
  description = "SNS topic the alarms notify."
  value       = aws_sns_topic.alarms.arn
}

output "queue_arn" {
  description = "ARN of the work queue: the destination of a redrive from the DLQ."
  value       = module.vramq.queue_arn
}

output "dlq_arn" {
  description = "ARN of the dead-letter queue: the source of a redrive (aws sqs start-message-move-task --source-arn <dlq_arn> --destination-arn <queue_arn>)."
  value       = module.vramq.dlq_arn
}
