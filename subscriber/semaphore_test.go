package subscriber

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
)

// The resizable admission alone.

// offering is a model's offer of resources (backend.Offerer) that tests
// set: each item takes one slot and 10 rate tokens.
type offering struct {
	now, most backend.Vector
}

func (o *offering) Offers() (now, most backend.Vector) { return o.now, o.most }

func (o *offering) Needs(_ string, items []job.Item) backend.Vector {
	return backend.Vector{backend.Slots: int64(len(items)), backend.RateTokens: 10 * int64(len(items))}
}

// A message's need (its weight and what it takes of each resource the
// model offers) is taken whole or not at all: a try or a wait that cannot
// have every part keeps none of them, so that no message holds slots while
// it waits for memory or rate tokens it never gets, nor memory while it
// waits for slots.
func TestNeedTakenWholeOrNotAtAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, err := newAdmission(AdmitVRAM, 100, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer a.close()
		all := backend.Vector{backend.Slots: 4, backend.RateTokens: 50}
		if err := a.offer(&offering{now: all, most: all}); err != nil {
			t.Fatal(err)
		}
		n := func(weight, slots, tokens int64) need {
			return need{weight: weight, res: backend.Vector{backend.Slots: slots, backend.RateTokens: tokens}}
		}
		for _, tc := range []struct {
			name        string
			held, asked need
		}{
			{"weight", n(90, 1, 10), n(20, 2, 10)},
			{"slots", n(1, 4, 10), n(10, 1, 10)},
			{"rate tokens", n(1, 1, 45), n(10, 1, 10)},
		} {
			if !a.tryTake(tc.held) {
				t.Fatalf("%s: no room for %+v", tc.name, tc.held)
			}
			if a.tryTake(tc.asked) {
				t.Fatalf("%s: took %+v beside %+v", tc.name, tc.asked, tc.held)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			if err := a.take(ctx, tc.asked); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s: take of %+v beside %+v: %v; want the deadline's error", tc.name, tc.asked, tc.held, err)
			}
			cancel()
			a.putBack(tc.held)
			if whole := n(100, 4, 50); !a.tryTake(whole) {
				t.Fatalf("after a try and a wait for %s that were not free: %+v is not all free", tc.name, whole)
			} else {
				a.putBack(whole)
			}
		}
	})
}

// What a message takes of a resource is no more than is offered now (it
// then runs with nothing else holding any), and nothing of a resource the
// model does not offer.
func TestNeedFitsTheOffer(t *testing.T) {
	a, err := newAdmission(AdmitVRAM, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	if err := a.offer(&offering{now: backend.Vector{backend.Slots: 4}, most: backend.Vector{backend.Slots: 8}}); err != nil {
		t.Fatal(err)
	}
	got := a.fit(need{weight: 5, res: backend.Vector{backend.Slots: 6, backend.RateTokens: 60}})
	if want := (need{weight: 5, res: backend.Vector{backend.Slots: 4}}); got != want {
		t.Errorf("fit: %+v; want %+v", got, want)
	}
}

func TestAdmissionGrowsAndShrinks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, err := newResizableAdmission(AdmitVRAM, 60, 100, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer a.close()
		if a.budget() != 60 || a.withheldNow() != 40 || !a.fits(100) || a.fits(101) {
			t.Fatalf("budget %d, withheld %d, fits(100) %v, fits(101) %v; want 60, 40, true, false",
				a.budget(), a.withheldNow(), a.fits(100), a.fits(101))
		}
		if !a.tryAcquire(60) || a.tryAcquire(1) {
			t.Fatal("a budget of 60 did not give exactly 60")
		}
		a.giveBack(60)
		if old := a.resize(100); old != 60 {
			t.Errorf("resize returned %d, want the old budget 60", old)
		}
		if !a.tryAcquire(100) {
			t.Fatal("grown to 100, yet 100 could not be taken")
		}
		a.giveBack(100)
		a.resize(30) // nothing in flight: at once
		if a.shrinking() || a.withheldNow() != 70 {
			t.Fatalf("shrinking %v, withheld %d; want false, 70", a.shrinking(), a.withheldNow())
		}
		if !a.tryAcquire(30) || a.tryAcquire(1) {
			t.Fatal("a budget of 30 did not give exactly 30")
		}
		a.giveBack(30)
		if a.resize(500); a.budget() != 100 { // clamped to the largest
			t.Errorf("budget %d after asking for more than the device, want 100", a.budget())
		}
		if a.resize(-5); a.budget() != 0 || a.tryAcquire(1) {
			t.Errorf("budget %d after a negative one; want 0, admitting nothing", a.budget())
		}
		a.close()
	})
}

