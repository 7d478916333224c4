package publishertest

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/job"
)

// Received is a work message taken off the queue.
type Received struct {
	Work  *job.Work
	Attrs map[string]string
}

// Drain receives the messages on the work queue workURL until it has want
// new ones and a receive brings nothing new, or 20 s pass. Messages are told
// apart by message id, across the calls given one seen: a receive retried
// by the SDK after its response was lost strands the messages of the lost
// attempt until their visibility ends (see docs/reliability.md), so they
// are kept invisible for only 2 s and, when they come back, are not counted
// twice. Two sends of one chunk are two message ids, and are both counted.
func Drain(t testing.TB, client *sqs.Client, workURL string, seen map[string]bool, want int) []Received {
	t.Helper()
	var out []Received
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		r, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &workURL, MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, VisibilityTimeout: 2, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		fresh := 0
		for _, m := range r.Messages {
			if seen[aws.ToString(m.MessageId)] {
				continue
			}
			seen[aws.ToString(m.MessageId)] = true
			fresh++
			w, err := job.DecodeWork([]byte(aws.ToString(m.Body)))
			if err != nil {
				t.Fatalf("message on the work queue: %v", err)
			}
			attrs := map[string]string{}
			for k, v := range m.MessageAttributes {
				attrs[k] = aws.ToString(v.StringValue)
			}
			out = append(out, Received{w, attrs})
		}
		if fresh == 0 && len(out) >= want {
			return out
		}
	}
	return out
}
