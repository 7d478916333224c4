// Package sqsqueue is the subscriber's queue on Amazon SQS: a queue.Queue
// and a queue.Sender on one SQS queue, through the SDK's client.
package sqsqueue

import (
	"context"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/subscriber/queue"
)

// Queue is a queue.Queue and a queue.Sender on one SQS queue. Retries are
// the SDK client's own; configure them on the client. Safe for concurrent
// use.
type Queue struct {
	client *sqs.Client
	url    string
}

var (
	_ queue.Queue  = (*Queue)(nil)
	_ queue.Sender = (*Queue)(nil)
)

// New returns the queue at url, reached through client.
func New(client *sqs.Client, url string) *Queue {
	return &Queue{client: client, url: url}
}

func (q *Queue) Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]queue.Message, error) {
	out, err := q.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    &q.url,
		MaxNumberOfMessages:         int32(min(max, queue.MaxBatch)),
		WaitTimeSeconds:             int32(wait / time.Second),
		VisibilityTimeout:           int32(visibility / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
	})
	if err != nil {
		return nil, err
	}
	msgs := make([]queue.Message, len(out.Messages))
	for i, m := range out.Messages {
		msgs[i] = queue.Message{
			ID:         aws.ToString(m.MessageId),
			Handle:     aws.ToString(m.ReceiptHandle),
			Body:       aws.ToString(m.Body),
			Attributes: sqscodec.Strings(m.MessageAttributes),
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
		return nil, err
	}
	return sqscodec.Errors(len(handles), out.Failed)
}

func (q *Queue) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
	out, err := q.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{
		QueueUrl: &q.url, Entries: sqscodec.VisibilityEntries(handles, timeout)})
	if err != nil {
		return nil, err
	}
	return sqscodec.Errors(len(handles), out.Failed)
}

func (q *Queue) Send(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
	entries := make([]sqscodec.Message, len(msgs))
	for i, m := range msgs {
		entries[i] = sqscodec.Message{Body: m.Body, Attributes: m.Attributes}
	}
	out, err := q.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &q.url, Entries: sqscodec.Entries(entries)})
	if err != nil {
		return nil, err
	}
	return sqscodec.Errors(len(msgs), out.Failed)
}
