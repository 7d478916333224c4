################################################################################
# General
################################################################################

variable "name_prefix" {
  description = "Put in front of every name, queues included (as bin/queues -prefix does locally): \"prod-\" gives prod-vramq-work. Empty for the plain names of localstack/queues.json."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^[a-z0-9-]{0,12}$", var.name_prefix))
    error_message = "name_prefix: up to 12 lower-case letters, digits and hyphens (it goes into S3 bucket and IAM role name prefixes, which are short)."
  }
}

variable "tags" {
  description = "Tags added to every resource that takes them."
  type        = map(string)
  default     = {}
}

variable "kms_key_arn" {
  description = "Customer managed KMS key for the queues and the payload bucket. Null (the default) uses SSE-SQS and SSE-S3, which need no key policy and no kms: permissions. With a key, its key policy must let this account's IAM grant use of it, and the roles get kms:Decrypt/GenerateDataKey on exactly this key."
  type        = string
  default     = null
}

variable "kms_data_key_reuse_period_seconds" {
  description = "With kms_key_arn: how long SQS reuses a data key before calling KMS again (60 to 86400). Longer is fewer KMS requests, which are billed."
  type        = number
  default     = 300
}

variable "log_retention_days" {
  description = "Retention of the CloudWatch log groups (subscriber, publisher, API access logs)."
  type        = number
  default     = 30
}

################################################################################
# Queues (defaults are localstack/queues.json's, checked by infra/infra_test.go)
################################################################################

variable "visibility_timeout_seconds" {
  description = "Visibility timeout of the work queue, and the subscriber's -visibility-timeout (VRAMQ_VISIBILITY_TIMEOUT): it receives with this timeout and heartbeats every third of it, so a crashed task's messages come back within this long. Whole seconds, 3 to 43200."
  type        = number
  default     = 30

  validation {
    condition     = var.visibility_timeout_seconds >= 3 && var.visibility_timeout_seconds <= 43200 && floor(var.visibility_timeout_seconds) == var.visibility_timeout_seconds
    error_message = "visibility_timeout_seconds: whole seconds from 3 (the subscriber's minimum) to 43200 (the SQS maximum)."
  }
}

variable "receive_wait_time_seconds" {
  description = "Long-poll wait of the work and results queues, and the subscriber's -wait-time: 20 s (the SQS maximum) makes the fewest empty receives, which are billed like full ones."
  type        = number
  default     = 20

  validation {
    condition     = var.receive_wait_time_seconds >= 0 && var.receive_wait_time_seconds <= 20
    error_message = "receive_wait_time_seconds: 0 to 20."
  }
}

variable "message_retention_seconds" {
  description = "How long the work queue keeps a message (60 to 1209600)."
  type        = number
  default     = 345600
}

variable "results_message_retention_seconds" {
  description = "How long the results queue keeps a result nobody has read (60 to 1209600)."
  type        = number
  default     = 345600
}

variable "dlq_message_retention_seconds" {
  description = "How long the dead-letter queue keeps a message: 14 days (the maximum), so a message outlives its time on the work queue and someone can look at it or redrive it."
  type        = number
  default     = 1209600
}

variable "max_message_size" {
  description = "MaximumMessageSize of every queue, in bytes (1024 to 1048576). The publisher reads the work queue's at start and cuts chunks to it; larger items go to the payload bucket. Set explicitly so an account default cannot shrink it."
  type        = number
  default     = 1048576

  validation {
    condition     = var.max_message_size >= 1024 && var.max_message_size <= 1048576
    error_message = "max_message_size: 1024 to 1048576 bytes."
  }
}

variable "max_receive_count" {
  description = "Receives of a work message before SQS moves it to the DLQ (the redrive policy). Releases after backpressure or shutdown count as receives too, so keep some headroom."
  type        = number
  default     = 5

  validation {
    condition     = var.max_receive_count >= 1 && var.max_receive_count <= 1000
    error_message = "max_receive_count: 1 to 1000."
  }
}

################################################################################
# Payload bucket
################################################################################

