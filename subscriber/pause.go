package subscriber

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// What runs the model may say that nothing will run for a while, or until a
// person acts; no message is to blame for either, so neither may count
// against a message's receives (the queue's redrive would dead-letter every
// one in turn):
//
//   - gpu.ErrBackoff (a rate limit's window or a daily quota, past the
//     wait the model does inside Run): the batch's messages go back with a
//     visibility timeout that ends when the server said to come back, and
//     the poller receives nothing until then. The wait lives in the queue,
//     not in a process holding leases. Messages already held when it
//     comes, and those a receive in flight brings, go back the same way
//     when their batch would start, without running.
//   - gpu.ErrNeedsOperator (a spent quota, a refused key, an unknown
//     model): the poller stops for good, every held message goes back at
//     once (visibility 0, for a subscriber that works), Healthy reports the
//     reason, and one ERROR log and a metric say so. The process does not
//     exit, unlike a lost device (devicelost.go): a fresh process would
//     have the same key and the same quota, and each restart would receive
//     a round of messages again, counting towards their DLQ. Nor does it
//     probe: only a real request shows that a quota is back, and a request
//     needs a message. It stays up and unhealthy until an operator acts
//     (fixes the key or quota and restarts the task).
type pause struct {
	mu       sync.Mutex
	until    time.Time // receive nothing before; zero when not backing off
	reason   string
	operator error         // set once: nothing runs until a person acts
	changed  chan struct{} // closed and replaced when until or operator changes
}

func newPause() *pause { return &pause{changed: make(chan struct{})} }

// backOff pauses receiving until until, or later if already so; it
// reports whether it moved the pause.
func (p *pause) backOff(until time.Time, reason string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !until.After(p.until) {
		return false
	}
	p.until, p.reason = until, reason
	close(p.changed)
	p.changed = make(chan struct{})
	return true
}

// needOperator stops receiving for good; it reports whether this was the
// first time.
func (p *pause) needOperator(err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.operator != nil {
		return false
	}
	p.operator = err
	close(p.changed)
	p.changed = make(chan struct{})
	return true
}

// state is what holds receiving now: the time a backoff ends (zero when
// none is in force at now), a channel closed when that or the operator's
// error changes, and the operator's error.
func (p *pause) state(now time.Time) (until time.Time, changed <-chan struct{}, operator error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Before(p.until) {
		until = p.until
	}
	return until, p.changed, p.operator
}

// cause is the operator's error, nil while none is needed.
func (p *pause) cause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.operator
}

// wait blocks the poller while receiving is paused; it returns false when
// ctx ends first.
func (p *pause) wait(ctx context.Context) bool {
	for {
		until, changed, op := p.state(time.Now())
		if op == nil && until.IsZero() {
			return true
		}
		var timer <-chan time.Time
		var t *time.Timer
		if op == nil {
			t = time.NewTimer(time.Until(until))
			timer = t.C
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return false
		}
	}
}

// maxVisibility is SQS's longest visibility timeout, counted from the
// receive: a ChangeMessageVisibility past it is refused.
const maxVisibility = 12 * time.Hour

// backoffDelay is the visibility timeout that hands l's message back until
// until: whole seconds, rounded up so that it does not come back early,
// and within what is left of SQS's 12 hours since its receive (a minute
// short, since the lease's clock starts after SQS's).
func backoffDelay(l *lease, until, now time.Time) time.Duration {
	d := until.Sub(now)
	if left := maxVisibility - time.Minute - now.Sub(l.received); d > left {
		d = left
	}
	if d <= 0 {
		return 0
	}
	return (d + time.Second - 1).Truncate(time.Second)
}

// backoffReason is a metric label for a backoff's reason, which is the
// server's words: a few kinds, so that the series stay bounded.
func backoffReason(reason string) string {
	switch {
	case strings.HasPrefix(reason, "429"), strings.HasPrefix(reason, "rate limit"):
		return "rate_limit"
	case reason == "":
		return "unknown"
	}
	return "overloaded"
}

// backOff hands tasks back until err's time and pauses receiving until
// then (gpu.ErrBackoff). A task with outputs in outs (every item of its
// message finished before the backoff: gpu.PartialError, see
// Subscriber.finished) is completed instead, as a batch that ran: its
// requests were answered, and handing it back would send them again after
// the backoff, spending their tokens twice. outs is nil or one entry per
// task.
func (s *Subscriber) backOff(tasks []*task, outs [][]job.Output, err error) {
	var done []*task
	var doneOuts [][]job.Output
	if outs != nil {
		rest := tasks[:0:0]
		for i, t := range tasks {
			if outs[i] == nil {
				rest = append(rest, t)
				continue
			}
			done, doneOuts = append(done, t), append(doneOuts, outs[i])
		}
		tasks = rest
	}
	until, _ := gpu.BackoffUntil(err)
	reason := err.Error()
	var b *gpu.BackoffError
	if errors.As(err, &b) {
		reason = b.Reason
	}
	if s.pause.backOff(until, reason) {
		s.m.pausedUntil.Set(float64(until.UnixMilli()) / 1e3)
		s.log.Warn("the model asks to be left alone: releasing its messages until then, receiving nothing meanwhile",
			"until", until.UTC(), "reason", reason, "messages", len(tasks))
	}
	s.releaseUntil(tasks, until, backoffReason(reason))
	if len(done) > 0 {
		s.outbox.promise(len(done))
		for _, t := range done {
			s.giveBack(t)
		}
		s.log.Info("a backoff came with part of the batch finished: its finished messages complete, the rest went back",
			"completed", len(done), "released", len(tasks))
		s.complete(done, doneOuts)
	}
}

// releaseUntil hands tasks back with a visibility timeout that ends at
// until (as far as SQS allows), counting them by reason.
func (s *Subscriber) releaseUntil(tasks []*task, until time.Time, reason string) {
	now := time.Now()
	for _, t := range tasks {
		s.m.backedOff.WithLabelValues(reason).Inc()
		s.release(t, backoffDelay(t.lease, until, now))
	}
}

// needOperator hands tasks back at once and stops receiving for good
// (gpu.ErrNeedsOperator).
func (s *Subscriber) needOperator(tasks []*task, err error) {
	if s.pause.needOperator(err) {
		s.m.needsOperator.Set(1)
		s.log.Error("the model needs an operator: no more messages are taken, held ones go back to the queue; "+
			"the subscriber stays up and unhealthy until someone acts", "err", err, "messages", len(tasks))
	}
	for _, t := range tasks {
		s.release(t, 0)
	}
}

// paused hands tasks back without running them when receiving is paused,
// and reports whether it did: a batch that would start after a backoff or
// a needed operator would only ask the server again.
func (s *Subscriber) paused(tasks []*task) bool {
	until, _, op := s.pause.state(time.Now())
	switch {
	case op != nil:
		for _, t := range tasks {
			s.release(t, 0)
		}
	case !until.IsZero():
		s.pause.mu.Lock()
		reason := s.pause.reason
		s.pause.mu.Unlock()
		s.releaseUntil(tasks, until, backoffReason(reason))
	default:
		return false
	}
	return true
}
