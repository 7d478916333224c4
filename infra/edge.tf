# The edge (publisher_edge, lambda mode): a CloudFront distribution with two
# origins, so that clients see the API and the payload bucket on one origin.
#
# Why: under Lambda the publisher answers a file too large for the 6 MB
# response with a 307 to a presigned S3 URL (docs/api.md, "Downloads under
# Lambda"). The OpenAI SDK for Go refuses, by design, any request off its
# base URL's origin, the redirect's included. With the edge the publisher
# redirects to the same path and query on the edge's origin
# (VRAMQ_PUBLIC_URL), and the edge sends /files/* to the bucket.
#
# What makes a presigned URL pass through it (CloudFront Developer Guide):
#   - S3 checks the signature against the Host it was made for, the
#     bucket's virtual-hosted name; CloudFront sets an origin request's Host
#     to the origin's domain name ("HTTP request headers and CloudFront
#     behavior"), so the origin is named exactly as the SDK presigns:
#     {bucket}.s3.{region}.amazonaws.com.
#   - The query string must reach S3 whole: an origin request policy of all
#     query strings. A custom one, since the managed AllViewer policies drop
#     response-content-type (which the publisher signs) for S3 origins ("Use
#     managed origin request policies").
#   - No second authentication: no origin access control (with one,
#     CloudFront signs the origin request itself, an Authorization header
#     besides the query's signature, which S3 refuses), and no viewer
#     Authorization: the SDKs keep the bearer key on a redirect within the
#     origin, and CloudFront removes that header from the origin request
#     unless a cache policy keys on it ("HTTP 401 status code").
#   - Nothing cached: CachingDisabled on both behaviours; every download is
#     the owner's, each URL good for 5 minutes.
# The bucket stays private: S3 serves a request only with a valid signature
# of the publisher's role, as it does from its own host.
#
# The API's behaviour forwards every viewer header but Host
# (AllViewerExceptHostHeader, Authorization included: "HTTP 401 status
# code"), since API Gateway routes by its own host name. SigV4 signs the Host,
# which is why AWS_IAM authorization cannot pass (precondition below).

locals {
  publisher_edge = local.publisher_lambda && var.publisher_edge

  # The path the edge routes to the bucket: the first segment of every
  # file's key (job.FileKey, files/{owner hash}/{id}.jsonl), so that a
  # presigned URL's path is the edge's path unchanged. edge_test.go checks
  # it against job.FileKey.
  publisher_edge_bucket_path = "/files/*"
}

data "aws_cloudfront_cache_policy" "caching_disabled" {
  count = local.publisher_edge ? 1 : 0
  name  = "Managed-CachingDisabled"
}

data "aws_cloudfront_origin_request_policy" "all_viewer_except_host" {
  count = local.publisher_edge ? 1 : 0
  name  = "Managed-AllViewerExceptHostHeader"
}

resource "aws_cloudfront_origin_request_policy" "presigned_get" {
  count = local.publisher_edge ? 1 : 0

  name    = "${local.name}-presigned-get"
  comment = "vramq: a presigned S3 GET as it came: its whole query string, no headers, no cookies"

  cookies_config {
    cookie_behavior = "none"
  }
  headers_config {
    header_behavior = "none"
  }
  query_strings_config {
    query_string_behavior = "all"
  }
}

resource "aws_cloudfront_distribution" "publisher" {
  count = local.publisher_edge ? 1 : 0

  enabled         = true
  comment         = "${local.name} publisher: the API, and its large downloads from the payload bucket, on one origin"
  is_ipv6_enabled = true

  origin {
    origin_id   = "api"
    domain_name = trimprefix(aws_apigatewayv2_api.publisher[0].api_endpoint, "https://")

    custom_origin_config {
      http_port              = 80
      https_port             = 443
      origin_protocol_policy = "https-only"
      origin_ssl_protocols   = ["TLSv1.2"]
      # Past the HTTP API's own 30 s integration timeout, so that its
      # answer, not CloudFront's, reaches the client.
      origin_read_timeout = 60
    }
  }

  origin {
    origin_id = "payloads"
    # Exactly the host the SDK presigns for (virtual-hosted, regional).
    domain_name = "${aws_s3_bucket.payloads.id}.s3.${local.region}.amazonaws.com"

    # An S3 origin without an origin access identity or control: CloudFront
    # signs nothing, the presigned query string authenticates.
    s3_origin_config {
      origin_access_identity = ""
    }
  }

  default_cache_behavior {
    target_origin_id         = "api"
    viewer_protocol_policy   = "https-only"
    allowed_methods          = ["DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"]
    cached_methods           = ["GET", "HEAD"]
    compress                 = false
    cache_policy_id          = data.aws_cloudfront_cache_policy.caching_disabled[0].id
    origin_request_policy_id = data.aws_cloudfront_origin_request_policy.all_viewer_except_host[0].id
  }

  ordered_cache_behavior {
    path_pattern             = local.publisher_edge_bucket_path
    target_origin_id         = "payloads"
    viewer_protocol_policy   = "https-only"
    allowed_methods          = ["GET", "HEAD"]
    cached_methods           = ["GET", "HEAD"]
    compress                 = false
    cache_policy_id          = data.aws_cloudfront_cache_policy.caching_disabled[0].id
    origin_request_policy_id = aws_cloudfront_origin_request_policy.presigned_get[0].id
  }

  restrictions {
    geo_restriction {
      restriction_type = "none"
    }
  }

  viewer_certificate {
    cloudfront_default_certificate = true
  }

  tags = local.tags

  lifecycle {
    precondition {
      condition     = local.publisher_authorization != "AWS_IAM"
      error_message = "publisher_edge with publisher_authorization = \"AWS_IAM\": SigV4 signs the Host header, which the edge replaces with API Gateway's, so no signed request would pass. Give bearer keys (publisher_api_keys_secret_arn) or JWT."
    }
    # A bucket name with a dot is no single DNS label: S3's wildcard
    # certificate does not cover its virtual-hosted name, and the SDK would
    # presign it path-style, a path the edge does not route.
    precondition {
      condition     = !strcontains(aws_s3_bucket.payloads.id, ".")
      error_message = "publisher_edge: the payload bucket's name has a dot; the edge reaches the bucket by its virtual-hosted name over HTTPS, which needs a name without dots (payload_bucket_name)."
    }
  }
}

# The edge only does something in lambda mode: on Fargate the publisher
# streams every file itself.
check "publisher_edge_mode" {
  assert {
    condition     = !var.publisher_edge || local.publisher_lambda
    error_message = "publisher_edge is set with publisher_mode = \"fargate\", which streams every file itself: no edge is made."
  }
}
