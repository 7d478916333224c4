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
#
# s3:ListBucket covers every prefix this policy reads, as in iam.tf: S3
# answers a GetObject of a missing key with 404 only to a caller that may
# list the bucket, and with 403 to anyone else (S3: GetObject, "Permissions").
# A missing done marker is the normal case (the first check of a settled
# job), and a missing manifest is a message naming no job: read as 403, every
# check failed and no event was ever sent. Which s3:prefix S3 evaluates for
# that implicit check is not documented, so the Go side should not rest on
# it either: a conditional write answered 412 says "exists" without a read.
# Item-error markers are read and listed under the main policy (iam.tf).
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
      values   = ["results/*", "failed/*", "cancelled/*", "jobs/*", "done/*"]
    }
  }
}

resource "aws_iam_role_policy" "subscriber_events" {
  count = var.completion_events ? 1 : 0

  name   = "vramq-subscriber-events"
  role   = aws_iam_role.subscriber_task.id
  policy = data.aws_iam_policy_document.subscriber_events[0].json
}
