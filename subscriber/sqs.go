package subscriber

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/vramq/vramq/internal/sqsbatch"
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
			ID:     aws.ToString(m.MessageId),
			Handle: aws.ToString(m.ReceiptHandle),
			Body:   aws.ToString(m.Body),
		}
		if n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil {
			msgs[i].ReceiveCount = n
		}
		if len(m.MessageAttributes) > 0 {
			msgs[i].Attributes = make(map[string]string, len(m.MessageAttributes))
			for k, v := range m.MessageAttributes {
				if v.StringValue != nil {
					msgs[i].Attributes[k] = *v.StringValue
				}
			}
		}
	}
	return msgs, nil
}

func (q *SQSQueue) Delete(ctx context.Context, handles []string) ([]error, error) {
	entries := make([]types.DeleteMessageBatchRequestEntry, len(handles))
	for i := range handles {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: &handles[i]}
	}
	out, err := q.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &q.url, Entries: entries})
	if err != nil {
		return nil, err
	}
	return sqsbatch.Errors(len(handles), out.Failed)
}

func (q *SQSQueue) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
	entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(handles))
	for i := range handles {
		entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{
			Id:                aws.String(strconv.Itoa(i)),
			ReceiptHandle:     &handles[i],
			VisibilityTimeout: int32(timeout / time.Second),
		}
	}
	out, err := q.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &q.url, Entries: entries})
	if err != nil {
		return nil, err
	}
	return sqsbatch.Errors(len(handles), out.Failed)
}

func (q *SQSQueue) Send(ctx context.Context, msgs []Outgoing) ([]error, error) {
	entries := make([]types.SendMessageBatchRequestEntry, len(msgs))
	for i := range msgs {
		entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: &msgs[i].Body}
		if len(msgs[i].Attributes) > 0 {
			attrs := make(map[string]types.MessageAttributeValue, len(msgs[i].Attributes))
			for k, v := range msgs[i].Attributes {
				attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
			}
			entries[i].MessageAttributes = attrs
		}
	}
	out, err := q.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &q.url, Entries: entries})
	if err != nil {
		return nil, err
	}
	return sqsbatch.Errors(len(msgs), out.Failed)
}

// EntryError is one failed entry of a batch call.
type EntryError = sqsbatch.EntryError

// leaseLostCode classifies SQS error codes, in both the plain form and the
// "AWS.SimpleQueueService." form that some SQS implementations return.
func leaseLostCode(code string) bool {
	switch sqsbatch.Code(code) {
	case "ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidReceiptHandle":
		return true
	}
	return false
}

// IsLeaseLost reports whether err, from any call, means a lost lease.
func IsLeaseLost(err error) bool {
	if errors.Is(err, ErrLeaseLost) {
		return true
	}
	var ee *EntryError
	if errors.As(err, &ee) && leaseLostCode(ee.Code) {
		return true
	}
	var apiErr smithy.APIError
	return errors.As(err, &apiErr) && leaseLostCode(apiErr.ErrorCode())
}
