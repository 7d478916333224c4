// Package queue is the subscriber's view of a message queue, as go-cloud's
// pubsub/driver is its topics' and subscriptions': the narrow interface an
// implementation provides (sqsqueue on SQS, queuetest.Mem in memory), the
// messages it carries and the errors it returns. queuetest holds the
// conformance suite every implementation must pass.
package queue

import (
	"context"
	"errors"
	"time"

	"github.com/vramq/vramq/internal/sqscodec"
)

// Message is a received message. Handle is its receipt handle: the lease on it.
type Message struct {
	ID           string
	Handle       string
	Body         string
	Attributes   map[string]string // string message attributes
	ReceiveCount int               // ApproximateReceiveCount, 1 on first delivery
}

// Outgoing is a message to send to the results queue or the DLQ.
type Outgoing struct {
	Body       string
	Attributes map[string]string
}

// Queue is the narrow view of the work queue the subscriber needs.
// Implementations must be safe for concurrent use and must not retry beyond
// their client's own retryer.
//
// The batch methods take at most MaxBatch entries (the SQS limit) and
// return one error per entry, nil where the entry succeeded; a non-nil
// second result means the whole call failed and no entry is known to have
// succeeded. IsLeaseLost tells an entry error that means the receipt handle
// is no longer valid.
type Queue interface {
	// Receive long-polls for up to max messages (at most 10), waiting up to
	// wait, and makes them invisible to other consumers for visibility.
	Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]Message, error)
	// Delete acknowledges messages by receipt handle.
	Delete(ctx context.Context, handles []string) ([]error, error)
	// ChangeVisibility sets the visibility timeout of messages to timeout
	// from now: a heartbeat when positive, a release when zero.
	ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error)
}

// Sender sends messages to one queue: results or the DLQ. Same batch
// contract as Queue.
type Sender interface {
	Send(ctx context.Context, msgs []Outgoing) ([]error, error)
}

// MaxBatch is the most entries SQS takes in one batch call or one receive.
const MaxBatch = 10

// ErrLeaseLost means a receipt handle no longer holds its message: it was
// deleted, or its visibility expired and it may be with another consumer.
var ErrLeaseLost = errors.New("lease lost: receipt handle invalid or message not in flight")

// EntryError is one failed entry of a batch call, with SQS's error code:
// an implementation on another service reports its failures with the SQS
// code that means the same, so that IsLeaseLost and the subscriber's
// refusal rules read them.
type EntryError = sqscodec.EntryError

// IsLeaseLost reports whether err, from any call, means a lost lease:
// ErrLeaseLost, or an entry or API error with one of SQS's lease-lost codes.
func IsLeaseLost(err error) bool {
	return errors.Is(err, ErrLeaseLost) || sqscodec.LeaseLost(err)
}
