variable "region" {
  description = "AWS region to deploy to; pick one that has the GPU instance types (g5, g6)."
  type        = string
  default     = "us-east-1"
}

variable "name_prefix" {
  description = "Prefix of every name, e.g. \"dev-\"; empty for the plain vramq-work etc."
  type        = string
  default     = ""
  nullable    = false
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

variable "subscriber_ami_id" {
  description = "The ECS GPU-optimised AMI, pinned: aws ssm get-parameter --name /aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id --query Parameter.Value --output text."
  type        = string
}

variable "subscriber_min_count" {
  description = "Fewest subscriber tasks: 0 scales to zero (no GPU cost while idle, 5-10 minutes before the first message after a quiet spell is worked on); 1 keeps a g5.xlarge warm (about $1 an hour on demand)."
  type        = number
  default     = 0
}

variable "subscriber_max_count" {
  description = "Most subscriber tasks, one GPU instance each; a deployment may run twice as many instances for a few minutes, so the GPU quota must cover 2 x this x 4 vCPUs."
  type        = number
  default     = 4
}

variable "publisher_mode" {
  description = "\"lambda\" (needs bin/publisher-lambda.zip: make lambda) or \"fargate\" (needs publisher_image)."
  type        = string
  default     = "lambda"
}

variable "publisher_edge" {
  description = "Lambda mode: a CloudFront edge in front of the API and the payload bucket, for clients of the OpenAI SDK for Go that download files over 4.5 MB (docs/deployment.md, Large downloads under Lambda)."
  type        = bool
  default     = false
}

variable "publisher_image" {
  description = "The publisher image in ECR, for publisher_mode = \"fargate\"."
  type        = string
  default     = null
}

variable "publisher_alb_subnet_ids" {
  description = "For publisher_mode = \"fargate\": subnets for the load balancer alone, in two or more zones, none of subnet_ids (the publisher trusts their addresses as proxies)."
  type        = list(string)
  default     = []
}

variable "publisher_certificate_arn" {
  description = "For publisher_mode = \"fargate\": ACM certificate of the load balancer's HTTPS listener (required for an internet-facing one). Null: plain HTTP inside the VPC."
  type        = string
  default     = null
}

variable "publisher_api_keys_secret_arn" {
  description = "Complete ARN of a Secrets Manager secret of yours holding the publisher's bearer keys (comma- or line-separated, key or name:key; fargate mode also takes an SSM SecureString parameter). Null: the example creates an empty secret for them (output publisher_keys_secret_arn)."
  type        = string
  default     = null
}

variable "alarm_email" {
  description = "Address the alarms are mailed to (confirm the subscription mail SNS sends). Null: none."
  type        = string
  default     = null
}
