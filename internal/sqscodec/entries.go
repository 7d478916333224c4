// Package sqscodec turns vramq's messages into SQS requests and SQS answers
// into errors: batch entries, string message attributes, the entry-by-entry
// outcome of batch calls, and error codes in both their spellings. It holds
// no client and makes no calls; retrying is the SDK retryer's business.
package sqscodec

import (
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/job"
)

// Message is one message to send.
type Message struct {
	Body       string
	Attributes map[string]string // string message attributes; none when empty
	// GroupID is the MessageGroupId: on a FIFO queue the group whose
	// messages are delivered in order, on a standard queue the tenant that
	// SQS fair queues balance. Empty sends none.
	GroupID string
	// DedupID is a FIFO queue's MessageDeduplicationId; a standard queue
	// refuses it, so leave it empty there.
	DedupID string
}

// Entry is the SendMessageBatch entry of m, with id i: the entry's index in
// its call, as Errors expects.
func Entry(i int, m Message) types.SendMessageBatchRequestEntry {
	e := types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(m.Body)}
	if len(m.Attributes) > 0 {
		e.MessageAttributes = Attributes(m.Attributes)
	}
	if m.GroupID != "" {
		e.MessageGroupId = aws.String(m.GroupID)
	}
	if m.DedupID != "" {
		e.MessageDeduplicationId = aws.String(m.DedupID)
	}
	return e
}

// Entries is the SendMessageBatch entries of msgs (at most ten), in order.
func Entries(msgs []Message) []types.SendMessageBatchRequestEntry {
	entries := make([]types.SendMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = Entry(i, m)
	}
	return entries
}

// DeleteEntries is the DeleteMessageBatch entries of receipt handles (at
// most ten), in order.
func DeleteEntries(handles []string) []types.DeleteMessageBatchRequestEntry {
	entries := make([]types.DeleteMessageBatchRequestEntry, len(handles))
	for i, h := range handles {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(h)}
	}
	return entries
}

// VisibilityEntries is the ChangeMessageVisibilityBatch entries that set the
// visibility timeout of receipt handles (at most ten) to timeout from now,
// in whole seconds as SQS counts it.
func VisibilityEntries(handles []string, timeout time.Duration) []types.ChangeMessageVisibilityBatchRequestEntry {
	entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(handles))
	for i, h := range handles {
		entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{
			Id:                aws.String(strconv.Itoa(i)),
			ReceiptHandle:     aws.String(h),
			VisibilityTimeout: int32(timeout / time.Second),
		}
	}
	return entries
}

// Attributes is plain as SQS message attributes, each of vramq's one data
// type (job.AttrDataType).
func Attributes(plain map[string]string) map[string]types.MessageAttributeValue {
	attrs := make(map[string]types.MessageAttributeValue, len(plain))
	for k, v := range plain {
		attrs[k] = types.MessageAttributeValue{DataType: aws.String(job.AttrDataType), StringValue: aws.String(v)}
	}
	return attrs
}

// Strings is the string values of received message attributes; attributes
// without one (binary ones, which vramq never sends) are left out, and no
// attributes give nil.
func Strings(attrs map[string]types.MessageAttributeValue) map[string]string {
	if len(attrs) == 0 {
		return nil
	}
	plain := make(map[string]string, len(attrs))
	for k, v := range attrs {
		if v.StringValue != nil {
			plain[k] = *v.StringValue
		}
	}
	return plain
}
