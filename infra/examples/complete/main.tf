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
  subscriber_instance_types = ["g5.xlarge", "g6.xlarge"]
  subscriber_min_count      = 1
  subscriber_max_count      = var.subscriber_max_count
  # Visible messages per running task the fleet holds the queue at.
  subscriber_backlog_per_task_target = 100

  publisher_mode          = var.publisher_mode
  publisher_image         = var.publisher_image
  publisher_authorization = "AWS_IAM"

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
