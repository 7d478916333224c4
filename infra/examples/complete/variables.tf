variable "region" {
  description = "AWS region to deploy to; pick one that has the GPU instance types (g5, g6)."
  type        = string
  default     = "us-east-1"
}

variable "name_prefix" {
  description = "Prefix of every name, e.g. \"dev-\"; empty for the plain vramq-work etc."
  type        = string
  default     = ""
}

variable "vpc_id" {
  description = "VPC to run in."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets with a NAT gateway (or VPC endpoints for SQS, S3, ECR, ECS and CloudWatch Logs), in two or more zones."
  type        = list(string)
}

variable "subscriber_image" {
  description = "The CUDA subscriber image pushed to ECR, e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/vramq-subscriber-cuda:v1."
  type        = string
}

variable "subscriber_max_count" {
  description = "Most subscriber tasks, and GPU instances."
  type        = number
  default     = 4
}

variable "publisher_mode" {
  description = "\"lambda\" (needs bin/publisher-lambda.zip: make lambda) or \"fargate\" (needs publisher_image)."
  type        = string
  default     = "lambda"
}

variable "publisher_image" {
  description = "The publisher image in ECR, for publisher_mode = \"fargate\"."
  type        = string
  default     = null
}

variable "alarm_email" {
  description = "Address the alarms are mailed to (confirm the subscription mail SNS sends). Null: none."
  type        = string
  default     = null
}
