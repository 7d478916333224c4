package subscriber

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/internal/sqscodec"
)

// SQSQueue is a Queue and a Sender on one SQS queue. Retries are the SDK
// client's own; configure them on the client.
type SQSQueue struct {
	client *sqs.Client
	url    string
}

var (
	_ Queue  = (*SQSQueue)(nil)
	_ Sender = (*SQSQueue)(nil)
)

// NewSQSQueue returns the queue at url, reached through client.
func NewSQSQueue(client *sqs.Client, url string) *SQSQueue {
	return &SQSQueue{client: client, url: url}
}

func (q *SQSQueue) Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]Message, error) {
	out, err := q.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    &q.url,
		MaxNumberOfMessages:         int32(min(max, MaxBatch)),
		WaitTimeSeconds:             int32(wait / time.Second),
		VisibilityTimeout:           int32(visibility / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
	})
	if err != nil {
		return nil, err
	}
	msgs := make([]Message, len(out.Messages))
	for i, m := range out.Messages {
		msgs[i] = Message{
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

func (q *SQSQueue) Delete(ctx context.Context, handles []string) ([]error, error) {
	out, err := q.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &q.url, Entries: sqscodec.DeleteEntries(handles)})
	if err != nil {
		return nil, err
	}
	return sqscodec.Errors(len(handles), out.Failed)
}

func (q *SQSQueue) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
	out, err := q.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{
		QueueUrl: &q.url, Entries: sqscodec.VisibilityEntries(handles, timeout)})
	if err != nil {
		return nil, err
	}
	return sqscodec.Errors(len(handles), out.Failed)
}

func (q *SQSQueue) Send(ctx context.Context, msgs []Outgoing) ([]error, error) {
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

// EntryError is one failed entry of a batch call.
type EntryError = sqscodec.EntryError

// IsLeaseLost reports whether err, from any call, means a lost lease.
func IsLeaseLost(err error) bool {
	return errors.Is(err, ErrLeaseLost) || sqscodec.LeaseLost(err)
}
