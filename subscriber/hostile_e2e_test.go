package subscriber_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber"
)

// What anyone who can send to the work queue can send, through the real SQS
// and S3 APIs of the endpoint under test (issue 14): every message ends as a
// result or a dead letter with its reason, never in a loop of retries.
//   - item 3: an item id SQS cannot carry raw (an emoji, U+FFFE, U+FFFF)
//     gets its result, with the same id;
//   - item 1: a claim-check reference to another job's object, with that
//     object's true size and SHA-256 and the same item id, is refused with
//     a reason that says nothing about the object;
//   - items 2 and 10: a job id outside the grammar, an item without
//     content, are malformed;
//   - item 6: a dead letter that does not fit in the DLQ's messages with its
//     reason goes all the same, its body cut.
func TestE2EHostileMessages(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	store := newStore(t)
	const limit = 4 << 10
	p := newPipeline(t, 3, subscriber.Config{Payloads: store, MaxMessageBytes: limit}, nil)
	// The DLQ takes no more than the subscriber is told, as a queue set up
	// with a smaller MaximumMessageSize would.
	if _, err := p.client.SetQueueAttributes(t.Context(), &sqs.SetQueueAttributesInput{QueueUrl: &p.urls.DLQ,
		Attributes: map[string]string{"MaximumMessageSize": strconv.Itoa(limit)}}); err != nil {
		t.Fatal(err)
	}
	odd := "emoji 😀 \uFFFE\uFFFF"
	victim := putItem(t, store, job.ItemKey("victim", "doc"), job.Item{ID: "doc", Text: "the victim's text"})
	p.send([]job.Work{
		{V: 1, JobID: "odd", Items: []job.Item{{ID: odd, Text: "some text"}}},
		{V: 1, JobID: "thief", Items: []job.Item{victim}},
		{V: 1, JobID: "dots..", Items: []job.Item{{ID: "a", Text: "x"}}},
		{V: 1, JobID: "empty", Items: []job.Item{{ID: "a"}}},
	})
	big := `{"v":1,"job_id":"big","chunk":0,"items":[],"pad":"` + strings.Repeat("x", limit-100) + `"}`
	if _, err := p.client.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: &p.urls.Work, MessageBody: aws.String(big),
		MessageAttributes: map[string]types.MessageAttributeValue{
			"note": {DataType: aws.String("String"), StringValue: aws.String(strings.Repeat("n", 150))}}}); err != nil {
		t.Fatal(err)
	}
	c := p.collect(1, time.Minute)
	dead := p.waitDeadLetters(4)
	p.shutdown()

	if r := c.Results[job.Key{JobID: "odd"}]; len(r.Outputs) != 1 || r.Outputs[0].ID != odd {
		t.Errorf("result of the odd id: %+v", r)
	}
	reasons := map[string]string{}
	for _, d := range dead {
		var b struct {
			JobID string `json:"job_id"`
		}
		_ = json.Unmarshal([]byte(d.Body), &b)
		if d.Attrs[subscriber.AttrBodyTruncated] != "" {
			b.JobID = "big"
			if d.Attrs[subscriber.AttrBodyTruncated] != strconv.Itoa(len(big)) || !strings.HasPrefix(big, d.Body) {
				t.Errorf("cut copy: %d bytes, %s=%q", len(d.Body), subscriber.AttrBodyTruncated, d.Attrs[subscriber.AttrBodyTruncated])
			}
		}
		reasons[b.JobID] = d.Reason
	}
	for jobID, want := range map[string]string{
		"thief":  `claim_check: item "doc": the reference does not name this item's object in the payload bucket`,
		"dots..": "malformed: malformed message: job_id: id has characters outside its grammar: byte 4 is not a letter, digit, '-' or '_'",
		"empty":  `malformed: item 0: malformed message: item "a": item has neither text nor data`,
		"big":    "malformed: malformed message: json: unknown field \"pad\"",
	} {
		if got := reasons[jobID]; !strings.HasPrefix(got, want) {
			t.Errorf("%s: reason %q, want %q", jobID, got, want)
		}
	}
	if len(dead) != 4 {
		t.Errorf("%d dead letters, want 4: %q", len(dead), reasons)
	}
	if _, err := store.Read(t.Context(), job.ResultKey("thief", 0)); err == nil {
		t.Error("the thief's chunk has a result")
	}
}
