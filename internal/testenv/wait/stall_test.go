package wait

import (
	"testing"
	"testing/synctest"
	"time"
)

// fixedDeadline is a test binary's -timeout, as Deadline reports it.
type fixedDeadline struct {
	at time.Time
	ok bool
}

func (d fixedDeadline) Deadline() (time.Time, bool) { return d.at, d.ok }

// A Stall gives up only after its state has not changed for its limit,
// however long the state keeps changing, and when the deadline is near.
func TestStallWaitsWhileStateMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		s := NewStall(fixedDeadline{}, time.Minute, func() any { return n })
		for range 10 { // ten minutes of progress, one change a minute less a second
			time.Sleep(time.Minute - time.Second)
			n++
			if s.Stalled() {
				t.Fatalf("stalled at %d although the state changed %v ago", n, time.Minute-time.Second)
			}
		}
		time.Sleep(time.Minute - time.Second)
		if s.Stalled() {
			t.Fatal("stalled before its limit")
		}
		time.Sleep(time.Second)
		if !s.Stalled() {
			t.Fatalf("not stalled after the state stood still for %v", s.For())
		}

		near := NewStall(fixedDeadline{time.Now().Add(deadlineMargin - time.Second), true}, time.Hour, func() any { return n })
		if !near.Stalled() {
			t.Error("not stalled with the test's deadline within its margin")
		}
	})
}
