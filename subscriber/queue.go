package subscriber

import (
	"errors"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// The queue's types under the names the subscriber's code and its users
// have always used. They live in package queue so that its conformance
// suite and in-memory queue (queuetest), which the subscriber's own tests
// use, need not import the subscriber.
type (
	Message  = queue.Message
	Outgoing = queue.Outgoing
	Queue    = queue.Queue
	Sender   = queue.Sender
)

// MaxBatch is job.MaxBatch.
const MaxBatch = job.MaxBatch

// ErrLeaseLost is queue.ErrLeaseLost.
var ErrLeaseLost = queue.ErrLeaseLost

// IsLeaseLost reports whether err is a queue.ErrLeaseLost.
func IsLeaseLost(err error) bool { return errors.Is(err, queue.ErrLeaseLost) }
