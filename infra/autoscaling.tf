# The subscriber service scales on backlog per task, as AWS recommends for
# queue workers: target tracking on (messages on the work queue, visible and
# in flight) / (tasks the service wants), holding it at
# subscriber_backlog_per_task_target. Queue depth alone would not say whether
# the fleet keeps up; CPU says nothing about a GPU worker.
#
# In-flight messages count: a fleet that keeps up shows about 0 visible
# messages while every task holds a prefetch's worth, and visible messages
# alone would read that as no work and scale busy tasks in, to zero. With
# them, the metric is above 0 whenever messages wait anywhere, so target
# tracking (ceil(current x metric / target)) never asks for fewer than one
# task while there is work.
#
# The denominator is DesiredTaskCount, what the scaler itself sets, not
# RunningTaskCount: a new GPU task takes minutes to run (an instance to
# launch, a multi-GB image to pull, a model to load), longer than any sensible
# cooldown, and dividing by the tasks already running would keep asking for
# the same tasks again until they run (overshoot). With the desired count the
# policy sees its own decision at once.
#
# The metric math is plain arithmetic ("Using metric math", basic arithmetic
# functions): a data point that would divide by zero is dropped. So while no
# task is wanted the metric has no data point (not 0, not infinity), and
# target tracking leaves the count to the step policy below. Whether a value
# missing from one operand reads as 0 or drops the data point, the metric
# never reads 0 while messages wait (infra's tests try both readings). No IF(): the
# Application Auto Scaling guide on metric math promises the arithmetic
# operators, and this needs nothing else.
#
# From zero: target tracking multiplies the current count, so it cannot leave
# 0. A step policy does it instead, on an alarm for "visible messages and no
# task wanted" (the backlog-without-capacity signal of SageMaker asynchronous
# inference, KEDA's activation): 0 -> 1, then target tracking takes over.
#
# Scale-in stops tasks with SIGTERM: the subscriber stops receiving, hands
# back what it has not started at once and finishes running batches within
# its shutdown grace, which the task's stopTimeout covers (subscriber.tf).

locals {
  # The from-zero alarm: 2 of its last 3 one-minute data points. One data
  # point alone would fire on a minute whose task count CloudWatch has not
  # received yet (missing counts as 0 in the arithmetic; CloudWatch warns of
  # exactly this for FILL in alarms), and start a task next to a busy fleet.
  from_zero_period              = 60
  from_zero_evaluation_periods  = 3
  from_zero_datapoints_to_alarm = 2
  # CloudWatch re-invokes an Auto Scaling action every period the alarm stays
  # in ALARM ("Using Amazon CloudWatch alarms": "the alarm continues to invoke
  # the action for every period that the alarm remains in the new state"),
  # and the alarm stays there until the new desired count has reached
  # CloudWatch and filled enough data points: its evaluation window and a
  # couple of minutes of Container Insights delay. A step policy does not
  # add capacity again within its cooldown for the same adjustment
  # (StepScalingPolicyConfiguration, Cooldown), so a cooldown longer than
  # that makes one message start one GPU task, not two.
  from_zero_cooldown = 600
}

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
        id          = "in_flight"
        label       = "Messages on the work queue held by a consumer"
        return_data = false

        metric_stat {
          stat = "Average"

          metric {
            namespace   = "AWS/SQS"
            metric_name = "ApproximateNumberOfMessagesNotVisible"

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
        label = "Messages waiting or in flight per wanted subscriber task"
        # No data point while no task is wanted (a division by zero is
        # dropped): leaving zero is the step policy's job.
        expression  = "(visible + in_flight) / desired"
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
    # Not ExactCapacity: an alarm that misreads a minute (see
    # local.from_zero_datapoints_to_alarm) would set a scaled-out fleet back
    # to one task. One more task is the worst a +1 can do, and the cooldown
    # keeps the alarm's repeated invocations from adding a second.
    cooldown = local.from_zero_cooldown

    step_adjustment {
      metric_interval_lower_bound = 0
      scaling_adjustment          = 1
    }
  }
}

resource "aws_cloudwatch_metric_alarm" "subscriber_backlog_without_capacity" {
  alarm_name        = "${local.name}-subscriber-backlog-without-capacity"
  alarm_description = "Messages wait on ${aws_sqs_queue.work.name} and no subscriber task is wanted: starts the first one (scale from zero)."

  evaluation_periods  = local.from_zero_evaluation_periods
  datapoints_to_alarm = local.from_zero_datapoints_to_alarm
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  # No data is no backlog (SQS stops reporting an idle queue).
  treat_missing_data = "notBreaching"

  metric_query {
    id = "backlog_without_capacity"
    # visible x (1 - desired) is the visible messages while no task is
    # wanted, and 0 or less once one is (desired, a Maximum of a task count,
    # is then at least 1). A service that never ran, or whose count has not
    # reached CloudWatch yet, has no desired data point: FILL reads that as
    # 0 rather than leaving it to how arithmetic treats a missing operand.
    expression  = "visible * (1 - FILL(desired, 0))"
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
      period      = local.from_zero_period
    }
  }

  metric_query {
    id = "desired"

    metric {
      namespace   = "ECS/ContainerInsights"
      metric_name = "DesiredTaskCount"
      dimensions  = { ClusterName = aws_ecs_cluster.this.name, ServiceName = aws_ecs_service.subscriber.name }
      stat        = "Maximum"
      period      = local.from_zero_period
    }
  }

  alarm_actions = [aws_appautoscaling_policy.subscriber_from_zero.arn]

  tags = local.tags
}
