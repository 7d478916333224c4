package wait

import "time"

// deadlineMargin is what a Stall leaves of the test binary's -timeout: time
// for the test to report what it found rather than be killed mid-wait.
const deadlineMargin = 30 * time.Second

// A Stall tells a wait for a pipeline when to give up: once the pipeline's
// state has not changed for a while, not after a fixed time. A busy machine
// (other builds, the race detector) slows a pipeline down without stopping
// it, and a limit on the whole wait that suits an idle machine fails there;
// a limit on no progress does not, and still ends a wait on one that is
// stuck. It also gives up when the test binary's -timeout is near.
type Stall struct {
	t     deadliner
	limit time.Duration
	state func() any
	last  any
	since time.Time
}

// deadliner is a *testing.T, whose Deadline is -timeout's.
type deadliner interface{ Deadline() (time.Time, bool) }

// NewStall returns a Stall over state, whose values must be comparable
// with ==: a struct of counters, say.
func NewStall(t deadliner, limit time.Duration, state func() any) *Stall {
	return &Stall{t: t, limit: limit, state: state, last: state(), since: time.Now()}
}

// Stalled reports whether state has stayed the same for the limit (each
// change starts it again), or the test binary's deadline is near.
func (s *Stall) Stalled() bool {
	now := time.Now()
	if d, ok := s.t.Deadline(); ok && d.Sub(now) < deadlineMargin {
		return true
	}
	if v := s.state(); v != s.last {
		s.last, s.since = v, now
		return false
	}
	return now.Sub(s.since) >= s.limit
}

// For is how long it has been since state last changed.
func (s *Stall) For() time.Duration { return time.Since(s.since) }
