# The payload bucket: what does not fit in a message, and what the publisher
# and subscriber share. Its layout (internal/payload):
#
#   payloads/{job_id}/{item}.json   items too large for a message (publisher writes, subscriber reads)
#   jobs/{job_id}.json              job manifests (publisher)
#   idempotency/{sha256}.json       Idempotency-Key records (publisher)
#   results/{job_id}/{chunk}.json   chunk results (subscriber writes, publisher reads)
#   failed/{job_id}/{chunk}.json    why a chunk was dead-lettered (subscriber writes, publisher reads)
#   cancel/{job_id}.json            a job's cancel record (publisher writes on DELETE, subscriber reads)
#   cancelled/{job_id}/{chunk}.json a chunk deleted unrun after a cancel (subscriber writes, publisher reads)
#   itemerrors/{job_id}/{chunk}.json items of a chunk the model refused (subscriber writes, publisher reads)
#   answers/{owner}/{job_id}/{chunk}/ items' answers until the chunk's result is out (subscriber only)
#   done/{job_id}.json              a settled job's completion event marker (subscriber, completion_events)
#   files/{owner}/{file_id}.jsonl   a file uploaded to POST /v1/files, and .json its record (publisher)
#   batches/{owner}/{batch_id}.json a batch (POST /v1/batches), and .ids its lines' custom ids (publisher)
#   batches/open/{batch_id}         a batch not yet ended, for the publisher's sweeper (deleted when it ends)
#
# Objects are written once and expire by prefix (local.payload_expiration_days
# has a key for each, which infra_test.go compares with package job's layout);
# there is no versioning to pay for.

locals {
  # The variable names only the prefixes it changes: a map variable's default
  # is replaced whole by any value given, so the defaults live here and the
  # variable is merged over them.
  payload_expiration_defaults = {
    payloads    = 19
    jobs        = 19
    idempotency = 2
    results     = 19
    failed      = 19
    cancel      = 19
    cancelled   = 19
    itemerrors  = 19
    answers     = 19
    done        = 19
    files       = 31
    batches     = 31
  }
  payload_expiration_days = merge(local.payload_expiration_defaults, var.payload_expiration_days)
}

resource "aws_s3_bucket" "payloads" {
  bucket        = var.payload_bucket_name
  bucket_prefix = var.payload_bucket_name == null ? "${local.name}-payloads-" : null
  force_destroy = var.payload_bucket_force_destroy

  tags = local.tags
}

resource "aws_s3_bucket_ownership_controls" "payloads" {
  bucket = aws_s3_bucket.payloads.id

  rule {
    # No ACLs: access is by policy only.
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "payloads" {
  bucket = aws_s3_bucket.payloads.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "payloads" {
  bucket = aws_s3_bucket.payloads.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = var.kms_key_arn == null ? "AES256" : "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    # With KMS, one data key per bucket rather than per object: far fewer
    # (billed) KMS requests for many small objects.
    bucket_key_enabled = var.kms_key_arn != null
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "payloads" {
  bucket = aws_s3_bucket.payloads.id

  dynamic "rule" {
    for_each = local.payload_expiration_days

    content {
      id     = "expire-${rule.key}"
      status = "Enabled"

      filter {
        prefix = "${rule.key}/"
      }

      expiration {
        days = rule.value
      }
    }
  }

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }

  lifecycle {
    # A batch's record is rewritten when it settles, as its output and error
    # files are written (publisher/batchfiles.go): with batches/ kept no
    # longer than files/, a batch that GET /v1/batches lists never names a
    # file that is gone.
    precondition {
      condition     = local.payload_expiration_days.files >= local.payload_expiration_days.batches
      error_message = "payload_expiration_days: files must be at least batches, or a listed batch names output and error files that have expired."
    }
    # A redelivered chunk can settle its job again while the job's manifest
    # (jobs/) is there; without its done/ marker the job's completion event
    # is sent a second time.
    precondition {
      condition     = local.payload_expiration_days.done >= local.payload_expiration_days.jobs
      error_message = "payload_expiration_days: done must be at least jobs, or a chunk redelivered after its job's marker expired sends the job's completion event again."
    }
  }
}

data "aws_iam_policy_document" "bucket_tls_only" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.payloads.arn, "${aws_s3_bucket.payloads.arn}/*"]

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

resource "aws_s3_bucket_policy" "payloads" {
  bucket = aws_s3_bucket.payloads.id
  policy = data.aws_iam_policy_document.bucket_tls_only.json

  # S3 refuses a bucket policy while the public access block is being set.
  depends_on = [aws_s3_bucket_public_access_block.payloads]
}
