################################################################################
# Completion events (docs/events.md): with completion_events, an SNS topic
# that gets one event per job when its last chunk settles, published by the
# subscriber (VRAMQ_EVENTS_TOPIC_ARN), which decides who sends with a
# conditional write of done/{job_id}.json in the payload bucket.
################################################################################

resource "aws_sns_topic" "events" {
  count = var.completion_events ? 1 : 0

  name_prefix = "${local.name}-events-"
  # SNS has no default encryption: the AWS managed key, or the module's own.
  kms_master_key_id = var.kms_key_arn == null ? "alias/aws/sns" : var.kms_key_arn

  tags = local.tags
}

locals {
  events_topic_arn   = var.completion_events ? aws_sns_topic.events[0].arn : null
  events_environment = var.completion_events ? { VRAMQ_EVENTS_TOPIC_ARN = aws_sns_topic.events[0].arn } : {}
}

# What the subscriber needs for events beyond its other work: read the job's
# manifest, count its settled chunks (List), write and read the done marker,
# and publish.
data "aws_iam_policy_document" "subscriber_events" {
  count = var.completion_events ? 1 : 0

  statement {
    sid       = "PublishCompletionEvents"
    actions   = ["sns:Publish"]
    resources = [aws_sns_topic.events[0].arn]
  }

  statement {
    sid       = "ReadManifestsAndDoneMarkers"
    actions   = ["s3:GetObject"]
    resources = ["${local.bucket_arn}/jobs/*", "${local.bucket_arn}/done/*"]
  }

  statement {
    sid       = "WriteDoneMarkers"
    actions   = ["s3:PutObject"]
    resources = ["${local.bucket_arn}/done/*"]
  }

  statement {
    sid       = "CountSettledChunks"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["results/*", "failed/*", "cancelled/*"]
    }
  }
}

resource "aws_iam_role_policy" "subscriber_events" {
  count = var.completion_events ? 1 : 0

  name   = "vramq-subscriber-events"
  role   = aws_iam_role.subscriber_task.id
  policy = data.aws_iam_policy_document.subscriber_events[0].json
}
