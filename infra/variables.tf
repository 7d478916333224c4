################################################################################
# General
################################################################################

variable "name_prefix" {
  description = "Put in front of every name, queues included (as bin/queues -prefix does locally): \"prod-\" gives prod-vramq-work. Empty for the plain names of localstack/queues.json."
  type        = string
  default     = ""

  nullable = false

  validation {
    condition     = can(regex("^[a-z0-9-]{0,12}$", var.name_prefix))
    error_message = "name_prefix: up to 12 lower-case letters, digits and hyphens (it goes into S3 bucket and IAM role name prefixes, which are short)."
  }

  # It starts the capacity provider's name, and ECS refuses names that start
  # with these.
  validation {
    condition     = !can(regex("^(aws|ecs|fargate)", var.name_prefix))
    error_message = "name_prefix may not start with aws, ecs or fargate: ECS reserves capacity provider names that do."
  }
}

variable "tags" {
  description = "Tags added to every resource that takes them."
  type        = map(string)
  default     = {}
  nullable    = false
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
  nullable    = false

  validation {
    condition     = var.kms_data_key_reuse_period_seconds >= 60 && var.kms_data_key_reuse_period_seconds <= 86400
    error_message = "kms_data_key_reuse_period_seconds: 60 to 86400."
  }
}

