package subscriber

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// deviceLoss is what ends a subscriber whose device can run nothing more
// (gpu.ErrDeviceLost: a sticky CUDA error broke the context). Retrying would
// fail every message in turn until redrive moves them all to the DLQ, while
// /healthz stayed green. So the subscriber stops receiving, hands back every
// message it holds at once (no message is to blame), fails its health check,
// and Run returns the error, so that the process exits non-zero and is
// replaced (ECS starts a new task).
type deviceLoss struct {
	err  atomic.Pointer[error]
	mu   sync.Mutex
	stop context.CancelCauseFunc // ends Run's receive context; nil outside Run
}

// arm makes a loss end the Run that owns stop.
func (d *deviceLoss) arm(stop context.CancelCauseFunc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stop = stop
	if err := d.cause(); err != nil {
		stop(err)
	}
}

// lose records err; it reports whether this was the first loss.
func (d *deviceLoss) lose(err error) bool {
	if !d.err.CompareAndSwap(nil, &err) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stop != nil {
		d.stop(err)
	}
	return true
}

// cause is the error that lost the device, nil while it works.
func (d *deviceLoss) cause() error {
	if p := d.err.Load(); p != nil {
		return *p
	}
	return nil
}

// loseDevice shuts the subscriber down the first time a run of n messages
// loses the device; the runner hands them back (failure).
func (s *Subscriber) loseDevice(n int, err error) {
	if s.loss.lose(err) {
		s.log.Error("the device is lost: no more messages are taken, held ones go back to the queue, and the subscriber exits",
			"err", err, "messages", n)
	}
}

// errDeviceLost wraps the loss for Run's caller and Healthy.
func (s *Subscriber) errDeviceLost() error {
	if err := s.loss.cause(); err != nil {
		return fmt.Errorf("subscriber: %w", err)
	}
	return nil
}
