# The subscriber on GPUs: an ECS service on EC2 container instances.
#
# Fargate has no GPUs, so the subscriber cannot run there: its tasks need a
# GPU resourceRequirement, which only EC2 capacity (here an Auto Scaling group
# of GPU instances on the ECS GPU-optimised AMI, with the NVIDIA driver and
# container toolkit) can place. ECS managed scaling sizes the group to the
# tasks the service wants; autoscaling.tf sizes the service to the backlog.

locals {
  subscriber_metrics_port = 9090

  # ECS sends SIGTERM, waits stopTimeout, then SIGKILL. The subscriber lets
  # running batches finish for its shutdown grace, then releases the rest and
  # flushes deletes and releases for up to 30 s. On EC2 capacity ECS takes a
  # stopTimeout over 120 s (that cap is Fargate's), so the grace can cover the
  # longest batch, -inference-timeout, and a scale-in or a deployment cuts no
  # batch short. A Spot interruption still ends the instance 2 minutes after
  # its notice, whatever this says.
  subscriber_flush_seconds = 30
  subscriber_stop_timeout  = var.subscriber_shutdown_grace_seconds + local.subscriber_flush_seconds

  # One GPU task per instance. A deployment with surge starts the new tasks
  # before it stops the old ones (maximum 200 %, minimum healthy 100 %): at the
  # maximum count it needs twice as many instances, so the group may grow to
  # that. Without surge it stops old tasks first (maximum 100 %, minimum
  # healthy 0 %: with one task, any higher minimum would leave ECS no move),
  # needs no extra instance, and the queue waits while the new tasks start.
  subscriber_deployment_maximum_percent         = var.subscriber_deployment_surge ? 200 : 100
  subscriber_deployment_minimum_healthy_percent = var.subscriber_deployment_surge ? 100 : 0
  subscriber_instances_max                      = var.subscriber_max_count * local.subscriber_deployment_maximum_percent / 100

  # The subscriber's settings that the rest of this module relies on: the
  # visibility and wait time match the work queue's, JSON logs feed the
  # OOM-retries metric filter (alarms.tf), the metrics port the health check.
  # The timeouts are checked against each other as subscriber.Config.Validate
  # checks them (preconditions of the task definition), so no combination
  # the variables accept makes every task exit at start.
  subscriber_settings = merge({
    VRAMQ_VISIBILITY_TIMEOUT = "${var.visibility_timeout_seconds}s"
    VRAMQ_WAIT_TIME          = "${var.receive_wait_time_seconds}s"
    VRAMQ_SHUTDOWN_GRACE     = "${var.subscriber_shutdown_grace_seconds}s"
    VRAMQ_INFERENCE_TIMEOUT  = "${var.subscriber_inference_timeout_seconds}s"
    VRAMQ_MAX_HOLD           = "${var.subscriber_max_hold_seconds}s"
    VRAMQ_TASK_PROTECTION    = var.subscriber_task_protection ? "on" : "off"
    VRAMQ_METRICS_ADDR       = ":${local.subscriber_metrics_port}"
    VRAMQ_LOG_FORMAT         = "json"
    VRAMQ_LOG_LEVEL          = var.subscriber_log_level
    VRAMQ_TENANTS            = join(",", var.tenants)
    },
    # With a model server the subscriber refuses a -device other than auto
    # (cmd/subscriber's checkModelServer; the environment counts as given):
    # the model, and the GPU, are the server's.
    local.model_server_on ? {} : { VRAMQ_DEVICE = var.subscriber_device },
    local.model_server_on ? {
      VRAMQ_MODEL_SERVER        = local.model_server_base_url
      VRAMQ_MODEL_SERVER_MODELS = join(",", var.model_server_models)
    } : {},
  )

  # The model server (variables.tf, "Model server"): a sidecar container of
  # this task, or an endpoint elsewhere; never both (the task definition's
  # preconditions).
  model_server_sidecar  = var.model_server_image != null
  model_server_external = var.model_server_url != null
  model_server_on       = local.model_server_sidecar || local.model_server_external
  # Containers of an awsvpc task share its network namespace (the ECS
  # developer guide's awsvpc network mode), so the sidecar is on localhost.
  model_server_base_url       = local.model_server_sidecar ? "http://localhost:${var.model_server_port}" : var.model_server_url
  model_server_container      = "model-server"
  model_server_weights_volume = "model-weights"
  # The external endpoint's port: the URL's, else its scheme's.
  model_server_url_port = local.model_server_external ? tonumber(try(regex("^https?://[^/:]+:([0-9]+)", var.model_server_url)[0], startswith(var.model_server_url, "https://") ? "443" : "80")) : 443

  # The default health check asks /health, which vLLM, TGI and TEI answer
  # once the model is loaded, with python3 where the image has it (vLLM's),
  # else curl.
  model_server_health_check_command = length(var.model_server_health_check_command) > 0 ? var.model_server_health_check_command : [
    "CMD-SHELL",
    "python3 -c \"import urllib.request; urllib.request.urlopen('http://localhost:${var.model_server_port}/health', timeout=5)\" 2>/dev/null || curl -fsS -m 5 http://localhost:${var.model_server_port}/health",
  ]
  model_server_health_check_interval = 30
  model_server_health_check_retries  = 10
  # How long the subscriber waits for the sidecar to become healthy before
  # ECS gives up and stops the task (startTimeout of the dependency): the
  # start period, then every retry.
  model_server_start_timeout = var.model_server_health_check_start_period + local.model_server_health_check_interval * local.model_server_health_check_retries

  # The secrets ECS injects into the task's containers, which its execution
  # role may read (iam.tf): the API key the subscriber sends, and the
  # sidecar's own.
  model_server_secret_arns = concat(
    var.model_server_api_key_secret_arn == null ? [] : [var.model_server_api_key_secret_arn],
    local.model_server_sidecar ? [for k in sort(keys(var.model_server_secrets)) : var.model_server_secrets[k]] : [],
  )

  # Model-server mode. A generation of the subscriber's ceiling of output
  # tokens (-model-server-max-output-tokens) at the slowest rate allowed for
  # must fit one request's timeout, which the module sets unless given, and
  # the inference timeout after the longest wait for the server (checked by
  # the task definition's preconditions): otherwise it times out on every
  # attempt and its message is dead-lettered.
  model_server_max_output_tokens    = try(tonumber(var.subscriber_environment["VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS"]), 16384)
  model_server_generation_seconds   = ceil(local.model_server_max_output_tokens / var.model_server_min_output_tokens_per_second)
  model_server_request_timeout      = max(120, local.model_server_generation_seconds)
  model_server_max_wait_seconds     = 60
  model_server_max_wait_given       = contains(keys(var.subscriber_environment), "VRAMQ_MODEL_SERVER_MAX_WAIT")
  model_server_inference_needs      = local.model_server_generation_seconds + (local.model_server_max_wait_given ? 0 : local.model_server_max_wait_seconds)
  model_server_inference_timeout_ok = !local.model_server_on || var.subscriber_inference_timeout_seconds >= local.model_server_inference_needs
  # Every message held when the server asks for a pause, or needs an
  # operator, is handed back, a receive each: one receive's worth (SQS's
  # most, 10) waits ahead of the running batches instead of the default 20.
  model_server_defaults = local.model_server_on ? {
    VRAMQ_PREFETCH             = "10"
    VRAMQ_MODEL_SERVER_TIMEOUT = "${local.model_server_request_timeout}s"
  } : {}

  subscriber_environment = merge(local.model_server_defaults, var.subscriber_environment, local.subscriber_settings, local.events_environment, {
    QUEUE_URL         = aws_sqs_queue.work.url
    RESULTS_QUEUE_URL = aws_sqs_queue.results.url
    DLQ_URL           = aws_sqs_queue.dlq.url
    PAYLOAD_BUCKET    = aws_s3_bucket.payloads.id
  })
}