variable "log_retention_days" {
  description = "Retention of the CloudWatch log groups (subscriber, publisher, API access logs), in days: one of the values CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, ...), or 0 to keep logs for ever."
  type        = number
  default     = 30
  nullable    = false

  validation {
    condition     = contains([0, 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days: one of 0, 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653."
  }
}

################################################################################
# Queues (defaults are localstack/queues.json's, checked by infra/infra_test.go)
################################################################################

variable "visibility_timeout_seconds" {
  description = "Visibility timeout of the work queue, and the subscriber's -visibility-timeout (VRAMQ_VISIBILITY_TIMEOUT): it receives with this timeout and heartbeats every third of it, so a crashed task's messages come back within this long. Whole seconds, 3 to 43200."
  type        = number
  default     = 30
  nullable    = false

  validation {
    condition     = var.visibility_timeout_seconds >= 3 && var.visibility_timeout_seconds <= 43200 && floor(var.visibility_timeout_seconds) == var.visibility_timeout_seconds
    error_message = "visibility_timeout_seconds: whole seconds from 3 (the subscriber's minimum) to 43200 (the SQS maximum)."
  }
}

variable "receive_wait_time_seconds" {
  description = "Long-poll wait of the work and results queues, and the subscriber's -wait-time, 0 to 20 seconds: 20 s (the SQS maximum) makes the fewest empty receives, which are billed like full ones."
  type        = number
  default     = 20
  nullable    = false

  validation {
    condition     = var.receive_wait_time_seconds >= 0 && var.receive_wait_time_seconds <= 20 && floor(var.receive_wait_time_seconds) == var.receive_wait_time_seconds
    error_message = "receive_wait_time_seconds: whole seconds, 0 to 20."
  }
}

variable "message_retention_seconds" {
  description = "How long the work queue keeps a message (60 to 1209600)."
  type        = number
  default     = 345600
  nullable    = false

  validation {
    condition     = var.message_retention_seconds >= 60 && var.message_retention_seconds <= 1209600
    error_message = "message_retention_seconds: 60 to 1209600 seconds."
  }
}

variable "results_message_retention_seconds" {
  description = "How long the results queue keeps a result nobody has read (60 to 1209600)."
  type        = number
  default     = 345600
  nullable    = false

  validation {
    condition     = var.results_message_retention_seconds >= 60 && var.results_message_retention_seconds <= 1209600
    error_message = "results_message_retention_seconds: 60 to 1209600 seconds."
  }
}

variable "dlq_message_retention_seconds" {
  description = "How long the dead-letter queue keeps a message, 60 to 1209600 seconds: 14 days (the maximum) by default, so a message outlives its time on the work queue and someone can look at it or redrive it."
  type        = number
  default     = 1209600
  nullable    = false

  validation {
    condition     = var.dlq_message_retention_seconds >= 60 && var.dlq_message_retention_seconds <= 1209600
    error_message = "dlq_message_retention_seconds: 60 to 1209600 seconds."
  }
}

variable "max_message_size" {
  description = "MaximumMessageSize of every queue, in bytes (1024 to 1048576). The publisher reads the work queue's at start and cuts chunks to it; larger items go to the payload bucket. Set explicitly so an account default cannot shrink it."
  type        = number
  default     = 1048576
  nullable    = false

  validation {
    condition     = var.max_message_size >= 1024 && var.max_message_size <= 1048576
    error_message = "max_message_size: 1024 to 1048576 bytes."
  }
}

variable "max_receive_count" {
  description = "Receives of a work message before SQS moves it to the DLQ (the redrive policy), 1 to 1000; null (default): 12. Every receive counts, and a release is received again, so the subscriber counts only what may be a message's own failure: a transient failure is retried after -retry-delay (5 s) doubled per receive, so 8 receives ride out about 10 minutes of an S3 or SQS outage (5+10+...+320 s = 635 s of delays). Waits that are not its fault cost none: a model server's rate limit or spent quota holds the message's lease (up to SQS's 12 hours), and backpressure, a deployment, a scale-in or a wait past a lease hand it back as a fresh copy with a fresh receive count (docs/reliability.md). Poison the subscriber recognises goes to the DLQ at once, with a reason, whatever this is; a message that crashes the subscriber costs up to this many task restarts. localstack/queues.json keeps 5 for fast local tests."
  type        = number
  default     = null

  validation {
    condition     = var.max_receive_count == null || (coalesce(var.max_receive_count, 1) >= 1 && coalesce(var.max_receive_count, 1) <= 1000)
    error_message = "max_receive_count: 1 to 1000, or null."
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
  nullable    = false
}

variable "payload_expiration_days" {
  description = "Days before objects under each prefix of the bucket layout (internal/payload) expire, by prefix; a prefix left out keeps its default (bucket.tf, local.payload_expiration_defaults), so { results = 30 } changes results/ only. payloads/ should outlive a message's time on the work queue plus the DLQ (4 + 14 days by default), or a redriven message finds its item gone and is dead-lettered as claim_check; results/, failed/, cancel/, cancelled/ and itemerrors/ are what GET /v1/jobs/{id} reads; jobs/ (manifests) should live as long as results/; done/ (completion events' markers) at least as long as jobs/, since a redelivered chunk could settle its job again while its manifest is there (checked at plan time); idempotency/ only as long as clients retry a POST; answers/ (items' answers, deleted once their chunk's result is out) as long as payloads/, so that a chunk redriven from the DLQ finds what was answered; files/ (POST /v1/files) at least 31, a day past the longest expiry a file may have (30 days, OpenAI's): the publisher stops serving a file at its expires_at, and this removes it later; batches/ (POST /v1/batches) no longer than files/, so every batch listed names output and error files that are still there (checked at plan time; a batch whose job's results/ expire before the publisher's sweeper finalizes it cannot be finalized: keep results/ past the 24-hour window plus a few sweeps; batches/open/ holds a marker per batch not yet ended). Defaults: payloads, jobs, results, failed, cancel, cancelled, itemerrors, answers and done 19; idempotency 2; files and batches 31."
  type        = map(number)
  default     = {}
  nullable    = false

  validation {
    condition     = alltrue([for k, v in var.payload_expiration_days : contains(["payloads", "jobs", "idempotency", "results", "failed", "cancel", "cancelled", "itemerrors", "answers", "done", "files", "batches"], k) && v >= 1])
    error_message = "payload_expiration_days: keys among payloads, jobs, idempotency, results, failed, cancel, cancelled, itemerrors, answers, done, files, batches; values at least 1."
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
  nullable    = false

  validation {
    condition     = length(var.subnet_ids) >= 1
    error_message = "subnet_ids: at least one subnet (two zones or more for availability)."
  }
}

variable "publisher_alb_subnet_ids" {
  description = "With publisher_mode = \"fargate\": the load balancer's subnets, two zones or more, none of subnet_ids: public subnets for an internet-facing balancer, private ones for an internal one. The publisher trusts every address in them as a proxy (X-Forwarded-For), so they must hold load balancers only (a public subnet's NAT gateways are fine: they do not call the balancer from there). Unused in lambda mode."
  type        = list(string)
  default     = []
  nullable    = false
}

variable "metrics_ingress_cidr_blocks" {
  description = "CIDR blocks allowed to scrape /metrics on port 9090 (Prometheus): the subscriber's (and its /livez and /healthz), and in fargate mode the publisher's. Empty: nobody from outside the task. Name the scrapers, not the whole VPC: /metrics shows tenant names and the process's internals."
  type        = list(string)
  default     = []
  nullable    = false
}

################################################################################
# Subscriber (ECS on GPU instances)
################################################################################

variable "subscriber_image" {
  description = "Image of the subscriber: the CUDA build (Dockerfile.subscriber-cuda), e.g. <account>.dkr.ecr.<region>.amazonaws.com/vramq-subscriber-cuda:<tag>. An ECR image in this account gets pull rights on exactly its repository."
  type        = string
  nullable    = false
}

variable "subscriber_ami_id" {
  description = "AMI of the GPU instances, pinned: the ECS GPU-optimised Amazon Linux 2023 AMI of your region, e.g. the current recommended one: aws ssm get-parameter --name /aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id --query Parameter.Value --output text. To move to a newer one, set the new id and apply: a new launch template version, which instances take as they are replaced. With model_server_url (no GPU instances), the ECS-optimized Amazon Linux 2023 AMI instead (.../amazon-linux-2023/recommended/image_id)."
  type        = string
  nullable    = false

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8}([0-9a-f]{9})?$", var.subscriber_ami_id))
    error_message = "subscriber_ami_id: an AMI id, ami- and 8 or 17 hex digits."
  }
}

variable "subscriber_device" {
  description = "The subscriber's -device (VRAMQ_DEVICE): cuda:0 is the one GPU a task is given (a container sees its GPU as 0). The CPU image runs only sim."
  type        = string
  default     = "cuda:0"
  nullable    = false
}

variable "subscriber_instance_types" {
  description = "GPU instance types for the capacity provider's Auto Scaling group, in order of preference. One GPU each by default (g5.xlarge: A10G 24 GB; g6.xlarge: L4 24 GB), so one task per instance. Each must have the GPUs a task takes (subscriber_gpus_per_task, or model_server_gpus with a sidecar); with model_server_url, types without a GPU (c7i.large, m7i.large), since the server does the inference (both checked at plan time)."
  type        = list(string)
  default     = ["g5.xlarge", "g6.xlarge"]
  nullable    = false

  validation {
    condition     = length(var.subscriber_instance_types) >= 1
    error_message = "subscriber_instance_types: at least one instance type."
  }
}

variable "subscriber_spot" {
  description = "Run the GPU instances on Spot. Cheaper; an interruption gives 2 minutes, the ECS agent drains the instance and the subscriber's SIGTERM shutdown hands unfinished messages back (a batch longer than that is cut short and its messages come back when their visibility runs out). The group rebalances capacity: it launches a replacement when AWS signals a raised interruption risk."
  type        = bool
  default     = false
  nullable    = false
}

variable "subscriber_root_volume_size" {
  description = "Root volume of each GPU instance in GiB: CUDA images are several GiB and ECS keeps the previous one during a deployment."
  type        = number
  default     = 100
  nullable    = false
}

variable "subscriber_gpus_per_task" {
  description = "GPUs given to each subscriber task (resourceRequirements GPU). The subscriber uses one device. Every instance type must have at least this many (checked at plan time)."
  type        = number
  default     = 1
  nullable    = false
}

variable "subscriber_cpu" {
  description = "CPU units of a subscriber task (1024 per vCPU). The default leaves room on a 4-vCPU xlarge for the ECS agent."
  type        = number
  default     = 3072
  nullable    = false
}

variable "subscriber_memory" {
  description = "Memory of a subscriber task in MiB. The default fits a 16 GiB xlarge with room for the agent and the OS."
  type        = number
  default     = 12288
  nullable    = false
}

variable "subscriber_shutdown_grace_seconds" {
  description = "The subscriber's -shutdown-grace (VRAMQ_SHUTDOWN_GRACE), 0 to 3600: how long running batches may finish after SIGTERM (a scale-in, a deployment, a drained instance). At least subscriber_inference_timeout_seconds, so no batch is cut short; the task's stopTimeout is this plus 30 s for the final flush of deletes and releases (on EC2 capacity ECS has no 120 s cap, that is Fargate's). Longer delays deployments and scale-in by as much; on Spot, the instance goes 2 minutes after its notice whatever this says."
  type        = number
  default     = 130
  nullable    = false

  validation {
    condition     = var.subscriber_shutdown_grace_seconds >= 0 && var.subscriber_shutdown_grace_seconds <= 3600 && floor(var.subscriber_shutdown_grace_seconds) == var.subscriber_shutdown_grace_seconds
    error_message = "subscriber_shutdown_grace_seconds: whole seconds, 0 to 3600."
  }
}

variable "subscriber_inference_timeout_seconds" {
  description = "The subscriber's -inference-timeout (VRAMQ_INFERENCE_TIMEOUT), 1 to 3600: the longest one batch may run. subscriber_shutdown_grace_seconds must cover it, and it must be below subscriber_max_hold_seconds (the subscriber refuses to start otherwise; checked at plan time)."
  type        = number
  default     = 120
  nullable    = false

  validation {
    condition     = var.subscriber_inference_timeout_seconds >= 1 && var.subscriber_inference_timeout_seconds <= 3600 && floor(var.subscriber_inference_timeout_seconds) == var.subscriber_inference_timeout_seconds
    error_message = "subscriber_inference_timeout_seconds: whole seconds, 1 to 3600."
  }
}

variable "subscriber_max_hold_seconds" {
  description = "The subscriber's -max-hold (VRAMQ_MAX_HOLD), 61 to 43200: the longest it keeps extending one message's lease. The subscriber refuses to start unless it is at least visibility_timeout_seconds, above subscriber_inference_timeout_seconds and above its -admit-timeout (60 s); this module checks the first two at plan time, so a setting that would crash-loop the tasks does not apply."
  type        = number
  default     = 900
  nullable    = false

  validation {
    condition     = var.subscriber_max_hold_seconds >= 61 && var.subscriber_max_hold_seconds <= 43200 && floor(var.subscriber_max_hold_seconds) == var.subscriber_max_hold_seconds
    error_message = "subscriber_max_hold_seconds: whole seconds, 61 (above the subscriber's 60 s admit timeout) to 43200 (12 h, SQS's longest visibility)."
  }
}

variable "subscriber_task_protection" {
  description = "ECS task scale-in protection while a task holds messages (VRAMQ_TASK_PROTECTION on). Off by default: under steady load the subscriber always holds messages and renews it, and ECS then never stops an old task, so a deployment never finishes; the shutdown grace already lets running batches finish and hands back the rest. On: scale-in and deployments wait until a task is idle (or its protection lapses, -task-protection-expiry after the last renewal)."
  type        = bool
  default     = false
  nullable    = false
}

variable "subscriber_deployment_surge" {
  description = "How a deployment replaces subscriber tasks. true: new tasks start before old ones stop (maximum 200 %, minimum healthy 100 %): no drop in capacity, but up to twice subscriber_max_count GPU instances for the deployment's duration, so the Auto Scaling group's maximum and the GPU quota must allow twice the maximum. false: old tasks stop first (maximum 100 %, minimum healthy 0 %): no instance beyond subscriber_max_count, and the queue waits while the new tasks start (minutes)."
  type        = bool
  default     = true
  nullable    = false
}

variable "subscriber_log_level" {
  description = "The subscriber's -log-level: debug, info or warn (the OOM-retries metric filter counts WARN lines, which a higher level would hide)."
  type        = string
  default     = "info"
  nullable    = false

  validation {
    condition     = contains(["debug", "info", "warn"], var.subscriber_log_level)
    error_message = "subscriber_log_level: debug, info or warn (error would hide the WARN lines the OOM-retries metric counts)."
  }
}

variable "tenants" {
  description = "Tenant names the subscriber counts results under in its metrics (VRAMQ_TENANTS): the names of the publisher's API keys. Any other vramq-tenant attribute, which whoever can send to the work queue writes, counts as \"other tenants\", so the queue cannot add label series."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    # subscriber.Config.Validate's rule (internal/tenant.Valid), less the
    # comma that separates the names in VRAMQ_TENANTS.
    condition     = alltrue([for t in var.tenants : can(regex("^[!-+\\--~]{1,128}$", t))])
    error_message = "tenants: each 1 to 128 printable ASCII characters, no space and no comma."
  }
}

variable "subscriber_environment" {
  description = "More environment for the subscriber container, e.g. { VRAMQ_PREFETCH = \"20\", VRAMQ_VRAM_RESERVE = \"1GiB\" } (README: Configuration). The variables this module sets from its own inputs may not be given here With a model server, its tuning goes here too, e.g. { VRAMQ_MODEL_SERVER_TPM = \"2000000\", VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS = \"1024\" } (docs/configuration.md, docs/deployment.md)."
  type        = map(string)
  default     = {}
  nullable    = false

  validation {
    condition = length(setintersection(keys(var.subscriber_environment), [
      "QUEUE_URL", "RESULTS_QUEUE_URL", "DLQ_URL", "PAYLOAD_BUCKET", "VRAMQ_DEVICE", "VRAMQ_VISIBILITY_TIMEOUT",
      "VRAMQ_WAIT_TIME", "VRAMQ_SHUTDOWN_GRACE", "VRAMQ_INFERENCE_TIMEOUT", "VRAMQ_TASK_PROTECTION",
      "VRAMQ_METRICS_ADDR", "VRAMQ_LOG_FORMAT", "VRAMQ_LOG_LEVEL", "VRAMQ_EVENTS_TOPIC_ARN", "VRAMQ_MAX_HOLD",
      "VRAMQ_MODEL_SERVER", "VRAMQ_MODEL_SERVER_MODELS", "VRAMQ_MODEL_SERVER_API_KEY_ENV", "VRAMQ_MODEL_SERVER_API_KEY_FILE",
    ])) == 0
    error_message = "subscriber_environment: set the queue URLs, device, visibility, wait time, shutdown grace, inference timeout, max hold, task protection, metrics address, log settings and the model server's URL, models and key through this module's own variables."
  }

  validation {
    condition     = !contains(keys(var.subscriber_environment), "VRAMQ_MODEL_SERVER_API_KEY")
    error_message = "subscriber_environment: no VRAMQ_MODEL_SERVER_API_KEY (plain text in the task definition and the state); give model_server_api_key_secret_arn."
  }
}

variable "subscriber_health_check_command" {
  description = "Container health check of the subscriber (ECS healthCheck command). The default is the binary's own `subscriber healthcheck`, which asks liveness, /livez, on VRAMQ_METRICS_ADDR (not /healthz, which also fails while the model needs an operator: ECS would replace a task a replacement cannot help) and needs no shell or curl, so it works in the distroless and the CUDA image alike. [] turns the check off."
  type        = list(string)
  default     = ["CMD", "/usr/local/bin/subscriber", "healthcheck"]
  nullable    = false
}

variable "subscriber_health_check_start_period" {
  description = "Seconds after start before failed health checks count (model loading onto the GPU), 0 to 300."
  type        = number
  default     = 120
  nullable    = false

  validation {
    condition     = var.subscriber_health_check_start_period >= 0 && var.subscriber_health_check_start_period <= 300
    error_message = "subscriber_health_check_start_period: 0 to 300 seconds (the ECS limit)."
  }
}

variable "subscriber_min_count" {
  description = "Fewest subscriber tasks, 0 to 1000. 0 (the default) scales to zero when the queue is empty: no GPU instance runs, and the first message after a quiet spell waits for one to start (the alarm's minute, the instance's launch and boot, the image pull, the model load: expect 5-10 minutes). 1 keeps one GPU instance warm around the clock (a g5.xlarge on demand is about $1 an hour, about $730 a month)."
  type        = number
  default     = 0
  nullable    = false

  validation {
    condition     = var.subscriber_min_count >= 0 && var.subscriber_min_count <= 1000 && floor(var.subscriber_min_count) == var.subscriber_min_count
    error_message = "subscriber_min_count: a whole number, 0 to 1000."
  }
}

variable "subscriber_max_count" {
  description = "Most subscriber tasks, 1 to 1000, one GPU instance each. With subscriber_deployment_surge the Auto Scaling group may run twice as many instances during a deployment."
  type        = number
  default     = 10
  nullable    = false

  validation {
    condition     = var.subscriber_max_count >= 1 && var.subscriber_max_count <= 1000 && floor(var.subscriber_max_count) == var.subscriber_max_count
    error_message = "subscriber_max_count: a whole number, 1 to 1000."
  }
}

variable "subscriber_backlog_per_task_target" {
  description = "Target of the backlog-per-task scaling policy: visible messages on the work queue per wanted (desired) task that are acceptable. About (acceptable latency in seconds) x (messages a task finishes per second): a task doing 2 messages/s with 60 s of acceptable wait is 120."
  type        = number
  default     = 100
  nullable    = false

  validation {
    condition     = var.subscriber_backlog_per_task_target > 0
    error_message = "subscriber_backlog_per_task_target: above 0."
  }
}

variable "subscriber_scale_out_cooldown" {
  description = "Seconds after a scale-out before another. The policy divides by the tasks it asked for, not those already running, so a GPU task's minutes to start do not make it ask again; this only paces the steps."
  type        = number
  default     = 120
  nullable    = false
}

variable "subscriber_scale_in_cooldown" {
  description = "Seconds after a scale-in before another. A stopped task finishes its running batches within the shutdown grace and hands the rest back."
  type        = number
  default     = 300
  nullable    = false
}

################################################################################
# Publisher
################################################################################

variable "publisher_mode" {
  description = "How the publisher runs: \"lambda\" (the make lambda zip behind an API Gateway HTTP API) or \"fargate\" (the container image as an ECS Fargate service behind an Application Load Balancer)."
  type        = string
  default     = "lambda"
  nullable    = false

  validation {
    condition     = contains(["lambda", "fargate"], var.publisher_mode)
    error_message = "publisher_mode: \"lambda\" or \"fargate\"."
  }
}

variable "publisher_environment" {
  description = "More environment for the publisher, e.g. { VRAMQ_CHUNK_ITEMS = \"32\" } (README: bin/publisher). Not bearer keys: environment variables are plain text in the task definition, the Lambda configuration and the Terraform state; give publisher_api_keys_secret_arn instead."
  type        = map(string)
  default     = {}
  nullable    = false

  validation {
    condition     = length(setintersection(keys(var.publisher_environment), ["QUEUE_URL", "PAYLOAD_BUCKET", "VRAMQ_LOG_FORMAT", "VRAMQ_ADDR", "VRAMQ_METRICS_ADDR", "VRAMQ_MAX_BODY_BYTES"])) == 0
    error_message = "publisher_environment: QUEUE_URL, PAYLOAD_BUCKET, VRAMQ_LOG_FORMAT, VRAMQ_ADDR, VRAMQ_METRICS_ADDR and VRAMQ_MAX_BODY_BYTES (publisher_max_body_bytes) are set by this module."
  }

  validation {
    condition     = !contains(keys(var.publisher_environment), "VRAMQ_API_KEYS")
    error_message = "publisher_environment: no VRAMQ_API_KEYS (plain text in the task definition, the function's configuration and the state); give publisher_api_keys_secret_arn."
  }
}

variable "publisher_max_body_bytes" {
  description = "The publisher's -max-body-bytes (VRAMQ_MAX_BODY_BYTES), the largest request body it takes, in bytes, 1024 to 1073741824. Null: 4194304 (4 MiB) in lambda mode, where more is refused at plan time (Lambda takes a request event of at most 6 MB, and API Gateway may base64-encode the body into it); the publisher's own default (32 MiB) on Fargate."
  type        = number
  default     = null

  validation {
    condition     = var.publisher_max_body_bytes == null || (try(var.publisher_max_body_bytes >= 1024 && var.publisher_max_body_bytes <= 1073741824 && floor(var.publisher_max_body_bytes) == var.publisher_max_body_bytes, false))
    error_message = "publisher_max_body_bytes: whole bytes, 1024 to 1073741824 (and at most 4194304 in lambda mode)."
  }
}

variable "publisher_api_keys_secret_arn" {
  description = "Complete ARN of the secret holding the publisher's bearer keys, comma- or line-separated. Fargate: a Secrets Manager secret (its complete ARN, ending in -AbCdEf: a partial ARN matches nothing in IAM) or an SSM SecureString parameter, which ECS injects as VRAMQ_API_KEYS when a task starts (the execution role may read exactly it). Lambda: a Secrets Manager secret, which the function reads itself at each cold start (-api-keys-secret; its role may read exactly it). A secret under a customer managed KMS key also needs kms:Decrypt for that role in the key's policy. Null: no bearer keys."
  type        = string
  default     = null

  validation {
    # A Secrets Manager secret by its complete ARN, ending in "the final
    # hyphen and six random characters that Secrets Manager adds at the end
    # of the ARN" (Secrets Manager API reference, SecretId). The API accepts
    # a partial ARN as a SecretId, but an IAM policy's Resource is matched
    # against the complete ARN, so a role policy naming a partial one grants
    # nothing and the keys are never read. A name that itself ends in a
    # hyphen and six characters looks complete here; AWS advises against
    # such names for the same reason.
    condition     = var.publisher_api_keys_secret_arn == null || can(regex("^arn:[^:]+:(secretsmanager:[^:]+:[0-9]{12}:secret:.+-[A-Za-z0-9]{6}|ssm:[^:]+:[0-9]{12}:parameter/.+)$", var.publisher_api_keys_secret_arn))
    error_message = "publisher_api_keys_secret_arn: the complete ARN of a Secrets Manager secret, with the six random characters Secrets Manager appends (arn:aws:secretsmanager:...:secret:name-AbCdEf: aws secretsmanager describe-secret --query ARN), or of an SSM parameter (arn:aws:ssm:...:parameter/...)."
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
  nullable    = false

  validation {
    condition     = contains(["arm64", "x86_64"], var.publisher_lambda_architecture)
    error_message = "publisher_lambda_architecture: arm64 or x86_64."
  }
}

variable "publisher_lambda_memory_size" {
  description = "Memory of the publisher function in MB (CPU grows with it), 128 to 10240. A request body is held in memory while it is chunked."
  type        = number
  default     = 512
  nullable    = false

  validation {
    condition     = var.publisher_lambda_memory_size >= 128 && var.publisher_lambda_memory_size <= 10240
    error_message = "publisher_lambda_memory_size: 128 to 10240 MB."
  }
}

variable "publisher_lambda_timeout" {
  description = "Timeout of the publisher function in seconds, 1 to 30: API Gateway HTTP APIs give up after 30."
  type        = number
  default     = 29
  nullable    = false

  validation {
    condition     = var.publisher_lambda_timeout >= 1 && var.publisher_lambda_timeout <= 30
    error_message = "publisher_lambda_timeout: 1 to 30 seconds (the HTTP API's integration timeout)."
  }
}

variable "publisher_lambda_reserved_concurrency" {
  description = "Reserved concurrency of the publisher function, which also caps it (a cap on SQS sends per second). Null: unreserved."
  type        = number
  default     = null
}

variable "publisher_authorization" {
  description = "Lambda mode: the API Gateway authorization of every route but /healthz: AWS_IAM (callers sign with SigV4 and need execute-api:Invoke; the OpenAI SDKs cannot, so the Files and Batch routes serve SigV4 clients only), JWT (an OIDC issuer, see publisher_jwt_issuer; an OpenAI SDK passes the token as its api_key) or NONE (the publisher's own bearer keys, publisher_api_keys_secret_arn, which the OpenAI SDKs send as they are; with no keys, anyone). Null (default): NONE when publisher_api_keys_secret_arn is given, else AWS_IAM. The publisher checks its keys on every route, in the Authorization header that SigV4 and JWT use too, so keys with AWS_IAM or JWT are refused at plan time: no request could pass both."
  type        = string
  default     = null

  validation {
    condition     = contains(["AWS_IAM", "JWT", "NONE"], var.publisher_authorization == null ? "NONE" : var.publisher_authorization)
    error_message = "publisher_authorization: AWS_IAM, JWT, NONE or null."
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
  nullable    = false
}

variable "publisher_throttling_burst_limit" {
  description = "Lambda mode: API Gateway burst limit of the publisher API, all clients together (requests at once); over it, 429 without invoking the function. Per client, the publisher's own -rate-burst applies (publisher_environment VRAMQ_RATE_BURST)."
  type        = number
  default     = 200
  nullable    = false

  validation {
    condition     = var.publisher_throttling_burst_limit >= 1 && floor(var.publisher_throttling_burst_limit) == var.publisher_throttling_burst_limit
    error_message = "publisher_throttling_burst_limit: a whole number, at least 1 (0 refuses every request)."
  }
}

variable "publisher_throttling_rate_limit" {
  description = "Lambda mode: API Gateway steady rate limit of the publisher API, all clients together (requests per second). Per client, the publisher's own -rate-limit applies (publisher_environment VRAMQ_RATE_LIMIT)."
  type        = number
  default     = 100
  nullable    = false

  validation {
    condition     = var.publisher_throttling_rate_limit > 0
    error_message = "publisher_throttling_rate_limit: above 0 (0 refuses every request)."
  }
}

variable "publisher_edge" {
  description = "Lambda mode: put a CloudFront distribution in front of the publisher (edge.tf) that serves the API and, under /files/, the payload bucket on one origin, and give clients its URL (output api_url). A file too large for Lambda's 6 MB response is then redirected within the API's origin, which the OpenAI SDK for Go follows with its default client; without it the redirect goes to S3's host, which that SDK refuses (the JavaScript SDK follows either). Off by default: SigV4 (publisher_authorization AWS_IAM, the default without keys) cannot pass it, it is a second public entry point and a distribution to deploy, and clients that are not the Go SDK do without it. Needs bearer keys or JWT."
  type        = bool
  default     = false
  nullable    = false
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
  nullable    = false

  validation {
    condition     = contains(["X86_64", "ARM64"], var.publisher_cpu_architecture)
    error_message = "publisher_cpu_architecture: X86_64 or ARM64."
  }
}

variable "publisher_desired_count" {
  description = "With publisher_mode = \"fargate\": publisher tasks (two spread over zones for availability)."
  type        = number
  default     = 2
  nullable    = false
}

variable "publisher_cpu" {
  description = "With publisher_mode = \"fargate\": CPU units of a publisher task (a Fargate size)."
  type        = number
  default     = 512
  nullable    = false
}

variable "publisher_memory" {
  description = "With publisher_mode = \"fargate\": memory of a publisher task in MiB (a Fargate size)."
  type        = number
  default     = 1024
  nullable    = false
}

variable "publisher_shutdown_grace_seconds" {
  description = "With publisher_mode = \"fargate\": the publisher's -shutdown-grace (VRAMQ_SHUTDOWN_GRACE), 0 to 115; ECS waits 5 s more before SIGKILL (Fargate's stopTimeout is at most 120)."
  type        = number
  default     = 25
  nullable    = false

  validation {
    condition     = var.publisher_shutdown_grace_seconds >= 0 && var.publisher_shutdown_grace_seconds <= 115
    error_message = "publisher_shutdown_grace_seconds: 0 to 115."
  }
}

variable "publisher_alb_internal" {
  description = "With publisher_mode = \"fargate\": an internal load balancer rather than an internet-facing one (which needs publisher_certificate_arn). Either sits in publisher_alb_subnet_ids."
  type        = bool
  default     = true
  nullable    = false
}

variable "publisher_alb_ingress_cidr_blocks" {
  description = "With publisher_mode = \"fargate\": CIDR blocks allowed to reach the load balancer. Empty: the VPC's own CIDR block."
  type        = list(string)
  default     = []
  nullable    = false
}

variable "publisher_certificate_arn" {
  description = "With publisher_mode = \"fargate\": ACM certificate for an HTTPS listener on 443. Null: plain HTTP on 80, which only an internal load balancer may use (an internet-facing one refuses to plan without a certificate)."
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
  description = "Alarm when the oldest message on the work queue is older than this (seconds): the subscribers are not keeping up, or none runs. With subscriber_min_count = 0, keep it above the cold start (5-10 minutes)."
  type        = number
  default     = 900
  nullable    = false
}

variable "dlq_message_age_alarm_seconds" {
  description = "Alarm when the oldest message in the dead-letter queue is older than this (seconds), while there is still time to look at it before dlq_message_retention_seconds deletes it. Default: 10 days, 4 before the 14-day retention."
  type        = number
  default     = 864000
  nullable    = false
}

variable "oom_retries_alarm_threshold" {
  description = "Alarm when the subscribers split or isolate more than this many batches for out-of-memory in 5 minutes: model Cost functions under-estimate, or another process shares the GPU."
  type        = number
  default     = 10
  nullable    = false
}

variable "tasks_below_desired_alarm_periods" {
  description = "Alarm when fewer subscriber tasks run than desired for this many 5-minute periods (tasks failing health checks, crashing, or no GPU capacity). A GPU instance takes a few minutes to come up, so keep at least 2."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = var.tasks_below_desired_alarm_periods >= 2
    error_message = "tasks_below_desired_alarm_periods: at least 2 (a GPU task takes minutes to start)."
  }
}

variable "completion_events" {
  description = "Create an SNS topic that gets one completion event per job when its last chunk settles (docs/events.md), and let the subscriber publish to it (VRAMQ_EVENTS_TOPIC_ARN). Subscribe a queue or a Lambda to the events_topic_arn output."
  type        = bool
  default     = false
  nullable    = false
}

################################################################################
# Model server (subscriber -model-server: docs/models.md, docs/deployment.md)
################################################################################

# Two ways, exclusive: a model server running as a second container of the
# subscriber's GPU task (model_server_image), reached on localhost (awsvpc
# tasks share one network namespace); or an endpoint outside the task
# (model_server_url), e.g. OpenAI or a vLLM fleet behind a load balancer.
# Neither: the subscriber runs its in-process model, as before.

variable "model_server_image" {
  description = "Image of a model server run as a sidecar container of the subscriber's task (e.g. vllm/vllm-openai:<tag>, ghcr.io/huggingface/text-generation-inference:<tag>), which gets the task's GPUs; the subscriber waits for its health check to pass (dependsOn HEALTHY) and sends the items' requests to http://localhost:<model_server_port>. An ECR image in this account gets pull rights on exactly its repository. Null: no sidecar. Exclusive with model_server_url."
  type        = string
  default     = null

  validation {
    condition     = var.model_server_image == null || can(regex("^[^\\s]+$", var.model_server_image))
    error_message = "model_server_image: an image reference, no spaces."
  }
}

variable "model_server_command" {
  description = "With model_server_image: the sidecar's command (ECS command: the arguments its image's entrypoint takes), e.g. for vllm/vllm-openai [\"--model\", \"meta-llama/Llama-3.1-8B-Instruct\", \"--port\", \"8000\", \"--gpu-memory-utilization\", \"0.9\", \"--max-model-len\", \"8192\"]. The port must be model_server_port. [] runs the image's own default command."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for a in var.model_server_command : a != ""])
    error_message = "model_server_command: no empty arguments."
  }

  # A key in the command is plain text in the task definition, what
  # DescribeTaskDefinition shows and the Terraform state.
  validation {
    condition     = alltrue([for a in var.model_server_command : !can(regex("(^|\\s)--api-key(=|\\s|$)", a))])
    error_message = "model_server_command: no --api-key (plain text in the task definition and the state): give the sidecar its key as a secret, model_server_secrets = { VLLM_API_KEY = \"<secret ARN>\" } (vLLM reads VLLM_API_KEY), and the subscriber the same secret as model_server_api_key_secret_arn."
  }
}

