package subscriber

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/vramq/vramq/model/backend"
)

// admission hands out named resources, each a weighted semaphore: the
// weight, whose units depend on the strategy (bytes for vram, messages for
// count and none), and under vram the resources the model offers besides
// memory (backend.Offerer: a model server's request slots and rate-limit
// tokens), each a resizable admission of its own. A message needs some of
// each (need), taken together by take or tryTake and given back together
// by putBack, so that no path holds one without the others.
//
// semaphore.Weighted is FIFO: a large message at the head waits for room and
// the smaller ones behind it wait too. That is deliberate: skipping ahead
// would starve large messages, and the backpressure bound releases a head
// that waits too long.
//
// Under vram the budget changes while running (another process on the GPU
// takes or gives back memory), and a semaphore.Weighted cannot be resized. So
// the semaphore is sized at the largest budget the device could ever give
// (size), and the admission itself holds the difference between that and the
// budget now as withheld weight. Growing releases withheld weight. Shrinking
// acquires more of it, in the semaphore's FIFO like any message: it waits
// until running work lets go of enough, and every message that asks after it
// waits behind it, so nothing new is admitted until what is in flight is
// under the new budget. A shrink still waiting is a pending one; a newer
// target or close cancels it.
type admission struct {
	strategy Strategy
	// size is the semaphore's: the largest budget (vram), the count, or
	// unbounded (none).
	size int64
	sem  *semaphore.Weighted
	// pools are the resources the model offers (backend.Offerer), nil for
	// one it does not; offerer is nil when it offers none. How much of
	// each changes with what the model says it can take now (resized by
	// the budget refresh, as the weight is), up to most.
	offerer backend.Offerer
	pools   [backend.NumResources]*admission
	most    backend.Vector

	// held is the weight work holds (not the withheld weight) and acquires
	// counts work's acquisitions: together they tell the budget refresh
	// that none of this process's work was on the device during a read.
	held     atomic.Int64
	acquires atomic.Int64
	// holds counts the holds (admission.go) taken and not yet released:
	// none once the last message has ended, and a run that outlived its
	// timeout has returned.
	holds atomic.Int64
	// target is the budget admission works towards: size less withheld
	// weight, once pending shrinks are through.
	target atomic.Int64

	mu       sync.Mutex
	withheld int64     // weight the admission holds itself
	pending  []*shrink // acquisitions of more withheld weight still waiting, oldest first
	// exclusive counts exclusive runs waiting or running: resizes wait
	// for them to end (see acquireAll).
	exclusive int
	closed    bool
}

// need is what one message takes of admission's resources: its weight
// and what it takes of each resource the model offers (0 of one it does
// not).
type need struct {
	weight int64
	res    backend.Vector
}

// offer gives admission the resources o offers, a pool for each with a
// most above 0.
func (a *admission) offer(o backend.Offerer) error {
	now, most := o.Offers()
	for r := range backend.NumResources {
		if most[r] <= 0 {
			continue
		}
		p, err := newResizableAdmission(AdmitVRAM, offered(now[r], most[r]), most[r], 0)
		if err != nil {
			return fmt.Errorf("the model's %s: %w", r, err)
		}
		a.pools[r] = p
		a.offerer = o
	}
	a.most = most
	return nil
}

// offered is the size of a pool for an offer of now, at most most: never
// below 1, so that a message is always admitted, alone, however little a
// model offers. A model server whose rate limits are spent by other
// clients offers nothing, and learns its share again only from the
// answers to requests it sends: a pool of none would admit no message,
// and no answer would ever raise it.
func offered(now, most int64) int64 { return min(max(now, 1), most) }

// take waits, under ctx, until all of n is free and takes it; on an error
// it holds none of it. The model's resources are taken before the weight:
// a model server's slots and rate tokens run out long before its memory,
// and a message waiting for them must not hold weight that messages of
// the other endpoints could run with.
func (a *admission) take(ctx context.Context, n need) error {
	var got need
	for r, p := range a.pools {
		if p == nil || n.res[r] <= 0 {
			continue
		}
		if err := p.acquire(ctx, n.res[r]); err != nil {
			a.putBack(got)
			return err
		}
		got.res[r] = n.res[r]
	}
	if err := a.acquire(ctx, n.weight); err != nil {
		a.putBack(got)
		return err
	}
	return nil
}