################################################################################
# Cluster and GPU capacity
################################################################################

# What each instance type of the group carries (EC2 DescribeInstanceTypes):
# its GPUs, which the task definition's preconditions hold against what a
# task takes. Keyed by position, as the keys of a for_each must be known at
# plan time.
data "aws_ec2_instance_type" "subscriber" {
  for_each = { for i, t in var.subscriber_instance_types : tostring(i) => t }

  instance_type = each.value
}

locals {
  # GPUs of each instance type, by name.
  subscriber_instance_gpus = { for d in data.aws_ec2_instance_type.subscriber : d.instance_type => (length(d.gpus) == 0 ? 0 : sum([for g in d.gpus : g.count])) }
  # GPUs a task takes: the sidecar's, none beside an external endpoint, else
  # the subscriber's own.
  subscriber_task_gpus = local.model_server_external ? 0 : (local.model_server_sidecar ? var.model_server_gpus : var.subscriber_gpus_per_task)
}

resource "aws_ecs_cluster" "this" {
  name = local.name

  # DesiredTaskCount, the denominator of the backlog-per-task metric and half
  # of the from-zero alarm (autoscaling.tf), and RunningTaskCount, the other
  # half of the tasks-below-desired alarm, come from Container Insights.
  setting {
    name  = "containerInsights"
    value = "enabled"
  }

  tags = local.tags
}

