package subscriber

import (
	"context"
	"fmt"
	"math"

	"golang.org/x/sync/semaphore"
)

// Strategy is how messages are admitted onto the device.
type Strategy string

const (
	// AdmitVRAM weighs each message by its estimated working memory against
	// the device's memory budget: what vramq is for.
	AdmitVRAM Strategy = "vram"
	// AdmitCount runs at most N messages at once, whatever their size: the
	// usual fixed-semaphore fix, kept for comparison.
	AdmitCount Strategy = "count"
	// AdmitNone runs every message as soon as it is received: the naive
	// consumer, kept for comparison.
	AdmitNone Strategy = "none"
)

func (s Strategy) valid() bool {
	return s == AdmitVRAM || s == AdmitCount || s == AdmitNone
}

// admission is a weighted semaphore whose units depend on the strategy:
// bytes for vram, messages for count and none.
//
// semaphore.Weighted is FIFO: a large message at the head waits for room and
// the smaller ones behind it wait too. That is deliberate: skipping ahead
// would starve large messages, and the backpressure bound releases a head
// that waits too long.
type admission struct {
	strategy Strategy
	size     int64
	sem      *semaphore.Weighted
}

func newAdmission(s Strategy, budget int64, count int) (*admission, error) {
	a := &admission{strategy: s}
	switch s {
	case AdmitVRAM:
		if budget <= 0 {
			return nil, fmt.Errorf("admission: VRAM budget is %d bytes; the device has no room for work", budget)
		}
		a.size = budget
	case AdmitCount:
		if count <= 0 {
			return nil, fmt.Errorf("admission: count strategy needs a positive count, got %d", count)
		}
		a.size = int64(count)
	case AdmitNone:
		// Effectively unbounded, yet still a semaphore so that an exclusive
		// run can wait for everything else to drain.
		a.size = math.MaxInt64
	default:
		return nil, fmt.Errorf("admission: unknown strategy %q (want vram, count or none)", s)
	}
	a.sem = semaphore.NewWeighted(a.size)
	return a, nil
}

// weight is what a message of the given estimated cost takes from the
// semaphore.
func (a *admission) weight(cost int64) int64 {
	if a.strategy == AdmitVRAM {
		return max(cost, 1)
	}
	return 1
}

// fits reports whether a message of this cost can ever be admitted. Only the
// vram strategy knows: the others learn by running out of memory.
func (a *admission) fits(cost int64) bool {
	return a.strategy != AdmitVRAM || cost <= a.size
}

func (a *admission) acquire(ctx context.Context, w int64) error { return a.sem.Acquire(ctx, w) }
func (a *admission) release(w int64)                            { a.sem.Release(w) }