// tryTake takes all of n if it is free now, else nothing.
func (a *admission) tryTake(n need) bool {
	var got need
	for r, p := range a.pools {
		if p == nil || n.res[r] <= 0 {
			continue
		}
		if !p.tryAcquire(n.res[r]) {
			a.putBack(got)
			return false
		}
		got.res[r] = n.res[r]
	}
	if !a.tryAcquire(n.weight) {
		a.putBack(got)
		return false
	}
	return true
}

// putBack gives back n, taken by take or tryTake (the weight also by
// acquireAll).
func (a *admission) putBack(n need) {
	if n.weight > 0 {
		a.giveBack(n.weight)
	}
	for r, p := range a.pools {
		if p != nil && n.res[r] > 0 {
			p.giveBack(n.res[r])
		}
	}
}

// fit is n with what it takes of each resource no more than is offered
// now, and nothing of one that is not: a message that needs more than
// there is takes it all, and one waiting for more than a shrink left would
// wait until the admit timeout.
func (a *admission) fit(n need) need {
	for r, p := range a.pools {
		if p == nil {
			n.res[r] = 0
			continue
		}
		n.res[r] = min(n.res[r], max(p.budget(), 1))
	}
	return n
}

// shrink is one acquisition of withheld weight, in its own goroutine so
// that the semaphore's FIFO decides when it goes through.
type shrink struct {
	n      int64
	cancel context.CancelFunc
	done   chan struct{}
	got    bool // whether it acquired; written before done closes
}