// A shrink below what is in flight waits for work to let go, and every
// message that asks meanwhile waits behind it, even where the old budget had
// room: admission never hands out more than the new budget.
func TestAdmissionShrinkWaitsForReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _ := newAdmission(AdmitVRAM, 100, 0)
		defer a.close()
		if err := a.acquire(t.Context(), 70); err != nil {
			t.Fatal(err)
		}
		a.resize(50)
		synctest.Wait() // the shrink is in the FIFO
		if !a.shrinking() || a.budget() != 50 {
			t.Fatalf("shrinking %v, budget %d; want a pending shrink to 50", a.shrinking(), a.budget())
		}
		got := make(chan error, 1)
		go func() { got <- a.acquire(t.Context(), 20) }()
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("admitted 20 beside 70 with the budget shrinking to 50")
		}
		a.giveBack(20) // 50 in flight: the shrink goes through
		synctest.Wait()
		if a.shrinking() || a.withheldNow() != 50 {
			t.Fatalf("shrinking %v, withheld %d after in-flight came down to the budget", a.shrinking(), a.withheldNow())
		}
		if len(got) != 0 {
			t.Fatal("admitted 20 beside 50 with a budget of 50")
		}
		a.giveBack(30) // 20 in flight: room for the waiter
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if held := a.held.Load(); held != 40 || a.tryAcquire(11) {
			t.Errorf("%d held by work, or more admitted, with a budget of 50", held)
		}
		a.close()
	})
}

// A newer target cancels a pending shrink it makes needless; one it only
// partly undoes goes through first and the rest is given back after.
func TestAdmissionShrinkCancelledByGrowth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _ := newAdmission(AdmitVRAM, 100, 0)
		defer a.close()
		if err := a.acquire(t.Context(), 70); err != nil {
			t.Fatal(err)
		}
		a.resize(50)
		a.resize(100) // the other process let go again
		if a.shrinking() || a.withheldNow() != 0 {
			t.Fatalf("shrinking %v, withheld %d after growing back", a.shrinking(), a.withheldNow())
		}
		if !a.tryAcquire(30) {
			t.Fatal("no room for 30 beside 70 in a budget of 100")
		}
		a.giveBack(30)

		a.resize(40) // pending: 60 withheld wanted, 70 in flight
		synctest.Wait()
		a.resize(50) // partly undoes it
		if !a.shrinking() || a.budget() != 50 {
			t.Fatalf("shrinking %v, budget %d; want the first shrink still pending", a.shrinking(), a.budget())
		}
		a.giveBack(70)
		synctest.Wait()
		if a.shrinking() || a.withheldNow() != 50 {
			t.Fatalf("shrinking %v, withheld %d; want 50 withheld once through", a.shrinking(), a.withheldNow())
		}
		if !a.tryAcquire(50) || a.tryAcquire(1) {
			t.Fatal("a budget of 50 did not give exactly 50")
		}
		a.giveBack(50)
		a.close()
	})
}

// Closing cancels a pending shrink, so no goroutine outlives the subscriber
// (synctest fails the test if one does).
func TestAdmissionCloseCancelsShrink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _ := newAdmission(AdmitVRAM, 100, 0)
		defer a.close()
		if err := a.acquire(t.Context(), 70); err != nil {
			t.Fatal(err)
		}
		a.resize(10)
		a.close()
		if a.shrinking() || a.withheldNow() != 0 {
			t.Errorf("shrinking %v, withheld %d after close", a.shrinking(), a.withheldNow())
		}
		a.resize(100) // after close: recorded, nothing moves
		a.giveBack(70)
	})
}

