# The subscriber service scales on backlog per task, as AWS recommends for
# queue workers: target tracking on (visible messages on the work queue) /
# (tasks the service wants), holding it at subscriber_backlog_per_task_target.
# Queue depth alone would not say whether the fleet keeps up; CPU says nothing
# about a GPU worker.
#
# The denominator is DesiredTaskCount, what the scaler itself sets, not
# RunningTaskCount: a new GPU task takes minutes to run (an instance to
# launch, a multi-GB image to pull, a model to load), longer than any sensible
# cooldown, and dividing by the tasks already running would keep asking for
# the same tasks again until they run (overshoot). With the desired count the
# policy sees its own decision at once.
#
# From zero: target tracking multiplies the current count, so it cannot leave
# 0. A step policy does it instead, on an alarm for "visible messages and no
# task wanted" (the backlog-without-capacity signal of SageMaker asynchronous
# inference, KEDA's activation): 0 -> 1, then target tracking takes over.
#
# Scale-in stops tasks with SIGTERM: the subscriber stops receiving, hands
# back what it has not started at once and finishes running batches within
# its shutdown grace, which the task's stopTimeout covers (subscriber.tf).

resource "aws_appautoscaling_target" "subscriber" {
  service_namespace  = "ecs"
  scalable_dimension = "ecs:service:DesiredCount"
  resource_id        = "service/${aws_ecs_cluster.this.name}/${aws_ecs_service.subscriber.name}"
  min_capacity       = var.subscriber_min_count
  max_capacity       = var.subscriber_max_count

  tags = local.tags
}

resource "aws_appautoscaling_policy" "subscriber_backlog_per_task" {
  name               = "${local.name}-subscriber-backlog-per-task"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.subscriber.service_namespace
  scalable_dimension = aws_appautoscaling_target.subscriber.scalable_dimension
  resource_id        = aws_appautoscaling_target.subscriber.resource_id

  target_tracking_scaling_policy_configuration {
    target_value       = var.subscriber_backlog_per_task_target
    scale_out_cooldown = var.subscriber_scale_out_cooldown
    scale_in_cooldown  = var.subscriber_scale_in_cooldown

    customized_metric_specification {
      metrics {
        id          = "visible"
        label       = "Visible messages on the work queue"
        return_data = false

        metric_stat {
          stat = "Average"

          metric {
            namespace   = "AWS/SQS"
            metric_name = "ApproximateNumberOfMessagesVisible"

            dimensions {
              name  = "QueueName"
              value = aws_sqs_queue.work.name
            }
          }
        }
      }

      metrics {
        id          = "desired"
        label       = "Subscriber tasks wanted"
        return_data = false

        metric_stat {
          stat = "Average"

          metric {
            namespace   = "ECS/ContainerInsights"
            metric_name = "DesiredTaskCount"

            dimensions {
              name  = "ClusterName"
              value = aws_ecs_cluster.this.name
            }

            dimensions {
              name  = "ServiceName"
              value = aws_ecs_service.subscriber.name
            }
          }
        }
      }

      metrics {
        id    = "backlog_per_task"
        label = "Visible messages per wanted subscriber task"
        # 0 while no task is wanted: leaving zero is the step policy's job.
        expression  = "IF(desired > 0, visible / desired, 0)"
        return_data = true
      }
    }
  }
}

resource "aws_appautoscaling_policy" "subscriber_from_zero" {
  name               = "${local.name}-subscriber-from-zero"
  policy_type        = "StepScaling"
  service_namespace  = aws_appautoscaling_target.subscriber.service_namespace
  scalable_dimension = aws_appautoscaling_target.subscriber.scalable_dimension
  resource_id        = aws_appautoscaling_target.subscriber.resource_id

  step_scaling_policy_configuration {
    adjustment_type         = "ChangeInCapacity"
    metric_aggregation_type = "Maximum"
    # Until the first task is wanted the alarm stays in ALARM; it is not
    # re-run meanwhile.
    cooldown = 60

    step_adjustment {
      metric_interval_lower_bound = 0
      scaling_adjustment          = 1
    }
  }
}

resource "aws_cloudwatch_metric_alarm" "subscriber_backlog_without_capacity" {
  alarm_name        = "${local.name}-subscriber-backlog-without-capacity"
  alarm_description = "Messages wait on ${aws_sqs_queue.work.name} and no subscriber task is wanted: starts the first one (scale from zero)."

  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  # No data is no backlog (SQS stops reporting an idle queue).
  treat_missing_data = "notBreaching"

  metric_query {
    id = "backlog_without_capacity"
    # Missing task counts (a service that never ran) count as none wanted.
    expression  = "IF(FILL(desired, 0) < 1, visible, 0)"
    label       = "Visible messages while no subscriber task is wanted"
    return_data = true
  }

  metric_query {
    id = "visible"

    metric {
      namespace   = "AWS/SQS"
      metric_name = "ApproximateNumberOfMessagesVisible"
      dimensions  = { QueueName = aws_sqs_queue.work.name }
      stat        = "Maximum"
      period      = 60
    }
  }

  metric_query {
    id = "desired"

    metric {
      namespace   = "ECS/ContainerInsights"
      metric_name = "DesiredTaskCount"
      dimensions  = { ClusterName = aws_ecs_cluster.this.name, ServiceName = aws_ecs_service.subscriber.name }
      stat        = "Maximum"
      period      = 60
    }
  }

  alarm_actions = [aws_appautoscaling_policy.subscriber_from_zero.arn]

  tags = local.tags
}
