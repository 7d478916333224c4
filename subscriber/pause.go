package subscriber

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
)

// The model's waits (the run stage's): a backoff holds what waits without a receive, and a model that needs
// an operator opens a circuit that one probe at a time tries.

// What runs the model may say that nothing will run for a while, or until a
// person acts. No message is to blame for either, and SQS counts every
// receive of a message towards its redrive (a message handed back and
// received again is one receive nearer the DLQ), so a wait never hands a
// message back to be received again:
//
//   - fault.ErrBackoff (a rate limit's window, an overloaded server, a daily
//     quota, past the wait the model does inside Run): the batch's messages
//     that did not finish wait in their runner, holding their leases (the
//     keeper extends them; max hold does not count while they wait), until
//     the server's time, then run again. Nothing is received meanwhile,
//     and a batch that would start waits the same way.
//   - fault.ErrNeedsOperator (a spent quota, a refused key, an unknown
//     model): a circuit that opens. Nothing is received; held messages
//     wait as above; readiness fails with the reason (Ready), and one
//     ERROR log and the needs_operator gauge say so. Every OperatorProbe
//     one message runs as a probe (a message already held, or, with none
//     held, one received for it): when it gets through, the circuit
//     closes and work resumes without a restart; when it does not, the
//     next probe is an OperatorProbe later.
//
// A wait longer than a lease can hold (SQS keeps a message invisible for at
// most 12 hours from its receive) hands the message back as a fresh copy
// visible again when the wait ends, or in 15 minutes at most (SQS's longest
// delay), and deletes the original (keeper.handBack): a fresh copy starts
// a fresh receive count. A shutdown hands waiting messages back the same
// way, at once.
type pause struct {
	mu       sync.Mutex
	until    time.Time // nothing runs before; zero when not backing off
	reason   string
	operator error     // non-nil while the circuit is open: nothing runs but a probe
	probeAt  time.Time // with operator: when the next probe may run
	// probeReceive: the poller was let receive one message for a probe,
	// since no batch was waiting to be one.
	probeReceive bool
	probing      bool // a probe batch is running
	waiters      int  // batches waiting for the pause to end
	changed      chan struct{}
}

func newPause() *pause { return &pause{changed: make(chan struct{})} }

// notify wakes everything waiting on p's state. Call it with p.mu held.
func (p *pause) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// backOff pauses until until, or later if already so; it reports whether
// it moved the pause.
func (p *pause) backOff(until time.Time, reason string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !until.After(p.until) {
		return false
	}
	p.until, p.reason = until, reason
	p.notify()
	return true
}

// needOperator opens the circuit, or keeps it open after a failed probe,
// with the next probe every from now; it reports whether it opened it.
func (p *pause) needOperator(err error, now time.Time, every time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	first := p.operator == nil
	p.operator, p.probeAt, p.probing, p.probeReceive = err, now.Add(every), false, false
	p.notify()
	return first
}

// probed ends a probe that did not need an operator: the circuit closes.
// It reports whether the circuit was open.
func (p *pause) probed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probing = false
	if p.operator == nil {
		return false
	}
	p.operator, p.probeReceive = nil, false
	p.notify()
	return true
}

// turn says whether a batch may run now: go, as a probe of the open
// circuit when probe. Otherwise it must wait until wake (zero: until
// changed is closed).
func (p *pause) turn(now time.Time) (ok, probe bool, wake time.Time, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = p.changed
	switch {
	case now.Before(p.until):
		return false, false, p.until, changed
	case p.operator == nil:
		return true, false, time.Time{}, changed
	case !p.probing && (p.probeReceive || !now.Before(p.probeAt)):
		p.probing, p.probeReceive = true, false
		return true, true, time.Time{}, changed
	case p.probing:
		return false, false, time.Time{}, changed
	}
	return false, false, p.probeAt, changed
}

// wakeAt is when a wait that begins now ends at the earliest, for a message
// handed back meanwhile: the backoff's end, or the next probe.
func (p *pause) wakeAt(now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Before(p.until) {
		return p.until
	}
	if p.operator != nil {
		return p.probeAt
	}
	return now
}

