# The whole pipeline with a handful of variables: the queues, the payload
# bucket, the subscriber on GPU instances, the publisher as a Lambda function
# behind an HTTP API (IAM auth), the alarms mailed to an address.

provider "aws" {
  region = var.region

  default_tags {
    tags = { "environment" = var.name_prefix == "" ? "default" : trimsuffix(var.name_prefix, "-") }
  }
}

module "vramq" {
  source = "../.."

  name_prefix = var.name_prefix

  vpc_id     = var.vpc_id
  subnet_ids = var.subnet_ids

  subscriber_image          = var.subscriber_image
  subscriber_ami_id         = var.subscriber_ami_id
  subscriber_instance_types = ["g5.xlarge", "g6.xlarge"]
  # 0: no GPU instance while the queue is empty; 1: one kept warm.
  subscriber_min_count = var.subscriber_min_count
  subscriber_max_count = var.subscriber_max_count
  # Visible messages per wanted task the fleet holds the queue at.
  subscriber_backlog_per_task_target = 100

  publisher_mode          = var.publisher_mode
  publisher_authorization = "AWS_IAM"
  # fargate only:
  publisher_image               = var.publisher_image
  publisher_alb_subnet_ids      = var.publisher_alb_subnet_ids
  publisher_certificate_arn     = var.publisher_certificate_arn
  publisher_api_keys_secret_arn = var.publisher_api_keys_secret_arn

  alarm_sns_topic_arn = aws_sns_topic.alarms.arn
}

resource "aws_sns_topic" "alarms" {
  name = "${var.name_prefix}vramq-alarms"
}

resource "aws_sns_topic_subscription" "alarms" {
  count = var.alarm_email == null ? 0 : 1

  topic_arn = aws_sns_topic.alarms.arn
  protocol  = "email"
  endpoint  = var.alarm_email
}
