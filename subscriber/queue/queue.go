// Package queue is the subscriber's view of a message queue, as go-cloud's
// pubsub/driver is its topics' and subscriptions': the narrow interface an
// implementation provides (sqsqueue on SQS, queuetest.Mem in memory), the
// messages it carries and the kinds of error the subscriber acts on (its
// payload bucket's too). queuetest holds the conformance suite every
// implementation must pass.
package queue

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
	// GroupID is the MessageGroupId it was sent with (a FIFO queue's group,
	// a fair queue's tenant), empty when none: a copy sent back to the
	// queue keeps it.
	GroupID string
}

// Outgoing is a message to send: to the results queue or the DLQ, or back
// to the work queue as a fresh copy of one received (Subscriber's hand-back).
type Outgoing struct {
	Body       string
	Attributes map[string]string
	// GroupID is the MessageGroupId to send with; none when empty.
	GroupID string
	// Delay keeps the message invisible this long after the send (SQS's
	// DelaySeconds, whole seconds, at most job.MaxDelay). A FIFO queue takes
	// no per-message delay: an implementation on one sends it at once.
	Delay time.Duration
	// DedupID is a FIFO queue's MessageDeduplicationId; ignored elsewhere.
	DedupID string
}

// Queue is the narrow view of the work queue the subscriber needs.
// Implementations must be safe for concurrent use and must not retry beyond
// their client's own retryer.
//
// The batch methods take at most job.MaxBatch entries (the SQS limit) and
// return one error per entry, nil where the entry succeeded; a non-nil
// second result means the whole call failed and no entry is known to have
// succeeded. Errors are classified where they arise: see Error.
type Queue interface {
	// Receive long-polls for up to max messages (at most 10), waiting up to
	// wait, and makes them invisible to other consumers for visibility.
	Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]Message, error)
	// Delete acknowledges messages by receipt handle.
	Delete(ctx context.Context, handles []string) ([]error, error)
	// ChangeVisibility sets the visibility timeout of messages to timeout
	// from now: a heartbeat when positive, a release when zero.
	ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error)
	// Send puts messages on the work queue itself: a held message handed
	// back as a fresh copy (with a fresh receive count), then deleted.
	Sender
}

// Sender sends messages to one queue: results or the DLQ. Same batch
// contract as Queue.
type Sender interface {
	Send(ctx context.Context, msgs []Outgoing) ([]error, error)
}

// The kinds of error the subscriber acts on, as the implementation that
// met an error classifies it (see Error); any other error may pass.
var (
	// ErrLeaseLost: the receipt handle no longer holds its message (it was
	// deleted, or its visibility lapsed and another consumer may have it).
	ErrLeaseLost = errors.New("lease lost: receipt handle invalid or message not in flight")
	// ErrRefused: what was sent is refused for good (too large, a character
	// the service does not take); sending it again fails the same way.
	ErrRefused = errors.New("refused for good")
)

// Error is an error its implementation classified.
type Error struct {
	Kind error  // ErrLeaseLost or ErrRefused
	Code string // the service's name for it, for logs and reasons, never to decide by
	Err  error  // the service's own error, if any
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Kind.Error() + ": " + e.Code
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() []error { return []error{e.Kind, e.Err} }