// newResizableAdmission returns an admission that starts at budget and can be
// resized up to largest (vram only; the other strategies ignore both).
func newResizableAdmission(s Strategy, budget, largest int64, count int) (*admission, error) {
	a := &admission{strategy: s}
	switch s {
	case AdmitVRAM:
		// A budget of 0 waits for the refresh to grow it; a device that
		// could never give one is refused.
		if budget < 0 || max(largest, budget) <= 0 {
			return nil, fmt.Errorf("admission: VRAM budget is %d bytes; the device has no room for work", budget)
		}
		a.size = max(largest, budget)
	case AdmitCount:
		if count <= 0 {
			return nil, fmt.Errorf("admission: count strategy needs a positive count, got %d", count)
		}
		a.size = int64(count)
		budget = a.size
	case AdmitNone:
		// Effectively unbounded, yet still a semaphore so that an exclusive
		// run can wait for everything else to drain.
		a.size = math.MaxInt64
		budget = a.size
	default:
		return nil, fmt.Errorf("admission: unknown strategy %q (want vram, count or none)", s)
	}
	a.sem = semaphore.NewWeighted(a.size)
	a.withheld = a.size - budget
	a.sem.TryAcquire(a.withheld) // a fresh semaphore has it all
	a.target.Store(budget)
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

// fits reports whether a message of this cost can ever be admitted: under
// vram, whether it fits the largest budget, not the budget now, since memory
// another process holds for a while may come back. Only the vram strategy
// knows: the others learn by running out of memory.
func (a *admission) fits(cost int64) bool {
	return a.strategy != AdmitVRAM || cost <= a.size
}

// budget is the budget now: what admission hands out once pending shrinks
// are through (nothing new is admitted until then).
func (a *admission) budget() int64 { return a.target.Load() }

func (a *admission) acquire(ctx context.Context, w int64) error {
	if err := a.sem.Acquire(ctx, w); err != nil {
		return err
	}
	a.took(w)
	return nil
}

func (a *admission) tryAcquire(w int64) bool {
	if !a.sem.TryAcquire(w) {
		return false
	}
	a.took(w)
	return true
}

func (a *admission) took(w int64) {
	a.held.Add(w)
	a.acquires.Add(1)
}

// giveBack returns weight taken by acquire, tryAcquire or acquireAll.
func (a *admission) giveBack(w int64) {
	a.held.Add(-w)
	a.sem.Release(w)
}

// resize makes target the budget (clamped to 0..size) and returns the one
// it replaces. While an exclusive run waits or runs, the change only waits
// for it to end.
func (a *admission) resize(target int64) (old int64) {
	target = min(max(target, 0), a.size)
	a.mu.Lock()
	defer a.mu.Unlock()
	old = a.target.Swap(target)
	if a.exclusive == 0 && !a.closed {
		a.apply()
	}
	return old
}

// apply moves the withheld weight, with what is pending, to size − target.
// A further shrink keeps the pending ones where they are in the FIFO and
// queues the difference behind them. A growth cancels the pending shrinks it
// makes needless, newest first; one it only partly undoes stays queued, and
// what it withholds beyond the target is released once it goes through:
// cancelling it and queueing a smaller one at the back would let the
// messages queued meanwhile in past both budgets. Called with mu held.
func (a *admission) apply() {
	want := a.size - a.target.Load()
	a.fold()
	for n := len(a.pending); n > 0 && a.withheld+a.pendingSum()-a.pending[n-1].n >= want; n = len(a.pending) {
		a.cancelNewest()
	}
	if a.withheld > want { // nothing is pending here
		a.sem.Release(a.withheld - want)
		a.withheld = want
	}
	more := want - a.withheld - a.pendingSum()
	if more > 0 && len(a.pending) == 0 && a.sem.TryAcquire(more) {
		a.withheld += more // room already: nothing to wait for
		return
	}
	// Queued from a goroutine of its own, the shrink may take a moment to
	// be in the FIFO, and a message asking meanwhile may still be admitted
	// within the old budget: a moment more than the readings take anyway
	// to notice another process.
	if more > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		p := &shrink{n: more, cancel: cancel, done: make(chan struct{})}
		a.pending = append(a.pending, p)
		go func() {
			p.got = a.sem.Acquire(ctx, p.n) == nil
			// done closes before mu is taken: cancelNewest waits for
			// it with mu held.
			close(p.done)
			if !p.got {
				return
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.exclusive == 0 && !a.closed {
				a.apply() // releases what a growth meanwhile left over
			} else {
				a.fold()
			}
		}()
	}
}

// fold moves shrinks that went through from pending to withheld. Called
// with mu held.
func (a *admission) fold() {
	left := a.pending[:0]
	for _, p := range a.pending {
		select {
		case <-p.done:
			p.cancel()
			if p.got {
				a.withheld += p.n
			}
		default:
			left = append(left, p)
		}
	}
	clear(a.pending[len(left):])
	a.pending = left
}

// cancelNewest cancels the newest pending shrink and waits for it, which is
// prompt: Acquire returns as soon as its context ends. Called with mu held.
func (a *admission) cancelNewest() {
	p := a.pending[len(a.pending)-1]
	a.pending[len(a.pending)-1] = nil
	a.pending = a.pending[:len(a.pending)-1]
	p.cancel()
	<-p.done
	if p.got { // it went through as it was cancelled
		a.withheld += p.n
	}
}

func (a *admission) pendingSum() int64 {
	var n int64
	for _, p := range a.pending {
		n += p.n
	}
	return n
}

// acquireAll waits until no other work is admitted and takes the whole
// budget: the exclusive run after an out-of-memory error. It returns the
// weight taken, to be released like any other; call endExclusive after
// that, whatever acquireAll returned.
//
// The weight is size less what is withheld and pending: the budget the
// pending shrinks lead to. They stay ahead of it in the FIFO, so it goes
// through once they have and nothing else holds anything, and no resize may
// change the withheld weight from here to endExclusive: a growth would let
// other work in beside the exclusive run, and a shrink queued ahead of it
// would leave it waiting for weight that never comes back.
func (a *admission) acquireAll(ctx context.Context) (int64, error) {
	a.mu.Lock()
	a.exclusive++
	a.fold()
	n := a.size - a.withheld - a.pendingSum()
	a.mu.Unlock()
	if err := a.acquire(ctx, n); err != nil {
		return 0, err
	}
	return n, nil
}

// endExclusive ends what acquireAll began and applies the latest budget if
// it changed meanwhile.
func (a *admission) endExclusive() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.exclusive--
	if a.exclusive == 0 && !a.closed {
		a.apply()
	}
}

// close cancels pending shrinks, so that no goroutine outlives the
// subscriber, and stops further resizes.
func (a *admission) close() {
	for _, p := range a.pools {
		if p != nil {
			p.close()
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	for len(a.pending) > 0 {
		a.cancelNewest()
	}
}
