# The subscriber service scales on backlog per task, as AWS recommends for
# queue workers: target tracking on (visible messages on the work queue) /
# (running tasks), holding it at subscriber_backlog_per_task_target. Queue
# depth alone would not say whether the fleet keeps up; CPU says nothing about
# a GPU worker.
#
# Scale-in never kills a task mid-inference: the subscriber sets ECS task
# scale-in protection (through the agent's $ECS_AGENT_URI/task-protection/v1
# endpoint) while it holds messages and clears it when idle, and the
# capacity provider's managed termination protection keeps instances with
# tasks. Messages already received (in flight) are not in the numerator on
# purpose: the tasks holding them are busy with them and protected.

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
        id          = "tasks"
        label       = "Running subscriber tasks"
        return_data = false

        metric_stat {
          stat = "Average"

          metric {
            namespace   = "ECS/ContainerInsights"
            metric_name = "RunningTaskCount"

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
        label = "Visible messages per running subscriber task"
        # The plain ratio AWS documents for SQS workers. It is undefined with
        # no task running, which is why subscriber_min_count is at least 1.
        expression  = "visible / tasks"
        return_data = true
      }
    }
  }
}