variable "model_server_port" {
  description = "With model_server_image: the port the sidecar serves its OpenAI-compatible API on (vLLM's default 8000), which the subscriber's -model-server points at (http://localhost:<port>) and the default health check asks. 1024 to 65535, not the subscriber's metrics port 9090."
  type        = number
  default     = 8000
  nullable    = false

  validation {
    condition     = var.model_server_port >= 1024 && var.model_server_port <= 65535 && floor(var.model_server_port) == var.model_server_port && var.model_server_port != 9090
    error_message = "model_server_port: a whole number, 1024 to 65535, not 9090 (the subscriber's metrics port in the same network namespace)."
  }
}

variable "model_server_health_check_command" {
  description = "With model_server_image: the sidecar's container health check (ECS healthCheck command), which the subscriber's start waits on. Empty (the default): GET /health on model_server_port (vLLM, TGI and TEI answer it once the model is loaded) with the image's python3 (vLLM's image is a Python one), else its curl. An image with neither needs its own command, e.g. [\"CMD\", \"/usr/local/bin/healthcheck\"]."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = length(var.model_server_health_check_command) == 0 || contains(["CMD", "CMD-SHELL"], try(var.model_server_health_check_command[0], ""))
    error_message = "model_server_health_check_command: empty for the default, or a command starting with CMD or CMD-SHELL (ECS healthCheck)."
  }
}

