terraform {
  # 1.5: check blocks and the import block the README mentions.
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 6.x: data.aws_region's `region` attribute, and an aws_sqs_queue whose
      # max_message_size accepts 1 MiB (SQS raised its limit in August 2025).
      version = ">= 6.0, < 7.0"
    }
  }
}
