// Package sqsqueue is the subscriber's queue on Amazon SQS, through the
// SDK's client, with SQS's answers classified (queue.Error).
package sqsqueue

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// Queue is a queue.Queue and a queue.Sender on one SQS queue. Retries are
// the SDK client's own; configure them on the client. Safe for concurrent
// use.
type Queue struct {
	client *sqs.Client
	url    string
	fifo   bool // its name ends in .fifo: no per-message delay, a deduplication id on every send
}

var (
	_ queue.Queue  = (*Queue)(nil)
	_ queue.Sender = (*Queue)(nil)
)

// New returns the queue at url, reached through client.
func New(client *sqs.Client, url string) *Queue {
	return &Queue{client: client, url: url, fifo: strings.HasSuffix(url, ".fifo")}
}

func (q *Queue) Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]queue.Message, error) {
	out, err := q.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:              &q.url,
		MaxNumberOfMessages:   int32(min(max, job.MaxBatch)),
		WaitTimeSeconds:       int32(wait / time.Second),
		VisibilityTimeout:     int32(visibility / time.Second),
		MessageAttributeNames: []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{
			types.MessageSystemAttributeNameApproximateReceiveCount, types.MessageSystemAttributeNameMessageGroupId},
	})
	if err != nil {
		return nil, classify(err)
	}
	msgs := make([]queue.Message, len(out.Messages))
	for i, m := range out.Messages {
		msgs[i] = queue.Message{
			ID:         aws.ToString(m.MessageId),
			Handle:     aws.ToString(m.ReceiptHandle),
			Body:       aws.ToString(m.Body),
			Attributes: sqscodec.Strings(m.MessageAttributes),
			GroupID:    m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
		}
		if n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil {
			msgs[i].ReceiveCount = n
		}
	}
	return msgs, nil
}

func (q *Queue) Delete(ctx context.Context, handles []string) ([]error, error) {
	out, err := q.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &q.url, Entries: sqscodec.DeleteEntries(handles)})
	if err != nil {
		return nil, classify(err)
	}
	return entryErrors(len(handles), out.Failed)
}

func (q *Queue) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
	out, err := q.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{
		QueueUrl: &q.url, Entries: sqscodec.VisibilityEntries(handles, timeout)})
	if err != nil {
		return nil, classify(err)
	}
	return entryErrors(len(handles), out.Failed)
}

func (q *Queue) Send(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
	entries := make([]types.SendMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		c := sqscodec.Message{Body: m.Body, Attributes: m.Attributes, GroupID: m.GroupID}
		if q.fifo {
			c.DedupID = m.DedupID
		}
		entries[i] = sqscodec.Entry(i, c)
		if !q.fifo && m.Delay > 0 {
			entries[i].DelaySeconds = int32(m.Delay / time.Second)
		}
	}
	out, err := q.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &q.url, Entries: entries})
	if err != nil {
		return nil, classify(err)
	}
	return entryErrors(len(msgs), out.Failed)
}

// entryErrors is sqscodec.Errors, each failed entry classified.
func entryErrors(n int, failed []types.BatchResultErrorEntry) ([]error, error) {
	errs, err := sqscodec.Errors(n, failed)
	for i, e := range errs {
		if e != nil {
			errs[i] = classify(e)
		}
	}
	return errs, err
}

// classify returns err, a failed entry or a failed call, as a *queue.Error
// where SQS's answer says what it means to the subscriber: a lost lease, or
// a refusal for good (an entry SQS blames on its sender, a code that refuses
// what was sent, or an HTTP 413 from whatever stands in front of SQS). Any
// other error is returned wrapped in its job/fault kind where its code has
// one (throttled, needs an operator: sqscodec.Classify), else as it is.
func classify(err error) error {
	code, _ := sqscodec.Code(err)
	var ee *sqscodec.EntryError
	var re *smithyhttp.ResponseError
	switch {
	case sqscodec.LeaseLost(err):
		return &queue.Error{Kind: queue.ErrLeaseLost, Code: code, Err: err}
	case errors.As(err, &ee) && !ee.Retryable(), sqscodec.Refuses(err):
		return &queue.Error{Kind: queue.ErrRefused, Code: code, Err: err}
	case errors.As(err, &re) && re.HTTPStatusCode() == http.StatusRequestEntityTooLarge:
		if code == "" {
			code = http.StatusText(http.StatusRequestEntityTooLarge)
		}
		return &queue.Error{Kind: queue.ErrRefused, Code: code, Err: err}
	}
	return sqscodec.Classify(err)
}
