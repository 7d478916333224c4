package jobq

import (
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
)

// Ten messages of 150 KiB are 1.5 MiB: more than one SendMessageBatch may
// carry (SQS refuses the call whole, BatchRequestTooLong), so Send splits
// them by size and every message arrives. A 1-in-2 mix of large messages in
// the benchmarks crashed on this before.
func TestSendSplitsBatchesBySize(t *testing.T) {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	works := make([]job.Work, 10)
	for i := range works {
		works[i] = job.Work{V: job.Version, JobID: "sendsplit", Chunk: i, Chunks: len(works),
			Items: []job.Item{{ID: "a", Text: strings.Repeat("w ", 75<<10)}}}
	}
	if err := Send(t.Context(), client, urls.Work, works); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for deadline := time.Now().Add(30 * time.Second); len(seen) < len(works) && time.Now().Before(deadline); {
		out, err := client.ReceiveMessage(t.Context(),
			&sqs.ReceiveMessageInput{QueueUrl: &urls.Work, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			seen[aws.ToString(m.MessageId)] = true
		}
	}
	if len(seen) != len(works) {
		t.Errorf("%d of %d messages arrived", len(seen), len(works))
	}
}
