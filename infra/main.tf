# vramq on AWS: the queues (queues.tf) and the payload bucket (bucket.tf) that
# the publisher (publisher.tf) fills and the GPU subscriber (subscriber.tf,
# autoscaling.tf) drains, with least-privilege roles (iam.tf) and alarms
# (alarms.tf). The names and attributes match localstack/queues.json, which
# infra/infra_test.go checks.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  # Every name starts like the queues' (bin/queues -prefix), so one prefix
  # keeps a whole deployment apart from another in the same account.
  name = "${var.name_prefix}vramq"

  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.region

  tags = merge({ "app" = "vramq" }, var.tags)
}
