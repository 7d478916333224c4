package subscriber

import (
	"context"
	"errors"
	"time"
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

// Queue is the narrow view of the work queue the subscriber needs. SQSQueue
// implements it on SQS; tests use an in-memory one. Implementations must be
// safe for concurrent use and must not retry beyond their client's own
// retryer.
//
// The batch methods take at most 10 entries (the SQS limit) and return one
// error per entry, nil where the entry succeeded; a non-nil second result
// means the whole call failed and no entry is known to have succeeded.
// IsLeaseLost tells an entry error that means the receipt handle is no
// longer valid.
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
