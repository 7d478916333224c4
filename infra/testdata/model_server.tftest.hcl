# Real Terraform, not this package's evaluator, plans and applies the
# module's model server modes against a mocked AWS provider (no account, no
# network): TestTheModelServerModesApply copies it into the workspace's
# copy of the module as tests/. The mock's ARNs satisfy the provider's
# checks of the arguments built from them.

mock_provider "aws" {
  mock_data "aws_caller_identity" { defaults = { account_id = "111122223333" } }
  mock_data "aws_partition" { defaults = { partition = "aws" } }
  mock_data "aws_region" { defaults = { name = "us-east-1" } }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::111122223333:role/x" }
  }
  mock_resource "aws_cloudwatch_log_group" {
    defaults = { arn = "arn:aws:logs:us-east-1:111122223333:log-group:x" }
  }
  mock_resource "aws_iam_instance_profile" {
    defaults = { arn = "arn:aws:iam::111122223333:instance-profile/x" }
  }
  mock_resource "aws_sqs_queue" {
    defaults = { arn = "arn:aws:sqs:us-east-1:111122223333:x" }
  }
  mock_resource "aws_s3_bucket" {
    defaults = { arn = "arn:aws:s3:::x" }
  }
  mock_resource "aws_lambda_function" {
    defaults = { arn = "arn:aws:lambda:us-east-1:111122223333:function:x" }
  }
  mock_resource "aws_ecs_cluster" {
    defaults = { arn = "arn:aws:ecs:us-east-1:111122223333:cluster/x" }
  }
  mock_resource "aws_autoscaling_group" {
    defaults = { arn = "arn:aws:autoscaling:us-east-1:111122223333:autoScalingGroup:x:autoScalingGroupName/x" }
  }
  mock_resource "aws_ecs_task_definition" {
    defaults = { arn = "arn:aws:ecs:us-east-1:111122223333:task-definition/x:1" }
  }
  mock_resource "aws_sns_topic" {
    defaults = { arn = "arn:aws:sns:us-east-1:111122223333:x" }
  }
  mock_resource "aws_appautoscaling_policy" {
    defaults = { arn = "arn:aws:autoscaling:us-east-1:111122223333:scalingPolicy:x:resource/ecs/service/x/y:policyName/z" }
  }
  mock_resource "aws_apigatewayv2_api" {
    defaults = { arn = "arn:aws:apigateway:us-east-1::/apis/x", execution_arn = "arn:aws:execute-api:us-east-1:111122223333:x" }
  }
  mock_resource "aws_cloudwatch_event_rule" {
    defaults = { arn = "arn:aws:events:us-east-1:111122223333:rule/x" }
  }
  mock_data "aws_iam_policy_document" { defaults = { json = "{}" } }
  # One GPU per instance type, as the default g5.xlarge and g6.xlarge have.
  mock_data "aws_ec2_instance_type" {
    defaults = { gpus = [{ count = 1, manufacturer = "NVIDIA", memory_size = 24576, name = "A10G" }] }
  }
}

variables {
  vpc_id               = "vpc-1"
  subnet_ids           = ["subnet-1"]
  subscriber_image     = "111122223333.dkr.ecr.us-east-1.amazonaws.com/vramq:v1"
  subscriber_ami_id    = "ami-0123456789abcdef0"
  publisher_lambda_zip = "main.tf"
  # Provider 5.x, which the mirror may hold, refuses larger queues.
  max_message_size = 262144
}

run "sidecar" {
  command = apply
  variables {
    model_server_image              = "111122223333.dkr.ecr.us-east-1.amazonaws.com/vllm:v1"
    model_server_command            = ["--model", "m"]
    model_server_models             = ["m"]
    model_server_secrets            = { HF_TOKEN = "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-AbCdEf" }
    model_server_api_key_secret_arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:k-AbCdEf"
    model_server_weights_volume     = { host_path = "/var/lib/vramq/weights", container_path = "/root/.cache/huggingface" }
    subscriber_environment          = { VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS = "1024" }
  }
  assert {
    condition     = length(jsondecode(aws_ecs_task_definition.subscriber.container_definitions)) == 2
    error_message = "with model_server_image the task has not two containers"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.subscriber.container_definitions)[0].dependsOn[0].condition == "HEALTHY"
    error_message = "the subscriber does not wait for the sidecar HEALTHY"
  }
  assert {
    condition     = length(local.ecr_repository_arns["subscriber"]) == 2
    error_message = "the execution role may not pull both images"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.subscriber.container_definitions)[1].healthCheck.startPeriod == 300
    error_message = "the sidecar has no health check with the start period"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.subscriber.container_definitions)[0].resourceRequirements == null
    error_message = "the subscriber takes a GPU beside the sidecar"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.subscriber.container_definitions)[1].linuxParameters.sharedMemorySize == 4096
    error_message = "the sidecar has no /dev/shm of model_server_shared_memory_size"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.subscriber.container_definitions)[1].mountPoints[0].containerPath == "/root/.cache/huggingface" && one([for v in aws_ecs_task_definition.subscriber.volume : v.host_path if v.name == jsondecode(aws_ecs_task_definition.subscriber.container_definitions)[1].mountPoints[0].sourceVolume]) == "/var/lib/vramq/weights"
    error_message = "the weights volume is not the instance's directory mounted in the sidecar"
  }
}

# Issue 34 item 12: ECS places a task only where its GPUs are.
run "sidecar_on_too_few_gpus" {
  command = plan
  variables {
    model_server_image     = "111122223333.dkr.ecr.us-east-1.amazonaws.com/vllm:v1"
    model_server_models    = ["m"]
    model_server_gpus      = 2
    subscriber_environment = { VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS = "1024" }
  }
  expect_failures = [aws_ecs_task_definition.subscriber]
}

# An external server leaves GPUs unused: GPU instance types are refused.
run "external_on_gpu_instances" {
  command = plan
  variables {
    model_server_url       = "https://api.openai.com"
    model_server_models    = ["m"]
    subscriber_environment = { VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS = "1024" }
  }
  expect_failures = [aws_ecs_task_definition.subscriber]
}

# At the subscriber's default ceiling of 16,384 output tokens a generation
# outlasts the default 120 s inference timeout.
run "sidecar_with_the_default_ceiling" {
  command = plan
  variables {
    model_server_image  = "111122223333.dkr.ecr.us-east-1.amazonaws.com/vllm:v1"
    model_server_models = ["m"]
  }
  expect_failures = [aws_ecs_task_definition.subscriber]
}

run "external" {
  command = apply
  variables {
    model_server_url                = "http://vllm.internal:8000"
    model_server_models             = ["m"]
    model_server_api_key_secret_arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:k-AbCdEf"
    subscriber_instance_types       = ["c7i.large", "m7i.large"]
    subscriber_environment          = { VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS = "1024" }
  }
  override_data {
    target = data.aws_ec2_instance_type.subscriber
    values = { gpus = [] }
  }
  assert {
    condition     = local.model_server_url_port == 8000
    error_message = "the external endpoint's port is not 8000"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "ECS_ENABLE_GPU_SUPPORT=false")
    error_message = "the instances of an external model server's tasks still enable GPU support"
  }
}

run "both" {
  command = plan
  variables {
    model_server_url    = "https://api.openai.com"
    model_server_image  = "x"
    model_server_models = ["m"]
  }
  expect_failures = [aws_ecs_task_definition.subscriber]
}

run "none" {
  command = apply
  assert {
    condition     = length(jsondecode(aws_ecs_task_definition.subscriber.container_definitions)) == 1
    error_message = "without a model server the task has not one container"
  }
}