// addWaiter counts a batch waiting for the pause (n = 1) or no longer
// (n = -1).
func (p *pause) addWaiter(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waiters += n
	p.notify()
}

// receive tells the poller how many messages it may receive now: -1 for
// no limit, 1 for a probe (the circuit is open, a probe is due and no
// batch waits to be it), 0 for none, until wake (zero: until changed). A
// probe's receive moves the next probe every on: should its message never
// reach a batch (a cancelled job's, a malformed one) or the receive bring
// none, the next probe is received then.
func (p *pause) receive(now time.Time, every time.Duration) (n int, wake time.Time, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = p.changed
	switch {
	case now.Before(p.until):
		return 0, p.until, changed
	case p.operator == nil:
		return -1, time.Time{}, changed
	case p.probing || p.waiters > 0:
		return 0, time.Time{}, changed
	case now.Before(p.probeAt):
		return 0, p.probeAt, changed
	}
	p.probeReceive, p.probeAt = true, now.Add(every)
	return 1, time.Time{}, changed
}

// gotNothing says a probe's receive brought no message: the next is
// received at the next probe.
func (p *pause) gotNothing() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probeReceive = false
}

// watch is a channel closed when p's state changes, and the operator's
// error now.
func (p *pause) watch() (changed <-chan struct{}, operator error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed, p.operator
}

// cause is the operator's error, nil while none is needed.
func (p *pause) cause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.operator
}