variable "payload_bucket_name" {
  description = "Name of the payload bucket (claim-checked items, manifests, idempotency records, results, failed markers). Null: a unique name starting \"<name_prefix>vramq-payloads-\"."
  type        = string
  default     = null
}

variable "payload_bucket_force_destroy" {
  description = "Let terraform destroy delete the bucket with objects still in it. Keep false in production."
  type        = bool
  default     = false
}

variable "payload_expiration_days" {
  description = "Days before objects under each prefix of the bucket layout (internal/payload) expire. payloads/ should outlive a message's time on the work queue plus the DLQ (4 + 14 days by default), or a redriven message finds its item gone and is dead-lettered as claim_check; results/ and failed/ are what GET /v1/jobs/{id} reads; jobs/ (manifests) should live as long as results/; idempotency/ only as long as clients retry a POST."
  type        = map(number)
  default = {
    payloads    = 19
    jobs        = 19
    idempotency = 2
    results     = 19
    failed      = 19
  }

  validation {
    condition     = alltrue([for k, v in var.payload_expiration_days : contains(["payloads", "jobs", "idempotency", "results", "failed"], k) && v >= 1])
    error_message = "payload_expiration_days: keys among payloads, jobs, idempotency, results, failed; values at least 1."
  }
}

################################################################################
# Network
################################################################################

variable "vpc_id" {
  description = "VPC of the GPU instances, the subscriber tasks and (publisher_mode = \"fargate\") the publisher and its load balancer."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets for the GPU instances and the tasks (awsvpc). They need a route to SQS, S3, ECR, ECS and CloudWatch Logs: a NAT gateway or VPC endpoints. Spread over availability zones so the instance types are found somewhere."
  type        = list(string)
}

variable "public_subnet_ids" {
  description = "Subnets of the publisher's load balancer when publisher_mode = \"fargate\" and publisher_alb_internal = false. Unused otherwise."
  type        = list(string)
  default     = []
}

variable "metrics_ingress_cidr_blocks" {
  description = "CIDR blocks allowed to scrape the subscriber's /metrics and /healthz on port 9090 (Prometheus). Empty: nobody from outside the task."
  type        = list(string)
  default     = []
}

################################################################################
# Subscriber (ECS on GPU instances)
################################################################################

variable "subscriber_image" {
  description = "Image of the subscriber: the CUDA build (Dockerfile.subscriber-cuda), e.g. <account>.dkr.ecr.<region>.amazonaws.com/vramq-subscriber-cuda:<tag>. An ECR image in this account gets pull rights on exactly its repository."
  type        = string
}

variable "subscriber_device" {
  description = "The subscriber's -device (VRAMQ_DEVICE): cuda:0 is the one GPU a task is given (a container sees its GPU as 0). The CPU image runs only sim."
  type        = string
  default     = "cuda:0"
}

variable "subscriber_instance_types" {
  description = "GPU instance types for the capacity provider's Auto Scaling group, in order of preference. One GPU each by default (g5.xlarge: A10G 24 GB; g6.xlarge: L4 24 GB), so one task per instance."
  type        = list(string)
  default     = ["g5.xlarge", "g6.xlarge"]
}

variable "subscriber_spot" {
  description = "Run the GPU instances on Spot. Cheaper; an interruption gives 2 minutes, the ECS agent drains the instance and the subscriber's SIGTERM shutdown hands unfinished messages back."
  type        = bool
  default     = false
}

variable "subscriber_root_volume_size" {
  description = "Root volume of each GPU instance in GiB: CUDA images are several GiB and ECS keeps the previous one during a deployment."
  type        = number
  default     = 100
}

variable "subscriber_gpus_per_task" {
  description = "GPUs given to each subscriber task (resourceRequirements GPU). The subscriber uses one device."
  type        = number
  default     = 1
}

variable "subscriber_cpu" {
  description = "CPU units of a subscriber task (1024 per vCPU). The default leaves room on a 4-vCPU xlarge for the ECS agent."
  type        = number
  default     = 3072
}

