package modelserver

import (
	"context"
	"sync"
	"time"

	"github.com/vramq/vramq/job/fault"
)

// The gate holds every request back while the server has asked for a
// pause (a 429 with its wait, an overloaded server), and after the pause
// lets one request through alone, a probe: the others wait for its answer,
// so that a server coming back from overload, or a limit's window
// reopening, meets one request rather than all of them at once. A process
// starts probing too: the first request goes alone, and its answer's
// headers set the rate limits before the others are sent.
//
// After an answer that needs an operator (an exhausted quota, a refused
// key), every request fails at once with that answer's error for
// operatorRetry, then a probe asks the server again.
const operatorRetry = 30 * time.Second

type gate struct {
	mu        sync.Mutex
	until     time.Time
	reason    string
	probe     bool // the next request goes alone
	probing   bool // it is in flight
	overloads int  // overload answers without a wait since the last success
	opErr     error
	opUntil   time.Time
	changed   chan struct{}
	waits     *waits
}

func newGate(w *waits) *gate { return &gate{probe: true, changed: make(chan struct{}), waits: w} }

// enter waits until a request may go. probe says it goes alone: the caller
// must call leave with its outcome. A pause that ends after deadline
// returns a *fault.BackoffError at once.
func (g *gate) enter(ctx context.Context, deadline time.Time) (probe bool, err error) {
	for {
		g.mu.Lock()
		now := time.Now()
		if g.opErr != nil && now.Before(g.opUntil) {
			err := g.opErr
			g.mu.Unlock()
			return false, err
		}
		ch := g.changed
		var wait time.Duration
		switch {
		case now.Before(g.until):
			if g.until.After(deadline) {
				until, reason := g.until, g.reason
				g.mu.Unlock()
				return false, &fault.BackoffError{Until: until, Reason: reason}
			}
			wait = g.until.Sub(now)
		case g.probe && g.probing:
			wait = -1 // until the probe answers
		case g.probe:
			g.probing = true
			g.mu.Unlock()
			return true, nil
		default:
			g.mu.Unlock()
			return false, nil
		}
		g.mu.Unlock()
		if err := sleep(ctx, wait, ch); err != nil {
			return false, err
		}
	}
}

// closed reports whether a request that entered before now should not go
// out now: a pause or an operator's error came since.
func (g *gate) closed(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return now.Before(g.until) || g.opErr != nil && now.Before(g.opUntil)
}

// leave reports the outcome of a request that entered: a pause until
// until (zero: none), an operator error, or neither (the server answered
// and takes requests).
func (g *gate) leave(probe bool, until time.Time, reason string, opErr error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if probe {
		g.probing = false
	}
	switch {
	case opErr != nil:
		g.opErr, g.opUntil, g.probe = opErr, time.Now().Add(operatorRetry), true
	case !until.IsZero():
		if until.After(g.until) {
			g.until, g.reason = until, reason
		}
		g.probe = true
	case probe:
		g.probe, g.opErr = false, nil
	}
	close(g.changed)
	g.changed = make(chan struct{})
}

// latch is leave for an answer that needs an operator; it reports whether
// the gate was open until now (the first such answer, worth a log line).
func (g *gate) latch(probe bool, err error) bool {
	g.mu.Lock()
	first := g.opErr == nil
	g.mu.Unlock()
	g.leave(probe, time.Time{}, "", err)
	return first
}

// abandon is leave for a request that was never answered (its context
// ended, or it never got past the rate limits): a probe's turn passes on.
func (g *gate) abandon(probe bool) {
	if !probe {
		return
	}
	g.mu.Lock()
	g.probing = false
	close(g.changed)
	g.changed = make(chan struct{})
	g.mu.Unlock()
}

// overloaded returns the wait after an overload answer that named none,
// growing over such answers in a row (waits.overload).
func (g *gate) overloaded() time.Duration {
	g.mu.Lock()
	n := g.overloads
	g.overloads++
	g.mu.Unlock()
	return g.waits.overload(n)
}

func (g *gate) answered() {
	g.mu.Lock()
	g.overloads = 0
	g.mu.Unlock()
}

// sleep waits d (forever when negative), or until wake closes, or until
// ctx ends, which is its error.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	var timer <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-timer:
	case <-wake:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