variable "model_server_health_check_start_period" {
  description = "With model_server_image: seconds after the sidecar starts before failed health checks count, 0 to 300 (the ECS maximum): downloading and loading the weights, profiling, CUDA graphs. After it, 10 failed checks 30 s apart (5 more minutes) mark the sidecar unhealthy, which stops the task. A model larger than that allows should be baked into the image or read from a volume."
  type        = number
  default     = 300
  nullable    = false

  validation {
    condition     = var.model_server_health_check_start_period >= 0 && var.model_server_health_check_start_period <= 300 && floor(var.model_server_health_check_start_period) == var.model_server_health_check_start_period
    error_message = "model_server_health_check_start_period: whole seconds, 0 to 300 (the ECS limit)."
  }
}

variable "model_server_gpus" {
  description = "With model_server_image: GPUs given to the sidecar (its resourceRequirements GPU), 1 to 8; the subscriber container then gets none (it only sends HTTP requests). ECS gives a GPU to one container only, so the server's share of that GPU's memory is its own setting (vLLM --gpu-memory-utilization), not this. The instance types must have at least this many GPUs."
  type        = number
  default     = 1
  nullable    = false

  validation {
    condition     = var.model_server_gpus >= 1 && var.model_server_gpus <= 8 && floor(var.model_server_gpus) == var.model_server_gpus
    error_message = "model_server_gpus: a whole number, 1 to 8."
  }
}