resource "aws_security_group" "gpu_instances" {
  name_prefix = "${local.name}-gpu-instances-"
  description = "vramq GPU container instances: outbound HTTPS to ECS, ECR, SSM and CloudWatch only"
  vpc_id      = var.vpc_id

  egress {
    description = "HTTPS to AWS APIs (through a NAT gateway or VPC endpoints)"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  tags = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_launch_template" "gpu" {
  name_prefix = "${local.name}-gpu-"
  # Pinned (subscriber_ami_id), not read from the recommended-AMI parameter at
  # plan time, which would show a diff on every AMI release. Moving to a new
  # AMI is a change of the variable: a new launch template version, which an
  # instance refresh of the group rolls out (aws_autoscaling_group.gpu).
  image_id = var.subscriber_ami_id

  iam_instance_profile {
    arn = aws_iam_instance_profile.gpu_instance.arn
  }

  vpc_security_group_ids = [aws_security_group.gpu_instances.id]

  # ECS_AWSVPC_BLOCK_IMDS keeps tasks off the instance role: they get only
  # their task role. Spot draining lets ECS stop tasks (SIGTERM, so the
  # subscriber hands its messages back) on a Spot interruption notice.
  user_data = base64encode(<<-EOT
    #!/bin/bash
    cat >>/etc/ecs/ecs.config <<'CONFIG'
    ECS_CLUSTER=${aws_ecs_cluster.this.name}
    ECS_ENABLE_GPU_SUPPORT=${!local.model_server_external}
    ECS_AWSVPC_BLOCK_IMDS=true
    ECS_ENABLE_SPOT_INSTANCE_DRAINING=${var.subscriber_spot}
    CONFIG
  EOT
  )

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"

    ebs {
      volume_size           = var.subscriber_root_volume_size
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "${local.name}-gpu" })
  }

  tags = local.tags
}