variable "subscriber_memory" {
  description = "Memory of a subscriber task in MiB. The default fits a 16 GiB xlarge with room for the agent and the OS."
  type        = number
  default     = 12288
}

variable "subscriber_shutdown_grace_seconds" {
  description = "The subscriber's -shutdown-grace (VRAMQ_SHUTDOWN_GRACE): how long running batches may finish after SIGTERM. ECS waits this plus 30 s (the final flush of deletes and releases) before SIGKILL, at most 120 s (the ECS maximum), so at most 90."
  type        = number
  default     = 25

  validation {
    condition     = var.subscriber_shutdown_grace_seconds >= 0 && var.subscriber_shutdown_grace_seconds <= 90
    error_message = "subscriber_shutdown_grace_seconds: 0 to 90 (ECS stops a container at most 120 s after SIGTERM, and the subscriber needs up to 30 s after the grace to flush)."
  }
}

variable "subscriber_log_level" {
  description = "The subscriber's -log-level: debug, info, warn or error. The OOM-retries metric filter needs warn or lower."
  type        = string
  default     = "info"

  validation {
    condition     = contains(["debug", "info", "warn"], var.subscriber_log_level)
    error_message = "subscriber_log_level: debug, info or warn (error would hide the WARN lines the OOM-retries metric counts)."
  }
}

variable "subscriber_environment" {
  description = "More environment for the subscriber container, e.g. { VRAMQ_PREFETCH = \"20\", VRAMQ_VRAM_RESERVE = \"1GiB\" } (README: Configuration). The variables this module sets from its own inputs may not be given here."
  type        = map(string)
  default     = {}

  validation {
    condition = length(setintersection(keys(var.subscriber_environment), [
      "QUEUE_URL", "RESULTS_QUEUE_URL", "DLQ_URL", "PAYLOAD_BUCKET", "VRAMQ_DEVICE", "VRAMQ_VISIBILITY_TIMEOUT",
      "VRAMQ_WAIT_TIME", "VRAMQ_SHUTDOWN_GRACE", "VRAMQ_METRICS_ADDR", "VRAMQ_LOG_FORMAT", "VRAMQ_LOG_LEVEL",
    ])) == 0
    error_message = "subscriber_environment: set the queue URLs, device, visibility, wait time, shutdown grace, metrics address and log settings through this module's own variables."
  }
}

variable "subscriber_health_check_command" {
  description = "Container health check of the subscriber (ECS healthCheck command). The default is the binary's own `subscriber healthcheck`, which asks /healthz on VRAMQ_METRICS_ADDR and needs no shell or curl, so it works in the distroless and the CUDA image alike. [] turns the check off."
  type        = list(string)
  default     = ["CMD", "/usr/local/bin/subscriber", "healthcheck"]
}

variable "subscriber_health_check_start_period" {
  description = "Seconds after start before failed health checks count (model loading onto the GPU). 0 to 300."
  type        = number
  default     = 120
}

variable "subscriber_min_count" {
  description = "Fewest subscriber tasks, at least 1: the backlog-per-task metric (visible messages / running tasks) is undefined with none running, so target tracking could not scale out from zero."
  type        = number
  default     = 1

  validation {
    condition     = var.subscriber_min_count >= 1
    error_message = "subscriber_min_count must be at least 1: backlog per task needs a running task."
  }
}

variable "subscriber_max_count" {
  description = "Most subscriber tasks; also the most GPU instances the Auto Scaling group may run (one task per instance)."
  type        = number
  default     = 10
}

variable "subscriber_backlog_per_task_target" {
  description = "Target of the backlog-per-task scaling policy: visible messages on the work queue per running task that are acceptable. About (acceptable latency in seconds) x (messages a task finishes per second): a task doing 2 messages/s with 60 s of acceptable wait is 120."
  type        = number
  default     = 100
}

variable "subscriber_scale_out_cooldown" {
  description = "Seconds after a scale-out before another. A GPU instance takes minutes to launch and pull the image."
  type        = number
  default     = 120
}