variable "model_server_min_output_tokens_per_second" {
  description = "With a model server: the slowest generation, in output tokens a second of one request, that the timeouts must allow for at the subscriber's ceiling of output tokens (VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS in subscriber_environment, else its 16384), 1 to 1000. The module sets the request timeout (VRAMQ_MODEL_SERVER_TIMEOUT, unless given) to cover that generation, and refuses at plan time an inference timeout that cannot cover it after -model-server-max-wait: a generation that long would time out on every attempt."
  type        = number
  default     = 20
  nullable    = false

  validation {
    condition     = var.model_server_min_output_tokens_per_second >= 1 && var.model_server_min_output_tokens_per_second <= 1000
    error_message = "model_server_min_output_tokens_per_second: 1 to 1000."
  }
}

variable "model_server_shared_memory_size" {
  description = "With model_server_image: the sidecar's /dev/shm in MiB (ECS linuxParameters.sharedMemorySize), 64 to below subscriber_memory, whose memory it uses. Docker gives a container 64 MiB; vLLM's processes share tensors through /dev/shm (its Docker guide runs the image with --ipc=host or a larger --shm-size), which an awsvpc task cannot share with the host."
  type        = number
  default     = 4096
  nullable    = false

  validation {
    condition     = var.model_server_shared_memory_size >= 64 && floor(var.model_server_shared_memory_size) == var.model_server_shared_memory_size
    error_message = "model_server_shared_memory_size: a whole number of MiB, at least 64 (and below subscriber_memory, checked at plan time)."
  }
}