resource "aws_autoscaling_group" "gpu" {
  name_prefix         = "${local.name}-gpu-"
  vpc_zone_identifier = var.subnet_ids

  # ECS managed scaling owns the size between these bounds; room for a
  # deployment's surge (local.subscriber_instances_max).
  min_size = 0
  max_size = local.subscriber_instances_max

  # On Spot, launch a replacement when AWS signals an elevated interruption
  # risk, before the 2-minute notice.
  capacity_rebalance = var.subscriber_spot

  # Managed termination protection needs it: ECS clears the protection only
  # on instances that run no task, so a scale-in never kills a running task.
  protect_from_scale_in = true

  mixed_instances_policy {
    instances_distribution {
      on_demand_percentage_above_base_capacity = var.subscriber_spot ? 0 : 100
      spot_allocation_strategy                 = "price-capacity-optimized"
    }

    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.gpu.id
        version            = aws_launch_template.gpu.latest_version
      }

      dynamic "override" {
        for_each = var.subscriber_instance_types

        content {
          instance_type = override.value
        }
      }
    }
  }

  tag {
    key                 = "AmazonECSManaged"
    value               = "true"
    propagate_at_launch = true
  }

  dynamic "tag" {
    for_each = local.tags

    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  # A new AMI (subscriber_ami_id) or any other launch template change is a
  # new template version, hence a change of mixed_instances_policy, which
  # starts an instance refresh (provider: aws_autoscaling_group,
  # instance_refresh: "A refresh will always be triggered by a change in any
  # of launch_configuration, launch_template, or mixed_instances_policy").
  # Without it, running instances keep the old AMI until scaled in.
  # ECS managed termination protection marks every instance that runs a task
  # as protected from scale-in, so the refresh must replace protected
  # instances too ("Refresh"); managed draining then stops their tasks with
  # SIGTERM (the shutdown grace) before EC2 terminates them. New instances
  # start before old ones stop (minimum 100 %, maximum 200 % healthy), so
  # the fleet keeps its GPUs meanwhile.
  instance_refresh {
    strategy = "Rolling"

    preferences {
      min_healthy_percentage       = 100
      max_healthy_percentage       = 200
      instance_warmup              = 300
      skip_matching                = true
      scale_in_protected_instances = "Refresh"
    }
  }

  lifecycle {
    # A new group (a new name_prefix) is created before the old one goes, so
    # the capacity provider below can move to it while the old is attached.
    create_before_destroy = true
    # Managed scaling changes it.
    ignore_changes = [desired_capacity]
  }
}

resource "aws_ecs_capacity_provider" "gpu" {
  # Named after its group, which is unique (name_prefix), so a replacement
  # can exist beside the provider it replaces: ECS refuses to delete a
  # provider still attached to the cluster. The name starts with name_prefix,
  # which may not start with aws, ecs or fargate (reserved by ECS).
  name = aws_autoscaling_group.gpu.name

  auto_scaling_group_provider {
    auto_scaling_group_arn         = aws_autoscaling_group.gpu.arn
    managed_termination_protection = "ENABLED"
    managed_draining               = "ENABLED"

    managed_scaling {
      status                    = "ENABLED"
      target_capacity           = 100
      minimum_scaling_step_size = 1
      maximum_scaling_step_size = 10
      # Boot, driver initialisation and agent registration.
      instance_warmup_period = 300
    }
  }

  tags = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_ecs_cluster_capacity_providers" "this" {
  cluster_name = aws_ecs_cluster.this.name
  # FARGATE only for the publisher (publisher_mode = "fargate"), which needs
  # no GPU.
  capacity_providers = concat([aws_ecs_capacity_provider.gpu.name], local.publisher_fargate ? ["FARGATE"] : [])

  default_capacity_provider_strategy {
    capacity_provider = aws_ecs_capacity_provider.gpu.name
    weight            = 1
  }
}

################################################################################
# Task and service
################################################################################

resource "aws_cloudwatch_log_group" "subscriber" {
  name              = "/ecs/${local.name}/subscriber"
  retention_in_days = var.log_retention_days

  tags = local.tags
}

