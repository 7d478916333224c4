terraform {
  # 1.5: check blocks and the import block the README mentions.
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 6.8.0: the first release whose aws_sqs_queue accepts a max_message_size
      # above 262144 (SQS raised its limit to 1 MiB in August 2025; provider
      # PR #43710). 6.0 to 6.7 refuse this module's default of 1048576 at plan
      # time ("expected max_message_size to be in the range (1024 - 262144)",
      # provider issue #45152). 6.x also gives data.aws_region its `region`.
      version = ">= 6.8.0, < 7.0.0"
    }
  }
}
