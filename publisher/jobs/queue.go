package jobs

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/job"
)

// Queue is where work messages go: the publisher's only dependency on SQS.
type Queue interface {
	// SendBatch sends up to ten entries in one call. A non-nil error means the
	// call as a whole failed (after the client's own retries) and none of the
	// entries can be assumed sent. Otherwise the slice has one element per
	// entry: nil when it was sent, an error (an *EntryError for SQS) when it
	// was not. Errors wrap their kind (job/fault) where they have one:
	// fault.ErrInvalidInput for an entry refused for good,
	// fault.ErrNeedsOperator where nothing will be sent until the setup
	// changes, fault.ErrBackoff for throttling. It must be safe for
	// concurrent use.
	SendBatch(ctx context.Context, entries []Entry) ([]error, error)
}

// Entry is one work message.
type Entry struct {
	Body  string
	JobID string
	Chunk int
	// Tenant is who sent the job (internal/tenant), valid or empty: the
	// standard queue's MessageGroupId and the vramq-tenant attribute.
	Tenant string
}

// SQSQueue is a Queue on one SQS queue. Retries of whole calls are the SDK
// client's own; configure them on the client.
type SQSQueue struct {
	client *sqs.Client
	url    string
	fifo   bool
}

var _ Queue = (*SQSQueue)(nil)

// NewSQSQueue returns the queue at url, reached through client. A FIFO queue
// (SQS requires its name to end in .fifo) gets MessageGroupId = job id, so a
// job's chunks are delivered in order, and MessageDeduplicationId = job id
// and chunk, so a chunk sent twice within SQS's five-minute window is taken
// once. A standard queue gets MessageGroupId = tenant, when the job has one:
// SQS fair queues take it as the tenant and, when one tenant's messages hold
// a disproportionate share of those in flight, deliver the quiet tenants'
// first, with no ordering and no change to throughput (docs/api.md, Tenants).
func NewSQSQueue(client *sqs.Client, url string) *SQSQueue {
	return &SQSQueue{client: client, url: url, fifo: strings.HasSuffix(url, ".fifo")}
}

// FIFO reports whether the queue is a FIFO queue.
func (q *SQSQueue) FIFO() bool { return q.fifo }

func (q *SQSQueue) SendBatch(ctx context.Context, entries []Entry) ([]error, error) {
	msgs := make([]sqscodec.Message, len(entries))
	for i, e := range entries {
		msgs[i] = sqscodec.Message{Body: e.Body, Attributes: attributes(e.JobID, e.Chunk, e.Tenant)}
		switch {
		case q.fifo:
			msgs[i].GroupID = e.JobID
			msgs[i].DedupID = e.JobID + "-" + strconv.Itoa(e.Chunk)
		case e.Tenant != "":
			msgs[i].GroupID = e.Tenant
		}
	}
	out, err := q.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &q.url, Entries: sqscodec.Entries(msgs)})
	if err != nil {
		return nil, sqscodec.Classify(err)
	}
	return sqscodec.Errors(len(entries), out.Failed)
}

// attributes are a work message's: its job id and chunk, and its tenant
// when it has one.
func attributes(jobID string, chunk int, tenant string) map[string]string {
	attrs := job.Attributes(job.Key{JobID: jobID, Chunk: chunk})
	if tenant != "" {
		attrs[job.AttrTenant] = tenant
	}
	return attrs
}

// EntryError is one failed entry of a batch call; it wraps its kind
// (job/fault), which tells whether sending it again may help.
type EntryError = sqscodec.EntryError

// Limits are what the publisher reads from the queue at start.
type Limits struct {
	MaxMessageBytes int  // the queue's MaximumMessageSize
	FIFO            bool // the queue's FifoQueue
}

// QueueLimits reads the work queue's MaximumMessageSize and FifoQueue
// attributes, so chunks are cut to what this queue accepts (256 KiB by
// default, up to 1 MiB where configured) rather than to a guess.
func QueueLimits(ctx context.Context, client *sqs.Client, url string) (Limits, error) {
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameMaximumMessageSize, types.QueueAttributeNameFifoQueue}})
	if err != nil {
		return Limits{}, fmt.Errorf("reading the attributes of %s: %w", url, err)
	}
	var l Limits
	s := out.Attributes[string(types.QueueAttributeNameMaximumMessageSize)]
	if l.MaxMessageBytes, err = strconv.Atoi(s); err != nil || l.MaxMessageBytes <= 0 {
		return Limits{}, fmt.Errorf("queue %s: MaximumMessageSize %q is not a size", url, s)
	}
	l.FIFO = out.Attributes[string(types.QueueAttributeNameFifoQueue)] == "true" || strings.HasSuffix(url, ".fifo")
	return l, nil
}
