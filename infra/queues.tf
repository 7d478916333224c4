# The three queues of localstack/queues.json, with the same names (behind
# name_prefix) and attributes; infra/infra_test.go compares the two.
#
# Encryption: SSE-SQS (SQS-owned keys, no cost, no key policy) unless
# kms_key_arn names a customer managed key.

locals {
  queue_names = {
    work    = "vramq-work"
    results = "vramq-results"
    dlq     = "vramq-dlq"
  }

  queues = {
    work    = aws_sqs_queue.work
    results = aws_sqs_queue.results
    dlq     = aws_sqs_queue.dlq
  }

  # The work queue's receive budget (variables.tf, max_receive_count): 12
  # for the retries of a 10-minute outage. Waits that are not a message's
  # fault (a model server's rate limit or spent quota, backpressure, a
  # restart) cost no receive (docs/reliability.md), so a model server needs
  # no more.
  max_receive_count = var.max_receive_count != null ? var.max_receive_count : 12
}

# Created first: the work queue's redrive policy names it.
resource "aws_sqs_queue" "dlq" {
  name                      = "${var.name_prefix}${local.queue_names.dlq}"
  message_retention_seconds = var.dlq_message_retention_seconds
  max_message_size          = var.max_message_size

  sqs_managed_sse_enabled           = var.kms_key_arn == null ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = var.kms_key_arn == null ? null : var.kms_data_key_reuse_period_seconds

  tags = local.tags
}

resource "aws_sqs_queue" "work" {
  name = "${var.name_prefix}${local.queue_names.work}"
  # The subscriber receives with its own -visibility-timeout (set to this
  # below) and extends every held message every third of it; this default
  # is for any other consumer.
  visibility_timeout_seconds = var.visibility_timeout_seconds
  receive_wait_time_seconds  = var.receive_wait_time_seconds
  message_retention_seconds  = var.message_retention_seconds
  max_message_size           = var.max_message_size

  sqs_managed_sse_enabled           = var.kms_key_arn == null ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = var.kms_key_arn == null ? null : var.kms_data_key_reuse_period_seconds

  # A message that fails on every receive (crashes, timeouts, lost leases)
  # lands in the DLQ after max_receive_count receives instead of looping.
  # Poison the subscriber recognises goes there at once, with a reason.
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq.arn
    maxReceiveCount     = local.max_receive_count
  })

  tags = local.tags
}

resource "aws_sqs_queue" "results" {
  name                      = "${var.name_prefix}${local.queue_names.results}"
  receive_wait_time_seconds = var.receive_wait_time_seconds
  message_retention_seconds = var.results_message_retention_seconds
  max_message_size          = var.max_message_size

  sqs_managed_sse_enabled           = var.kms_key_arn == null ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = var.kms_key_arn == null ? null : var.kms_data_key_reuse_period_seconds

  tags = local.tags
}

# Only the work queue may use the DLQ as its dead-letter queue. A separate
# resource because the policy names the work queue, whose redrive policy
# names the DLQ: inline on both, the two would depend on each other.
resource "aws_sqs_queue_redrive_allow_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.work.arn]
  })
}

# Every queue refuses requests that do not come over TLS. Access itself is
# granted by the roles' identity policies (iam.tf), not here.
data "aws_iam_policy_document" "queue_tls_only" {
  for_each = local.queues

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [each.value.arn]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_sqs_queue_policy" "tls_only" {
  for_each = local.queues

  queue_url = each.value.id
  policy    = data.aws_iam_policy_document.queue_tls_only[each.key].json
}