// leaseLimit is the latest a message received at received can wait holding
// its lease: the last extension, a visibility timeout long, must end within
// SQS's 12 hours, with a minute to spare for the clocks.
func (s *Subscriber) leaseLimit(l *lease) time.Time {
	return l.received.Add(job.MaxVisibility - s.cfg.Visibility - time.Minute)
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

// backOff pauses until err's time (fault.ErrBackoff) and returns an outcome
// for each of tasks: waits, or carried for one completed. A task with outputs in outs (every item of its
// message finished before the backoff: fault.PartialError, see
// Subscriber.finished) is completed instead, as a batch that ran: its
// requests were answered, and running it again would send them again,
// spending their tokens twice. outs is nil or one entry per task.
func (s *Subscriber) backOff(tasks []*task, outs [][]job.Output, err error) []outcome {
	var done []*task
	var doneOuts [][]job.Output
	os := make([]outcome, len(tasks))
	waiting := 0
	for i, t := range tasks {
		if outs == nil || outs[i] == nil {
			os[i] = outcome{kind: waits}
			waiting++
			continue
		}
		os[i] = outcome{kind: carried}
		done, doneOuts = append(done, t), append(doneOuts, outs[i])
	}
	until, _ := fault.BackoffUntil(err)
	reason := err.Error()
	var b *fault.BackoffError
	if errors.As(err, &b) {
		reason = b.Reason
	}
	for range waiting {
		s.m.backedOff.WithLabelValues(backoffReason(reason)).Inc()
	}
	if s.pause.backOff(until, reason) {
		s.m.pausedUntil.Set(float64(until.UnixMilli()) / 1e3)
		s.log.Warn("the model asks to wait: its messages wait holding their leases, nothing is received meanwhile",
			"until", until.UTC(), "reason", reason, "messages", waiting)
	}
	if len(done) > 0 {
		s.outbox.promise(len(done))
		for _, t := range done {
			s.giveBack(t)
		}
		s.log.Info("a backoff came with part of the batch finished: its finished messages complete, the rest wait",
			"completed", len(done), "waiting", waiting)
		s.complete(done, doneOuts)
	}
	return os
}

// needOperator opens the circuit (fault.ErrNeedsOperator), or keeps it open
// after a probe that failed, for a run of n messages, which wait.
func (s *Subscriber) needOperator(n int, err error) {
	if s.pause.needOperator(err, time.Now(), s.cfg.OperatorProbe) {
		s.m.needsOperator.Set(1)
		s.log.Error("the model needs an operator: nothing is received, held messages wait holding their leases, "+
			"and one message runs as a probe every operator_probe until it gets through", "err", err,
			"messages", n, "operator_probe", s.cfg.OperatorProbe)
	} else {
		s.log.Warn("a probe of the model still needs an operator", "err", err, "next_probe_in", s.cfg.OperatorProbe)
	}
}

// probeDone closes the circuit after a probe that did not need an
// operator.
func (s *Subscriber) probeDone() {
	if s.pause.probed() {
		s.m.needsOperator.Set(0)
		s.log.Info("a probe got through: the model takes work again; receiving resumes")
	}
}

// awaitTurn waits while the model asks to wait and returns the tasks to run
// now: all of them, or the first alone as the probe of an open circuit
// (probe), with the rest to run after it. A task whose lease cannot be held
// to the wait's end is handed back meanwhile (a fresh copy, visible when
// the wait ends), and shutdown hands back every task still waiting; run is
// empty when none is left.
func (s *Subscriber) awaitTurn(ctx context.Context, tasks []*task) (run, rest []*task, probe bool) {
	var waiting []*lease // marked waiting in the keeper, counted in the gauge
	defer func() {
		if waiting != nil {
			s.keeper.setWaiting(waiting, false)
			s.m.modelWaiting.Sub(float64(len(waiting)))
			s.pause.addWaiter(-1)
		}
	}()
	for {
		now := time.Now()
		ok, probe, wake, changed := s.pause.turn(now)
		if ok {
			if probe {
				return tasks[:1], tasks[1:], true
			}
			return tasks, nil, false
		}
		if waiting == nil {
			for _, t := range tasks {
				waiting = append(waiting, t.lease)
			}
			s.keeper.setWaiting(waiting, true)
			s.m.modelWaiting.Add(float64(len(waiting)))
			s.pause.addWaiter(1)
		}
		// Hand back what cannot wait longer holding its lease.
		kept := tasks[:0]
		next := wake
		for _, t := range tasks {
			limit := s.leaseLimit(t.lease)
			if !now.Before(limit) {
				s.end(t, endHandBack(s.pause.wakeAt(now).Sub(now), "wait"))
				continue
			}
			if next.IsZero() || limit.Before(next) {
				next = limit
			}
			kept = append(kept, t)
		}
		tasks = kept
		if len(tasks) == 0 {
			return nil, nil, false
		}
		var timer *time.Timer
		var fired <-chan time.Time
		if !next.IsZero() {
			timer = time.NewTimer(next.Sub(now))
			fired = timer.C
		}
		select {
		case <-changed:
		case <-fired:
		case <-ctx.Done():
		case <-s.stopping:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil || s.isStopping() {
			for _, t := range tasks {
				s.end(t, endHandBack(0, "shutdown"))
			}
			return nil, nil, false
		}
	}
}

// waitToReceive blocks the poller while the model asks to wait, and
// returns how many messages it may receive (-1: no limit; 1: a probe's);
// false when ctx ends first.
func (s *Subscriber) waitToReceive(ctx context.Context) (int, bool) {
	for {
		n, wake, changed := s.pause.receive(time.Now(), s.cfg.OperatorProbe)
		if n != 0 {
			return n, true
		}
		var timer <-chan time.Time
		var t *time.Timer
		if !wake.IsZero() {
			t = time.NewTimer(time.Until(wake))
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
			return 0, false
		}
	}
}

// receiveContext is ctx, cancelled also when the model opens the circuit
// while the receive is in flight: an operator stop does not wait out a
// long poll. (A backoff lets it answer: what it brings waits, holding its
// leases, like any message held.) stop releases its resources.
func (s *Subscriber) receiveContext(ctx context.Context) (rctx context.Context, stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	if _, op := s.pause.watch(); op != nil {
		return rctx, cancel // a probe's receive: the circuit is open already
	}
	go func() {
		for {
			changed, op := s.pause.watch()
			if op != nil {
				cancel()
				return
			}
			select {
			case <-changed:
			case <-done:
				return
			}
		}
	}()
	return rctx, func() { close(done); cancel() }
}