resource "aws_security_group" "subscriber_tasks" {
  name_prefix = "${local.name}-subscriber-"
  description = "vramq subscriber tasks: outbound HTTPS to SQS, S3 and ECS; /metrics from the scrapers named"
  vpc_id      = var.vpc_id

  egress {
    description = "HTTPS to SQS and S3 (through a NAT gateway or VPC endpoints)"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  # An external model server on a port other than 443 (a vLLM fleet behind an
  # internal load balancer on http://...:8000, say). A sidecar needs none:
  # localhost does not pass the security group.
  dynamic "egress" {
    for_each = local.model_server_external && local.model_server_url_port != 443 ? [local.model_server_url_port] : []

    content {
      description = "The model server (model_server_url)"
      from_port   = egress.value
      to_port     = egress.value
      protocol    = "tcp"
      cidr_blocks = ["0.0.0.0/0"]
    }
  }

  dynamic "ingress" {
    for_each = length(var.metrics_ingress_cidr_blocks) > 0 ? [1] : []

    content {
      description = "Prometheus scrapes of /metrics and /healthz"
      from_port   = local.subscriber_metrics_port
      to_port     = local.subscriber_metrics_port
      protocol    = "tcp"
      cidr_blocks = var.metrics_ingress_cidr_blocks
    }
  }

  tags = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_ecs_task_definition" "subscriber" {
  family                   = "${local.name}-subscriber"
  requires_compatibilities = ["EC2"]
  # awsvpc: each task gets its own ENI and security group.
  network_mode       = "awsvpc"
  cpu                = var.subscriber_cpu
  memory             = var.subscriber_memory
  execution_role_arn = aws_iam_role.execution["subscriber"].arn
  task_role_arn      = aws_iam_role.subscriber_task.arn

  container_definitions = jsonencode(concat([
    {
      name      = "subscriber"
      image     = var.subscriber_image
      essential = true

      # With a model server the subscriber only sends HTTP requests: the GPUs
      # are the sidecar's, or the endpoint's.
      resourceRequirements = local.model_server_on ? null : [
        { type = "GPU", value = tostring(var.subscriber_gpus_per_task) },
      ]

      environment = [for k, v in local.subscriber_environment : { name = k, value = v }]

      # The model server's key, read by ECS from Secrets Manager or SSM when
      # the task starts; never in the environment above, which is plain text
      # in the task definition and the state. Its name is the default of
      # -model-server-api-key-env.
      secrets = var.model_server_api_key_secret_arn == null ? null : [
        { name = "VRAMQ_MODEL_SERVER_API_KEY", valueFrom = var.model_server_api_key_secret_arn },
      ]

      # The subscriber checks the server's GET /v1/models at start and exits
      # if it does not answer, so it starts only once the sidecar's health
      # check passes. ECS reverses the order at shutdown ("When a dependency
      # is defined for container startup, for container shutdown it is
      # reversed", ECS API reference, ContainerDependency): the subscriber
      # finishes its batches against a live server before the server stops.
      dependsOn = local.model_server_sidecar ? [
        { containerName = local.model_server_container, condition = "HEALTHY" },
      ] : null

      # The shutdown grace plus the flush, so ECS does not SIGKILL a batch
      # the subscriber is still allowed to finish.
      stopTimeout = local.subscriber_stop_timeout

      portMappings = [
        { containerPort = local.subscriber_metrics_port, protocol = "tcp" },
      ]

      healthCheck = length(var.subscriber_health_check_command) == 0 ? null : {
        command  = var.subscriber_health_check_command
        interval = 30
        # The check gives /livez 5 s itself.
        timeout     = 6
        retries     = 3
        startPeriod = var.subscriber_health_check_start_period
      }

      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.subscriber.name
          awslogs-region        = local.region
          awslogs-stream-prefix = "subscriber"
          # Never block the subscriber on CloudWatch Logs.
          mode            = "non-blocking"
          max-buffer-size = "25m"
        }
      }
    },
    ], local.model_server_sidecar ? [
    {
      name      = local.model_server_container
      image     = var.model_server_image
      essential = true
      command   = length(var.model_server_command) == 0 ? null : var.model_server_command

      # ECS gives each GPU to one container: these are the server's, and its
      # share of their memory is its own setting (vLLM
      # --gpu-memory-utilization; docs/deployment.md works one through).
      resourceRequirements = [
        { type = "GPU", value = tostring(var.model_server_gpus) },
      ]

      environment = [for k in sort(keys(var.model_server_environment)) : { name = k, value = var.model_server_environment[k] }]
      secrets     = length(keys(var.model_server_secrets)) == 0 ? null : [for k in sort(keys(var.model_server_secrets)) : { name = k, valueFrom = var.model_server_secrets[k] }]

      # vLLM's processes exchange tensors through /dev/shm, 64 MiB in a
      # container by default: too little for them (vLLM's Docker guide runs
      # its image with --ipc=host, which awsvpc tasks cannot have, or a
      # larger --shm-size, which this is).
      linuxParameters = {
        sharedMemorySize = var.model_server_shared_memory_size
      }

      # The weights, kept on the instance across task restarts when
      # model_server_weights_volume says where.
      mountPoints = var.model_server_weights_volume == null ? null : [
        { sourceVolume = local.model_server_weights_volume, containerPath = var.model_server_weights_volume.container_path, readOnly = false },
      ]

      # HEALTHY is what the subscriber's dependsOn waits for, so the check
      # is always there. Failures in the start period (the weights' download
      # and load) do not count; after it, an unhealthy essential container
      # makes the task unhealthy and the service replaces it.
      healthCheck = {
        command     = local.model_server_health_check_command
        interval    = local.model_server_health_check_interval
        timeout     = 10
        retries     = local.model_server_health_check_retries
        startPeriod = var.model_server_health_check_start_period
      }
      # How long the subscriber waits for HEALTHY before the task stops
      # ("If a startTimeout value is specified for containerB and it doesn't
      # reach the desired status within that time then containerA gives up",
      # ECS API reference, ContainerDefinition startTimeout).
      startTimeout = local.model_server_start_timeout

      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.subscriber.name
          awslogs-region        = local.region
          awslogs-stream-prefix = local.model_server_container
          mode                  = "non-blocking"
          max-buffer-size       = "25m"
        }
      }
    },
  ] : []))

  dynamic "volume" {
    for_each = local.model_server_sidecar && var.model_server_weights_volume != null ? [var.model_server_weights_volume.host_path] : []

    content {
      name      = local.model_server_weights_volume
      host_path = volume.value
    }
  }

  tags = local.tags

  lifecycle {
    precondition {
      condition     = var.subscriber_shutdown_grace_seconds >= var.subscriber_inference_timeout_seconds
      error_message = "subscriber_shutdown_grace_seconds must be at least subscriber_inference_timeout_seconds: a batch that started just before SIGTERM may run that long."
    }
    precondition {
      condition     = var.subscriber_max_hold_seconds >= var.visibility_timeout_seconds
      error_message = "subscriber_max_hold_seconds must be at least visibility_timeout_seconds: the subscriber refuses a max hold below its visibility timeout and would exit at every start."
    }
    precondition {
      condition     = var.subscriber_inference_timeout_seconds < var.subscriber_max_hold_seconds
      error_message = "subscriber_inference_timeout_seconds must be below subscriber_max_hold_seconds: the subscriber refuses an inference timeout at or above its max hold and would exit at every start."
    }
    precondition {
      condition     = !(local.model_server_sidecar && local.model_server_external)
      error_message = "model_server_image and model_server_url: give one or the other (a sidecar in the task, or an endpoint elsewhere), not both."
    }
    precondition {
      condition     = !local.model_server_on || length(var.model_server_models) > 0
      error_message = "model_server_models: required with model_server_image or model_server_url (the subscriber's -model-server-models; it refuses to start without)."
    }
    precondition {
      condition     = local.model_server_sidecar || (length(var.model_server_command) == 0 && length(keys(var.model_server_environment)) == 0 && length(keys(var.model_server_secrets)) == 0 && length(var.model_server_health_check_command) == 0 && var.model_server_weights_volume == null)
      error_message = "model_server_command, model_server_environment, model_server_secrets, model_server_health_check_command and model_server_weights_volume configure the sidecar: give model_server_image too."
    }
    precondition {
      condition     = !local.model_server_sidecar || var.model_server_shared_memory_size < var.subscriber_memory
      error_message = "model_server_shared_memory_size: below subscriber_memory, the task's memory, which /dev/shm uses."
    }
    precondition {
      condition     = local.model_server_on || var.model_server_api_key_secret_arn == null
      error_message = "model_server_api_key_secret_arn: the key of a model server; give model_server_url or model_server_image too."
    }
    # ECS places a task only on an instance with the GPUs it asks for: with
    # fewer, the service never starts it and managed scaling may keep
    # launching instances that cannot take it.
    precondition {
      condition     = alltrue([for n in values(local.subscriber_instance_gpus) : n >= local.subscriber_task_gpus])
      error_message = "subscriber_instance_types: a task takes ${local.subscriber_task_gpus} GPUs (model_server_gpus with a sidecar, else subscriber_gpus_per_task), and these instance types have ${jsonencode(local.subscriber_instance_gpus)}: every type must have at least that many."
    }
    # An external model server does the inference: the subscriber only sends
    # HTTP, and a GPU instance per task would be paid for nothing (and grown
    # by messages parked in the queue while the server asks for a pause).
    precondition {
      condition     = !local.model_server_external || alltrue([for n in values(local.subscriber_instance_gpus) : n == 0])
      error_message = "model_server_url: subscriber_instance_types ${jsonencode(local.subscriber_instance_gpus)} have GPUs, which an external model server leaves unused: give instance types without (c7i.large, m7i.large) and the ECS-optimized AMI (not the GPU one) as subscriber_ami_id."
    }
    precondition {
      condition     = local.model_server_inference_timeout_ok
      error_message = "subscriber_inference_timeout_seconds: with a model server, at least ${local.model_server_inference_needs} s: ${local.model_server_max_output_tokens} output tokens (VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS, the subscriber's ceiling) at ${var.model_server_min_output_tokens_per_second} a second (model_server_min_output_tokens_per_second) after -model-server-max-wait (60 s); a generation that long would time out on every attempt. Lower the ceiling in subscriber_environment to what the jobs need, or raise the timeout (and subscriber_shutdown_grace_seconds, subscriber_max_hold_seconds with it)."
    }
    # cmd/subscriber refuses a -model-server-max-wait (default 1m) at or
    # above -inference-timeout: a batch waiting for the server must be handed
    # back, not timed out. One who sets the wait in subscriber_environment
    # answers for it.
    precondition {
      condition     = !local.model_server_on || var.subscriber_inference_timeout_seconds > 60 || contains(keys(var.subscriber_environment), "VRAMQ_MODEL_SERVER_MAX_WAIT")
      error_message = "subscriber_inference_timeout_seconds: above 60 with a model server (the subscriber's -model-server-max-wait, 1m, must be below it), or set VRAMQ_MODEL_SERVER_MAX_WAIT lower in subscriber_environment."
    }
  }
}

