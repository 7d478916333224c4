# The whole pipeline with a handful of variables: the queues, the payload
# bucket, the subscriber on GPU instances, the publisher as a Lambda function
# behind an HTTP API (bearer keys from a secret, as the OpenAI SDKs send
# them), the alarms mailed to an address.

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

  publisher_mode = var.publisher_mode
  # Every route but /healthz takes Authorization: Bearer <key>, a key from
  # this secret, which the publisher checks: what the OpenAI SDKs send to the
  # Files and Batch routes, and curl to /v1/jobs. publisher_authorization is
  # left to follow (NONE at the gateway with keys; AWS_IAM, SigV4, without).
  publisher_api_keys_secret_arn = var.publisher_api_keys_secret_arn != null ? var.publisher_api_keys_secret_arn : aws_secretsmanager_secret.publisher_keys[0].arn
  # lambda only: CloudFront in front of the API and the bucket, so that the
  # OpenAI SDK for Go follows a large download's redirect (api_url is then
  # the edge's URL).
  publisher_edge = var.publisher_edge
  # fargate only:
  publisher_image           = var.publisher_image
  publisher_alb_subnet_ids  = var.publisher_alb_subnet_ids
  publisher_certificate_arn = var.publisher_certificate_arn

  alarm_sns_topic_arn = aws_sns_topic.alarms.arn

  # An LLM served by vLLM beside the subscriber, on the task's GPU; the
  # subscriber starts once the server's health check passes and admits work
  # by its KV cache (docs/deployment.md works this one through):
  # subscriber_instance_types = ["g5.2xlarge", "g6.2xlarge"]
  # subscriber_cpu            = 7168
  # subscriber_memory         = 28672
  # model_server_image        = "vllm/vllm-openai:v0.10.1"
  # model_server_command = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000",
  #   "--gpu-memory-utilization", "0.9", "--max-model-len", "8192", "--max-num-seqs", "32"]
  # model_server_secrets = { HF_TOKEN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf" }
  # model_server_models  = ["meta-llama/Llama-3.1-8B-Instruct"]
  # subscriber_environment = {
  #   VRAMQ_MODEL_SERVER_CONCURRENCY       = "32"
  #   VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS = "1024"
  # }
  #
  # Or OpenAI, its key in Secrets Manager (never in plain environment), on
  # instances without a GPU (and subscriber_ami_id the ECS-optimized AMI):
  # model_server_url                = "https://api.openai.com"
  # model_server_models             = ["gpt-4o-mini"]
  # model_server_api_key_secret_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:openai-key-AbCdEf"
  # subscriber_instance_types       = ["c7i.large", "m7i.large"]
  # subscriber_environment          = { VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS = "1024" }
}

# The publisher's bearer keys, unless publisher_api_keys_secret_arn names a
# secret of yours. It is created empty: the keys never pass through
# Terraform or its state. Put them in before the first request (README,
# "Use it"); until then the publisher cannot start.
resource "aws_secretsmanager_secret" "publisher_keys" {
  count = var.publisher_api_keys_secret_arn == null ? 1 : 0

  name_prefix = "${var.name_prefix}vramq-publisher-keys-"
  description = "vramq publisher bearer keys: comma- or line-separated, key or name:key"
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
