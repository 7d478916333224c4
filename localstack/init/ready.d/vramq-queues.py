"""LocalStack READY hook: create the vramq queues from queues.json.

LocalStack exec()s this file inside its own Python, which has boto3; it can also
run on its own (python3 vramq-queues.py) against any endpoint, which is how the
Go tests keep it in step with localstack.Create. It does what Create does, in
the same order and with the same JSON encodings, so either one finds the
other's queues equal:

  1. each queue in the order dlq, work, results, with its attributes and, for
     the work queue, a RedrivePolicy naming the DLQ's ARN;
  2. then the DLQ's RedriveAllowPolicy, which needs the work queue's ARN, if the
     DLQ has none yet.

Environment:
  VRAMQ_QUEUES_FILE   the definitions (default: where docker-compose.yml mounts them)
  VRAMQ_QUEUE_PREFIX  put in front of every name (default: none)
  AWS_ENDPOINT_URL    default http://localhost:4566, LocalStack inside its container
  AWS_REGION, AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
                      defaults us-east-1 and test/test; LocalStack 4 wants some
                      credentials even though it ignores them

There is no `if __name__ == "__main__"`: under LocalStack's exec() the name is
not "__main__", and the file must run in both places.
"""

import json
import os

import boto3

QUEUES_FILE = os.environ.get("VRAMQ_QUEUES_FILE", "/etc/localstack/vramq/queues.json")

# Redrive targets first; localstack.Create uses the same order.
CREATION_ORDER = ["dlq", "work", "results"]


def compact(value):
    # Go's encoding/json output: no spaces, keys in the order written.
    return json.dumps(value, separators=(",", ":"))


def create_queues():
    with open(QUEUES_FILE, encoding="utf-8") as f:
        queues = json.load(f)["queues"]
    prefix = os.environ.get("VRAMQ_QUEUE_PREFIX", "")
    env = os.environ.get
    sqs = boto3.client(
        "sqs",
        endpoint_url=env("AWS_ENDPOINT_URL") or "http://localhost:4566",
        region_name=env("AWS_REGION") or env("AWS_DEFAULT_REGION") or "us-east-1",
        aws_access_key_id=env("AWS_ACCESS_KEY_ID") or "test",
        aws_secret_access_key=env("AWS_SECRET_ACCESS_KEY") or "test",
    )

    urls, arns, current = {}, {}, {}
    for role in CREATION_ORDER:
        q = queues[role]
        attributes = dict(q.get("attributes", {}))
        redrive = q.get("redrivePolicy")
        if redrive:
            attributes["RedrivePolicy"] = compact(
                {
                    "deadLetterTargetArn": arns[redrive["deadLetterQueue"]],
                    "maxReceiveCount": redrive["maxReceiveCount"],
                }
            )
        name = prefix + q["name"]
        url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        urls[role], arns[role], current[role] = url, got["QueueArn"], got
        print(f"vramq: queue {name}: {url}")

    for role in CREATION_ORDER:
        allow = queues[role].get("redriveAllowPolicy")
        if not allow or "RedriveAllowPolicy" in current[role]:
            continue
        policy = {"redrivePermission": allow["redrivePermission"]}
        if allow.get("sourceQueues"):
            policy["sourceQueueArns"] = [arns[r] for r in allow["sourceQueues"]]
        sqs.set_queue_attributes(QueueUrl=urls[role], Attributes={"RedriveAllowPolicy": compact(policy)})


create_queues()