variable "subscriber_scale_in_cooldown" {
  description = "Seconds after a scale-in before another. Tasks holding messages are protected from scale-in by the subscriber itself (ECS task scale-in protection)."
  type        = number
  default     = 300
}

################################################################################
# Publisher
################################################################################

variable "publisher_mode" {
  description = "How the publisher runs: \"lambda\" (the make lambda zip behind an API Gateway HTTP API) or \"fargate\" (the container image as an ECS Fargate service behind an Application Load Balancer)."
  type        = string
  default     = "lambda"

  validation {
    condition     = contains(["lambda", "fargate"], var.publisher_mode)
    error_message = "publisher_mode: \"lambda\" or \"fargate\"."
  }
}

variable "publisher_environment" {
  description = "More environment for the publisher, e.g. { VRAMQ_CHUNK_ITEMS = \"32\", VRAMQ_API_KEYS = \"...\" } (README: bin/publisher). Bearer API keys and a JWT authorizer both read the Authorization header: use one of them."
  type        = map(string)
  default     = {}

  validation {
    condition     = length(setintersection(keys(var.publisher_environment), ["QUEUE_URL", "PAYLOAD_BUCKET", "VRAMQ_LOG_FORMAT", "VRAMQ_ADDR"])) == 0
    error_message = "publisher_environment: QUEUE_URL, PAYLOAD_BUCKET, VRAMQ_LOG_FORMAT and VRAMQ_ADDR are set by this module."
  }
}

variable "publisher_lambda_zip" {
  description = "Path of the publisher's Lambda package (make lambda). Null: bin/publisher-lambda.zip of this repository."
  type        = string
  default     = null
}

variable "publisher_lambda_architecture" {
  description = "Architecture the zip was built for: arm64 (make lambda's default, Graviton) or x86_64 (LAMBDA_ARCH=amd64)."
  type        = string
  default     = "arm64"

  validation {
    condition     = contains(["arm64", "x86_64"], var.publisher_lambda_architecture)
    error_message = "publisher_lambda_architecture: arm64 or x86_64."
  }
}

variable "publisher_lambda_memory_size" {
  description = "Memory of the publisher function in MB (CPU grows with it). A request body is held in memory while it is chunked."
  type        = number
  default     = 512
}

variable "publisher_lambda_timeout" {
  description = "Timeout of the publisher function in seconds; API Gateway HTTP APIs give up after 30."
  type        = number
  default     = 29
}

variable "publisher_lambda_reserved_concurrency" {
  description = "Reserved concurrency of the publisher function, which also caps it (a cap on SQS sends per second). Null: unreserved."
  type        = number
  default     = null
}

variable "publisher_authorization" {
  description = "Authorization of the API Gateway routes /v1/jobs: AWS_IAM (callers sign with SigV4 and need execute-api:Invoke), JWT (an OIDC issuer, see publisher_jwt_issuer) or NONE (only the publisher's own bearer keys, VRAMQ_API_KEYS, if any). Lambda mode only."
  type        = string
  default     = "AWS_IAM"

  validation {
    condition     = contains(["AWS_IAM", "JWT", "NONE"], var.publisher_authorization)
    error_message = "publisher_authorization: AWS_IAM, JWT or NONE."
  }
}

variable "publisher_jwt_issuer" {
  description = "With publisher_authorization = \"JWT\": the issuer URL (e.g. https://cognito-idp.<region>.amazonaws.com/<pool id>)."
  type        = string
  default     = null
}

variable "publisher_jwt_audience" {
  description = "With publisher_authorization = \"JWT\": accepted audiences (client ids)."
  type        = list(string)
  default     = []
}

variable "publisher_throttling_burst_limit" {
  description = "Lambda mode: API Gateway burst limit of the publisher API, all clients together (requests at once); over it, 429 without invoking the function. Per client, the publisher's own -rate-burst applies (publisher_environment VRAMQ_RATE_BURST)."
  type        = number
  default     = 200

  validation {
    condition     = var.publisher_throttling_burst_limit >= 1 && floor(var.publisher_throttling_burst_limit) == var.publisher_throttling_burst_limit
    error_message = "publisher_throttling_burst_limit: a whole number, at least 1 (0 refuses every request)."
  }
}

