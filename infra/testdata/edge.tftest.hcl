# Real Terraform plans and applies the edge (edge.tf) against a mocked AWS
# provider: TestTheEdgeApplies copies it into the workspace's copy of the
# module as tests/. It catches what this package's evaluator cannot: a cycle
# between the function (which is told the edge's origin) and the edge (which
# fronts the function's API), and the precondition firing in a real plan.

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

run "edge_with_keys" {
  command = apply
  variables {
    publisher_edge                = true
    publisher_api_keys_secret_arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:keys-AbCdEf"
  }
  assert {
    condition     = aws_lambda_function.publisher[0].environment[0].variables["VRAMQ_PUBLIC_URL"] == "https://${aws_cloudfront_distribution.publisher[0].domain_name}"
    error_message = "the function is not told the edge's origin"
  }
  assert {
    condition     = output.api_url == "https://${aws_cloudfront_distribution.publisher[0].domain_name}"
    error_message = "api_url is not the edge's URL"
  }
  assert {
    condition     = one([for b in aws_cloudfront_distribution.publisher[0].ordered_cache_behavior : b.target_origin_id if b.path_pattern == "/files/*"]) == "payloads"
    error_message = "the edge does not send /files/* to the bucket"
  }
}

run "no_edge_by_default" {
  command = apply
  variables {
    publisher_api_keys_secret_arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:keys-AbCdEf"
  }
  assert {
    condition     = length(aws_cloudfront_distribution.publisher) == 0 && !contains(keys(aws_lambda_function.publisher[0].environment[0].variables), "VRAMQ_PUBLIC_URL")
    error_message = "an edge without publisher_edge"
  }
}

run "edge_refuses_sigv4" {
  command = plan
  variables {
    publisher_edge = true
  }
  expect_failures = [aws_cloudfront_distribution.publisher]
}
