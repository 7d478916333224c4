// Package jobq moves work and results over SQS for the tools around the
// pipeline: the load generator, the demo and the end-to-end tests. It sends
// work messages, collects result messages (de-duplicating them by job and
// chunk, as any consumer of at-least-once delivery must), and reads queues.
package jobq

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/internal/batcher"
	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/job"
)

// Send puts works on the queue at url, up to ten per SendMessageBatch and no
// more than job.MaxBatchBytes in one call (large messages go fewer to a call),
// with the job id and chunk in message attributes. An entry SQS reports as
// failed is an error: these are tools, not the publisher, and must not hide a
// loss.
func Send(ctx context.Context, client *sqs.Client, url string, works []job.Work) error {
	msgs := make([]sqscodec.Message, len(works))
	for i, w := range works {
		body, err := json.Marshal(w)
		if err != nil {
			return err
		}
		// Escaped as the publisher sends work: ids with characters SQS
		// refuses raw still go.
		msgs[i] = sqscodec.Message{Body: string(job.EncodeForSQS(body)), Attributes: job.Attributes(w.Key())}
	}
	size := func(m sqscodec.Message) int { return job.MessageSize(m.Body, m.Attributes) }
	for _, call := range batcher.Split(msgs, size, batcher.Options{MaxItems: job.MaxBatch, MaxBytes: job.MaxBatchBytes}) {
		out, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: sqscodec.Entries(call)})
		if err != nil {
			return fmt.Errorf("sending work: %w", err)
		}
		if len(out.Failed) > 0 {
			f := out.Failed[0]
			return fmt.Errorf("sending work: %d entries failed, first %s: %s", len(out.Failed), aws.ToString(f.Code), aws.ToString(f.Message))
		}
	}
	return nil
}

// Collector reads result messages and keeps one per (job_id, chunk).
type Collector struct {
	Results    map[job.Key]job.Result
	Duplicates int // result messages for a chunk already seen
	Messages   int // result messages read in all
	// Visibility, when set, is the visibility timeout in seconds of each
	// receive, so that results a lost receive answer took come back that
	// soon rather than after the queue's default.
	Visibility int32
}

func NewCollector() *Collector { return &Collector{Results: map[job.Key]job.Result{}} }

// Poll receives one batch of results from url (waiting up to wait seconds),
// records them and deletes them. It returns how many messages it read.
func (c *Collector) Poll(ctx context.Context, client *sqs.Client, url string, wait int32) (int, error) {
	out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl: &url, MaxNumberOfMessages: job.MaxBatch, WaitTimeSeconds: wait, VisibilityTimeout: c.Visibility,
	})
	if err != nil {
		return 0, fmt.Errorf("receiving results: %w", err)
	}
	var del []string
	for _, m := range out.Messages {
		var r job.Result
		if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &r); err != nil {
			return 0, fmt.Errorf("result message %s is not a result: %w", aws.ToString(m.MessageId), err)
		}
		c.Messages++
		if _, seen := c.Results[r.Key()]; seen {
			c.Duplicates++
		} else {
			c.Results[r.Key()] = r
		}
		del = append(del, aws.ToString(m.ReceiptHandle))
	}
	if len(del) > 0 {
		d, err := client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &url, Entries: sqscodec.DeleteEntries(del)})
		if err != nil {
			return 0, fmt.Errorf("deleting results: %w", err)
		}
		if len(d.Failed) > 0 {
			return 0, fmt.Errorf("deleting results: %d failed", len(d.Failed))
		}
	}
	return len(out.Messages), nil
}

// DeadLetter is a message found in the DLQ.
type DeadLetter struct {
	Body   string
	Reason string
	Attrs  map[string]string
}

// DrainDLQ receives and deletes every message visible on the DLQ at url.
func DrainDLQ(ctx context.Context, client *sqs.Client, url string) ([]DeadLetter, error) {
	var out []DeadLetter
	for {
		r, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: job.MaxBatch, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{"All"}})
		if err != nil {
			return out, fmt.Errorf("receiving dead letters: %w", err)
		}
		if len(r.Messages) == 0 {
			return out, nil
		}
		for _, m := range r.Messages {
			d := DeadLetter{Body: aws.ToString(m.Body), Attrs: sqscodec.Strings(m.MessageAttributes)}
			if d.Attrs == nil {
				d.Attrs = map[string]string{}
			}
			d.Reason = d.Attrs[job.AttrReason]
			out = append(out, d)
			if _, err := client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: &url, ReceiptHandle: m.ReceiptHandle}); err != nil {
				return out, fmt.Errorf("deleting a dead letter: %w", err)
			}
		}
	}
}

// Counts reads a queue's approximate visible and in-flight (not visible)
// message counts.
func Counts(ctx context.Context, client *sqs.Client, url string) (visible, inflight int, err error) {
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		return 0, 0, err
	}
	visible, _ = strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	inflight, _ = strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return visible, inflight, nil
}