variable "model_server_weights_volume" {
  description = "With model_server_image: a directory of the GPU instance (host_path, on its root volume: size subscriber_root_volume_size for the weights) mounted in the sidecar at container_path (for vllm/vllm-openai, /root/.cache/huggingface), so a task started again on the same instance finds the weights it downloaded instead of downloading them again. Null: none; the weights are downloaded at every start."
  type = object({
    host_path      = string
    container_path = string
  })
  default = null

  validation {
    condition     = var.model_server_weights_volume == null || can(regex("^/[^:]*[^/:]$", var.model_server_weights_volume.host_path)) && can(regex("^/[^:]*[^/:]$", var.model_server_weights_volume.container_path))
    error_message = "model_server_weights_volume: host_path and container_path are absolute paths, not / itself, without ':'."
  }
}

variable "model_server_environment" {
  description = "With model_server_image: plain environment of the sidecar, e.g. { HF_HUB_ENABLE_HF_TRANSFER = \"1\" }. Not tokens or keys: environment variables are plain text in the task definition and the Terraform state; give them in model_server_secrets."
  type        = map(string)
  default     = {}
  nullable    = false

  validation {
    condition     = length(setintersection(keys(var.model_server_environment), ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "API_KEY", "OPENAI_API_KEY"])) == 0
    error_message = "model_server_environment: no HF_TOKEN, HUGGING_FACE_HUB_TOKEN, VLLM_API_KEY, API_KEY or OPENAI_API_KEY in plain text; give them in model_server_secrets."
  }
}