variable "publisher_throttling_rate_limit" {
  description = "Lambda mode: API Gateway steady rate limit of the publisher API, all clients together (requests per second). Per client, the publisher's own -rate-limit applies (publisher_environment VRAMQ_RATE_LIMIT)."
  type        = number
  default     = 100

  validation {
    condition     = var.publisher_throttling_rate_limit > 0
    error_message = "publisher_throttling_rate_limit: above 0 (0 refuses every request)."
  }
}

variable "publisher_image" {
  description = "With publisher_mode = \"fargate\": the publisher image (Dockerfile.publisher). Unused in lambda mode."
  type        = string
  default     = null
}

variable "publisher_cpu_architecture" {
  description = "With publisher_mode = \"fargate\": the image's architecture, X86_64 or ARM64."
  type        = string
  default     = "X86_64"

  validation {
    condition     = contains(["X86_64", "ARM64"], var.publisher_cpu_architecture)
    error_message = "publisher_cpu_architecture: X86_64 or ARM64."
  }
}

variable "publisher_desired_count" {
  description = "With publisher_mode = \"fargate\": publisher tasks (two spread over zones for availability)."
  type        = number
  default     = 2
}

variable "publisher_cpu" {
  description = "With publisher_mode = \"fargate\": CPU units of a publisher task (a Fargate size)."
  type        = number
  default     = 512
}

variable "publisher_memory" {
  description = "With publisher_mode = \"fargate\": memory of a publisher task in MiB (a Fargate size)."
  type        = number
  default     = 1024
}

variable "publisher_shutdown_grace_seconds" {
  description = "With publisher_mode = \"fargate\": the publisher's -shutdown-grace (VRAMQ_SHUTDOWN_GRACE); ECS waits 5 s more before SIGKILL (at most 120)."
  type        = number
  default     = 25

  validation {
    condition     = var.publisher_shutdown_grace_seconds >= 0 && var.publisher_shutdown_grace_seconds <= 115
    error_message = "publisher_shutdown_grace_seconds: 0 to 115."
  }
}

variable "publisher_alb_internal" {
  description = "With publisher_mode = \"fargate\": an internal load balancer (in subnet_ids) rather than an internet-facing one (in public_subnet_ids)."
  type        = bool
  default     = true
}

variable "publisher_alb_ingress_cidr_blocks" {
  description = "With publisher_mode = \"fargate\": CIDR blocks allowed to reach the load balancer. Empty: the VPC's own CIDR block."
  type        = list(string)
  default     = []
}

variable "publisher_certificate_arn" {
  description = "With publisher_mode = \"fargate\": ACM certificate for an HTTPS listener on 443. Null: plain HTTP on 80, acceptable only for an internal load balancer."
  type        = string
  default     = null
}

################################################################################
# Alarms
################################################################################

variable "alarm_sns_topic_arn" {
  description = "SNS topic notified when an alarm fires and when it clears. Null: the alarms exist without notifications."
  type        = string
  default     = null
}

variable "oldest_message_age_alarm_seconds" {
  description = "Alarm when the oldest message on the work queue is older than this (seconds): the subscribers are not keeping up, or none runs."
  type        = number
  default     = 900
}

variable "oom_retries_alarm_threshold" {
  description = "Alarm when the subscribers split or isolate more than this many batches for out-of-memory in 5 minutes: model Cost functions under-estimate, or another process shares the GPU."
  type        = number
  default     = 10
}

variable "tasks_below_desired_alarm_periods" {
  description = "Alarm when fewer subscriber tasks run than desired for this many 5-minute periods (tasks failing health checks, crashing, or no GPU capacity). A GPU instance takes a few minutes to come up, so keep at least 2."
  type        = number
  default     = 3
}