// The exclusive run takes the budget the pending shrink leads to, behind it
// in the FIFO; a resize while it waits or runs waits for it to end.
func TestAdmissionExclusiveWithPendingShrink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _ := newAdmission(AdmitVRAM, 100, 0)
		defer a.close()
		if err := a.acquire(t.Context(), 70); err != nil {
			t.Fatal(err)
		}
		a.resize(50)
		synctest.Wait()
		type result struct {
			n   int64
			err error
		}
		got := make(chan result, 1)
		go func() {
			n, err := a.acquireAll(t.Context())
			got <- result{n, err}
		}()
		synctest.Wait()
		a.resize(20) // deferred
		if len(got) != 0 {
			t.Fatal("the exclusive run went while work was in flight")
		}
		a.giveBack(70)
		r := <-got
		if r.err != nil || r.n != 50 {
			t.Fatalf("exclusive run took %d (%v), want the shrunk budget 50", r.n, r.err)
		}
		if a.tryAcquire(1) || a.budget() != 20 {
			t.Fatalf("budget %d; or work admitted beside the exclusive run", a.budget())
		}
		a.giveBack(r.n)
		a.endExclusive() // applies 20
		synctest.Wait()
		if a.shrinking() || a.withheldNow() != 80 {
			t.Fatalf("shrinking %v, withheld %d after the exclusive run; want 80", a.shrinking(), a.withheldNow())
		}
		if !a.tryAcquire(20) || a.tryAcquire(1) {
			t.Fatal("a budget of 20 did not give exactly 20")
		}
		a.giveBack(20)

		// Cancelled while waiting: it ends, and resizes go on.
		if err := a.acquire(t.Context(), 20); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			n, err := a.acquireAll(ctx)
			got <- result{n, err}
		}()
		synctest.Wait()
		cancel()
		if r := <-got; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled exclusive run: %d, %v", r.n, r.err)
		}
		a.endExclusive()
		a.resize(100)
		if !a.tryAcquire(80) {
			t.Fatal("the budget did not grow after a cancelled exclusive run")
		}
		a.close()
	})
}

func TestAdmissionStrategies(t *testing.T) {
	for _, tc := range []struct {
		s                Strategy
		cost, weight     int64
		fits             bool
		size             int64
		budget           int64
		count            int
		wantErrForNoRoom bool
	}{
		{s: AdmitVRAM, budget: 100, cost: 40, weight: 40, fits: true, size: 100},
		{s: AdmitVRAM, budget: 100, cost: 101, weight: 101, fits: false, size: 100},
		{s: AdmitVRAM, budget: 100, cost: 0, weight: 1, fits: true, size: 100},
		{s: AdmitCount, budget: 100, count: 3, cost: 1000, weight: 1, fits: true, size: 3},
		{s: AdmitNone, budget: 100, cost: 1000, weight: 1, fits: true},
	} {
		a, err := newAdmission(tc.s, tc.budget, tc.count)
		if err != nil {
			t.Fatal(err)
		}
		if w, f := a.weight(tc.cost), a.fits(tc.cost); w != tc.weight || f != tc.fits {
			t.Errorf("%s cost %d: weight %d fits %v; want %d %v", tc.s, tc.cost, w, f, tc.weight, tc.fits)
		}
		if tc.size != 0 && a.size != tc.size {
			t.Errorf("%s: size %d, want %d", tc.s, a.size, tc.size)
		}
	}
	if _, err := newAdmission(AdmitVRAM, -5, 0); err == nil {
		t.Error("a negative budget was accepted")
	}
	if _, err := newAdmission(AdmitVRAM, 0, 0); err == nil {
		t.Error("a device that can never give a budget was accepted")
	}
	// Full now, but the device could give 100: nothing admitted until a
	// resize.
	a, err := newResizableAdmission(AdmitVRAM, 0, 100, 0)
	if err != nil || a.budget() != 0 || a.sem.TryAcquire(1) {
		t.Fatalf("a device full now: %v, budget %v; want an admission that admits nothing", err, a)
	}
	a.resize(100)
	if !a.sem.TryAcquire(60) {
		t.Error("nothing admitted after the budget grew")
	}
}

// The semaphore is FIFO: a large message at the head holds back smaller ones
// until it is admitted or gives up at its deadline.
func TestAdmissionIsFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _ := newAdmission(AdmitVRAM, 100, 0)
		if err := a.acquire(t.Context(), 70); err != nil {
			t.Fatal(err)
		}
		bigCtx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		bigDone := make(chan error, 1)
		go func() { bigDone <- a.acquire(bigCtx, 60) }()
		synctest.Wait()
		smallDone := make(chan error, 1)
		go func() { smallDone <- a.acquire(t.Context(), 10) }()
		synctest.Wait()
		select {
		case <-smallDone:
			t.Fatal("a small message overtook the large one waiting at the head")
		default:
		}
		if err := <-bigDone; err == nil {
			t.Fatal("the large one was admitted with no room")
		}
		if err := <-smallDone; err != nil { // the head gave up: the small one goes
			t.Fatal(err)
		}
	})
}

// newAdmission returns an admission whose budget cannot grow beyond where it
// starts; newResizableAdmission one that can.
func newAdmission(s Strategy, budget int64, count int) (*admission, error) {
	return newResizableAdmission(s, budget, budget, count)
}

// shrinking reports whether a shrink is still waiting for work to let go.
func (a *admission) shrinking() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fold()
	return len(a.pending) > 0
}

// withheldNow is the weight withheld, pending shrinks not counted.
func (a *admission) withheldNow() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fold()
	return a.withheld
}