variable "model_server_secrets" {
  description = "With model_server_image: the sidecar's secret environment, variable name to the complete ARN of a Secrets Manager secret (ending in -AbCdEf) or an SSM SecureString parameter, e.g. { HF_TOKEN = \"arn:aws:secretsmanager:...:secret:hf-token-AbCdEf\" }. ECS injects each when the task starts (container secrets); the task's execution role may read exactly these. A secret under a customer managed KMS key also needs kms:Decrypt for that role in the key's policy."
  type        = map(string)
  default     = {}
  nullable    = false

  validation {
    # As publisher_api_keys_secret_arn: IAM matches only a complete ARN.
    condition     = alltrue([for arn in values(var.model_server_secrets) : can(regex("^arn:[^:]+:(secretsmanager:[^:]+:[0-9]{12}:secret:.+-[A-Za-z0-9]{6}|ssm:[^:]+:[0-9]{12}:parameter/.+)$", arn))])
    error_message = "model_server_secrets: each value the complete ARN of a Secrets Manager secret, with the six random characters Secrets Manager appends (aws secretsmanager describe-secret --query ARN), or of an SSM parameter."
  }

  validation {
    condition     = alltrue([for k in keys(var.model_server_secrets) : can(regex("^[A-Za-z_][A-Za-z0-9_]*$", k))])
    error_message = "model_server_secrets: each key an environment variable name (letters, digits, underscores, not starting with a digit)."
  }
}

