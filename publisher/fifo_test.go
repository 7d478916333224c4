package publisher_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
)

// On a FIFO work queue every chunk of a job shares the job's message group
// (so SQS hands them out in order) and carries a deduplication id of its own
// (so a publisher retry within SQS's five-minute window is dropped by SQS).
func TestFIFOQueue(t *testing.T) {
	client := sqstest.Client(t)
	name := fmt.Sprintf("vramq-fifo-%d.fifo", time.Now().UnixNano())
	out, err := client.CreateQueue(t.Context(), &sqs.CreateQueueInput{QueueName: &name,
		Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		t.Fatalf("creating a FIFO queue: %v", err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() { _, _ = client.DeleteQueue(t.Context(), &sqs.DeleteQueueInput{QueueUrl: &url}) })

	limits, err := jobs.QueueLimits(t.Context(), client, url)
	if err != nil {
		t.Fatal(err)
	}
	if !limits.FIFO {
		t.Fatalf("QueueLimits(%s) did not see a FIFO queue", name)
	}
	p, err := publisher.New(publisher.Config{
		Queue: jobs.NewSQSQueue(client, url),
		Jobs:  publisher.Jobs{MaxMessageBytes: limits.MaxMessageBytes, ChunkItems: 2},
		API: publisher.API{
			Logger:     testLogger(),
			Registerer: prometheus.NewRegistry(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()

	var items []map[string]string
	for i := range 9 {
		items = append(items, map[string]string{"id": fmt.Sprintf("i%d", i), "text": fmt.Sprintf("text %d", i)})
	}
	body, _ := json.Marshal(map[string]any{"items": items})
	resp, err := http.Post(srv.URL+"/v1/jobs", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var a struct {
		JobID  string `json:"job_id"`
		Chunks int    `json:"chunks"`
	}
	err = json.NewDecoder(resp.Body).Decode(&a)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusAccepted || a.Chunks != 5 {
		t.Fatalf("POST: %d %+v %v", resp.StatusCode, a, err)
	}

	// One message group hands out one message at a time, in order.
	var chunks []int
	for deadline := time.Now().Add(30 * time.Second); len(chunks) < a.Chunks && time.Now().Before(deadline); {
		r, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageGroupId,
				types.MessageSystemAttributeNameMessageDeduplicationId}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range r.Messages {
			w, err := job.DecodeWork([]byte(aws.ToString(m.Body)))
			if err != nil {
				t.Fatal(err)
			}
			if g := m.Attributes["MessageGroupId"]; g != a.JobID {
				t.Errorf("chunk %d in message group %q, want the job id %q", w.Chunk, g, a.JobID)
			}
			if d, want := m.Attributes["MessageDeduplicationId"], a.JobID+"-"+strconv.Itoa(w.Chunk); d != want {
				t.Errorf("chunk %d deduplication id %q, want %q", w.Chunk, d, want)
			}
			chunks = append(chunks, w.Chunk)
			if _, err := client.DeleteMessage(t.Context(), &sqs.DeleteMessageInput{QueueUrl: &url, ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, c := range chunks {
		if c != i {
			t.Fatalf("chunks received in order %v, want 0..%d", chunks, a.Chunks-1)
		}
	}
	if len(chunks) != a.Chunks {
		t.Errorf("received %d of %d chunks", len(chunks), a.Chunks)
	}
}
