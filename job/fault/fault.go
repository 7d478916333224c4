// Package fault names the kinds of failure that decide what vramq does
// next, whichever adapter met them: a model on a device, a model server, a
// queue. Each adapter wraps its own errors in these, where it first reads
// them, so that the caller acts on the kind without importing the adapter
// (go-cloud's drivers classify their errors the same way). The kinds say
// whose fault a failure is: the input's (ErrInvalidInput), nobody's but a
// wait's (ErrBackoff), or the setup's (ErrNeedsOperator). Any other error
// is transient, as far as these kinds know.
//
// The package imports nothing of vramq, so that everything may import it.
package fault

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrInvalidInput means what was given can never be processed, whatever
	// the memory or the moment: the same input fails the same way every
	// time, so no caller retries it. A model's Run returns it for an item
	// it refuses (the subscriber then runs a message of several items an
	// item at a time, answers each refused item with an error in the
	// result, job.ItemError, and dead-letters a message with nothing
	// else); a queue returns it for a message it refuses (too long, a
	// character it does not take).
	ErrInvalidInput = errors.New("invalid input")
	// ErrBackoff means whoever does the work (a model server, a
	// rate-limited API, a queue) asked to be left alone for a while: a
	// rate limit's window, a daily quota's reset, throttling. No input is
	// to blame, and none would succeed before then. Where the adapter
	// knows when to come back, the error is a *BackoffError and
	// BackoffUntil reads the time. A subscriber hands the batch's messages
	// back with a visibility timeout that ends then and receives nothing
	// more until then, so that the wait lives in the queue rather than in
	// a process holding leases. Items a model finished before the backoff
	// come with it in a *PartialError.
	ErrBackoff = errors.New("backoff")
	// ErrNeedsOperator means nothing will succeed until a person acts: an
	// account's quota is spent, a key or credentials are refused, a model
	// or a queue does not exist, an encryption key is disabled. No input
	// is to blame and retrying does not help. The caller should stop
	// taking work, hand back what it holds, and say why (health, one error
	// log, a metric) rather than retry each message into the dead-letter
	// queue.
	ErrNeedsOperator = errors.New("needs an operator")
)

// BackoffError is an ErrBackoff that says when: come back at Until.
type BackoffError struct {
	Until  time.Time
	Reason string // what asked for the wait, e.g. "429 rate_limit_exceeded"; no secrets, no message content
}

func (e *BackoffError) Error() string {
	return fmt.Sprintf("backoff until %s: %s", e.Until.UTC().Format(time.RFC3339Nano), e.Reason)
}

func (e *BackoffError) Unwrap() error { return ErrBackoff }

// BackoffUntil returns the time err (a *BackoffError, however wrapped) says
// to come back at; ok is false for any other error, an ErrBackoff that
// says no time included.
func BackoffUntil(err error) (until time.Time, ok bool) {
	var b *BackoffError
	if errors.As(err, &b) {
		return b.Until, true
	}
	return time.Time{}, false
}

// PartialError is the error of a batch that ended early, wrapping why
// (ErrBackoff, the one it comes with today), with the outputs of the items
// it had finished: their requests were answered, and their cost spent,
// before the rest were stopped. Outputs has one entry per item, in order;
// Outputs[i] is item i's final output where Done[i], and means nothing
// where not. A caller that can keep some items' outputs (a message whose
// items all finished) keeps them, and treats the rest as Err says; one
// that cannot treats the whole batch so. Partial reads it.
//
// O is the output's type (job.Output for a model's Run): a type parameter,
// so that this package needs none of vramq's types.
type PartialError[O any] struct {
	Err     error
	Outputs []O
	Done    []bool
}

func (e *PartialError[O]) Error() string {
	n := 0
	for _, d := range e.Done {
		if d {
			n++
		}
	}
	return fmt.Sprintf("%v (%d of %d items finished)", e.Err, n, len(e.Done))
}

func (e *PartialError[O]) Unwrap() error { return e.Err }

// Partial returns the outputs and finished items err (a *PartialError[O],
// however wrapped) carries; ok is false for any other error, and for one
// whose slices do not agree in length.
func Partial[O any](err error) (outs []O, done []bool, ok bool) {
	var p *PartialError[O]
	if !errors.As(err, &p) || len(p.Outputs) != len(p.Done) {
		return nil, nil, false
	}
	return p.Outputs, p.Done, true
}