variable "model_server_url" {
  description = "Root URL of a model server outside the task (the subscriber's -model-server), e.g. https://api.openai.com or https://vllm.internal.example.com: the subscriber's requests go there and its task gets no GPU (the task still runs on this module's GPU capacity provider). http:// only for an endpoint inside the VPC; no credentials in the URL (give model_server_api_key_secret_arn). Null: none. Exclusive with model_server_image."
  type        = string
  default     = null

  validation {
    condition     = var.model_server_url == null || can(regex("^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[^\\s@?#]*)?$", var.model_server_url))
    error_message = "model_server_url: http(s)://host[:port][/path], with no user, query or fragment (the key goes in model_server_api_key_secret_arn)."
  }
}

variable "model_server_models" {
  description = "The model names requests may name (the subscriber's -model-server-models): required with model_server_image or model_server_url; at start the subscriber checks that GET /v1/models lists every one (vLLM lists --served-model-name, else --model)."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for m in var.model_server_models : can(regex("^[^\\s,]+$", m))])
    error_message = "model_server_models: each name non-empty, without spaces or commas (the flag is comma-separated)."
  }
}

variable "model_server_api_key_secret_arn" {
  description = "Complete ARN of a Secrets Manager secret (ending in -AbCdEf) or an SSM SecureString parameter holding the model server's API key (an OpenAI key; or the --api-key of a sidecar vLLM, which then reads the same secret through model_server_secrets). ECS injects it into the subscriber container as VRAMQ_MODEL_SERVER_API_KEY (the default of -model-server-api-key-env), never in plain environment; the execution role may read exactly it. Null: no key."
  type        = string
  default     = null

  validation {
    # As publisher_api_keys_secret_arn: IAM matches only a complete ARN.
    condition     = var.model_server_api_key_secret_arn == null || can(regex("^arn:[^:]+:(secretsmanager:[^:]+:[0-9]{12}:secret:.+-[A-Za-z0-9]{6}|ssm:[^:]+:[0-9]{12}:parameter/.+)$", var.model_server_api_key_secret_arn))
    error_message = "model_server_api_key_secret_arn: the complete ARN of a Secrets Manager secret, with the six random characters Secrets Manager appends (aws secretsmanager describe-secret --query ARN), or of an SSM parameter."
  }
}