resource "aws_ecs_service" "subscriber" {
  name            = "subscriber"
  cluster         = aws_ecs_cluster.this.id
  task_definition = aws_ecs_task_definition.subscriber.arn
  desired_count   = var.subscriber_min_count

  capacity_provider_strategy {
    capacity_provider = aws_ecs_capacity_provider.gpu.name
    weight            = 1
  }

  # With it the provider updates a changed capacity provider (a replaced GPU
  # group) in place instead of replacing the service; every update of the
  # service is then also a deployment.
  force_new_deployment = true

  # Rebalancing stops running tasks in a crowded zone to start them in
  # another (ECS: "Balancing an Amazon ECS service across Availability
  # Zones"): for a GPU task that is a batch cut short and a cold start (a new
  # instance, a multi-GB image, a model load) for no gain, as every task
  # works the same queue wherever it runs. Left unset, the service takes
  # whatever ECS defaults to, which can be ENABLED.
  availability_zone_rebalancing = "DISABLED"

  network_configuration {
    subnets         = var.subnet_ids
    security_groups = [aws_security_group.subscriber_tasks.id]
  }

  # The deployment's shape (local.subscriber_deployment_*, sized with the
  # group's maximum), and a rollback if the new tasks never get healthy.
  deployment_minimum_healthy_percent = local.subscriber_deployment_minimum_healthy_percent
  deployment_maximum_percent         = local.subscriber_deployment_maximum_percent

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  propagate_tags = "SERVICE"

  tags = local.tags

  lifecycle {
    # Application Auto Scaling owns the count (autoscaling.tf).
    ignore_changes = [desired_count]

    precondition {
      condition     = var.subscriber_min_count <= var.subscriber_max_count
      error_message = "subscriber_min_count may not be above subscriber_max_count."
    }
  }

  depends_on = [aws_ecs_cluster_capacity_providers.this]
}
