package subscriber

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
)

// holdSubscriber is the least of a subscriber that holds work: an
// admission of budget bytes under vram and its in-flight count.
func holdSubscriber(t *testing.T, budget int64) *Subscriber {
	t.Helper()
	a, err := newAdmission(AdmitVRAM, budget, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	return &Subscriber{admitting: admitting{adm: a}, m: newMetrics(prometheus.NewRegistry(), backend.DeviceBytes)}
}

// unreleased reports what admission still counts as held once every message
// has ended: open holds, weight or bytes in flight. Each is a give-back
// missed somewhere.
func unreleased(s *Subscriber) error {
	holds, weight, bytes := s.adm.holds.Load(), s.adm.held.Load(), s.inflight.Load()
	if holds == 0 && weight == 0 && bytes == 0 {
		return nil
	}
	return fmt.Errorf("admission still holds %d holds, %d units of weight, %d bytes in flight", holds, weight, bytes)
}

// A hold is released once: a second release gives nothing back twice (a
// semaphore released more than it holds panics), and the message's weight
// and bytes are back after the first.
func TestHoldReleasesOnce(t *testing.T) {
	s := holdSubscriber(t, 100)
	if !s.adm.tryAcquire(60) {
		t.Fatal("no room for 60 of 100")
	}
	h := s.newHold(need{weight: 60}, 60)
	if s.inflight.Load() != 60 || s.PeakBytes() != 60 || s.adm.holds.Load() != 1 {
		t.Fatalf("in flight %d, peak %d, holds %d; want 60, 60, 1", s.inflight.Load(), s.PeakBytes(), s.adm.holds.Load())
	}
	h.release()
	h.release()
	s.giveBack(&task{hold: h}) // an end after the runner let go (message.go)
	if err := unreleased(s); err != nil {
		t.Fatal(err)
	}
	if !s.adm.tryAcquire(100) || s.adm.tryAcquire(1) {
		t.Fatal("the budget of 100 is not whole again, and only whole, after a double release")
	}
	var none *hold // a message never admitted
	none.release()
}

// A hold never released is seen: admission still counts it, its weight and
// its bytes, which is what the harness checks after every shutdown.
func TestMissedReleaseIsSeen(t *testing.T) {
	s := holdSubscriber(t, 100)
	if !s.adm.tryAcquire(30) {
		t.Fatal("no room")
	}
	kept := s.newHold(need{weight: 30}, 30)
	if err := unreleased(s); err == nil {
		t.Fatal("a hold never released went unseen")
	}
	kept.release()
	if err := unreleased(s); err != nil {
		t.Fatal(err)
	}
}

// A run that outlives its timeout keeps the weight, handed over, until the
// model returns, while the message's release gives back its bytes only.
func TestHoldHandOver(t *testing.T) {
	s := holdSubscriber(t, 100)
	if !s.adm.tryAcquire(70) {
		t.Fatal("no room")
	}
	a, b := s.newHold(need{weight: 40}, 40), s.newHold(need{weight: 30}, 30)
	waiting := s.handOver(a, b)
	a.release()
	b.release()
	if s.inflight.Load() != 0 || s.adm.held.Load() != 70 || s.adm.tryAcquire(31) {
		t.Fatalf("in flight %d, weight %d after the messages' release; want 0, 70 (still with the model)",
			s.inflight.Load(), s.adm.held.Load())
	}
	waiting.release() // the model returned
	if err := unreleased(s); err != nil {
		t.Fatal(err)
	}
}

// Run alone: a hold yields its share, takes the whole budget, and its
// release gives the budget back before the exclusive run ends, which
// applies a resize that waited for it.
func TestHoldTakesAllAndEndsExclusive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := holdSubscriber(t, 100)
		if !s.adm.tryAcquire(20) || !s.adm.tryAcquire(30) {
			t.Fatal("no room")
		}
		alone, other := s.newHold(need{weight: 20}, 20), s.newHold(need{weight: 30}, 30)
		alone.yieldWeight()
		if s.adm.held.Load() != 30 || s.inflight.Load() != 50 {
			t.Fatalf("weight %d, bytes %d after yielding; want 30, 50 (the bytes stay)", s.adm.held.Load(), s.inflight.Load())
		}
		got := make(chan int64, 1)
		go func() {
			n, err := alone.takeAll(t.Context())
			if err != nil {
				t.Error(err)
			}
			got <- n
		}()
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("took the whole budget while other work held part of it")
		}
		other.release()
		if n := <-got; n != 100 {
			t.Fatalf("took %d, want the whole budget, 100", n)
		}
		s.adm.resize(50) // waits for the exclusive run
		if s.adm.withheldNow() != 0 {
			t.Fatal("a resize went through during the exclusive run")
		}
		alone.release()
		alone.release()
		synctest.Wait()
		if s.adm.withheldNow() != 50 || s.adm.budget() != 50 {
			t.Fatalf("withheld %d, budget %d after the exclusive run; want 50, 50", s.adm.withheldNow(), s.adm.budget())
		}
		if err := unreleased(s); err != nil {
			t.Fatal(err)
		}
	})
}

// A hold that cannot take the budget (shutdown) ends the exclusive run and
// keeps nothing; one released already takes nothing.
func TestHoldTakeAllFails(t *testing.T) {
	s := holdSubscriber(t, 100)
	h := s.newHold(need{weight: 0}, 10)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if !s.adm.tryAcquire(1) {
		t.Fatal("no room")
	}
	if _, err := h.takeAll(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("takeAll under a cancelled context: %v", err)
	}
	s.adm.giveBack(1)
	h.release()
	if _, err := h.takeAll(t.Context()); !errors.Is(err, errReleased) {
		t.Fatalf("takeAll on a released hold: %v", err)
	}
	if err := unreleased(s); err != nil {
		t.Fatal(err)
	}
	if s.adm.resize(60); s.adm.budget() != 60 || s.adm.withheldNow() != 40 {
		t.Fatalf("budget %d, withheld %d: an exclusive run did not end", s.adm.budget(), s.adm.withheldNow())
	}
}

// slottedModel is a backend on the test model with request slots
// (backend.Offerer): each item is a request, and it counts the most items
// it ran at once.
type slottedModel struct {
	*testModel
	slots         int64
	now           atomic.Int64 // the slots it offers now, when not 0; slots otherwise
	running, most atomic.Int64
}

func (m *slottedModel) Offers() (now, most backend.Vector) {
	now[backend.Slots], most[backend.Slots] = m.slots, m.slots
	if n := m.now.Load(); n > 0 {
		now[backend.Slots] = n
	}
	return now, most
}

func (m *slottedModel) Needs(_ string, items []job.Item) backend.Vector {
	return backend.Vector{backend.Slots: int64(len(items))}
}

func (m *slottedModel) Cost(_ string, items []job.Item) int64 { return m.testModel.Cost(items) }

func (m *slottedModel) Run(ctx context.Context, _ string, items []job.Item) ([]job.Output, error) {
	n := m.running.Add(int64(len(items)))
	for most := m.most.Load(); n > most && !m.most.CompareAndSwap(most, n); most = m.most.Load() {
	}
	defer m.running.Add(-int64(len(items)))
	return m.testModel.Run(ctx, items)
}

// startSlotted starts a subscriber on a slottedModel of slots, with
// memory for every message.
func startSlotted(t *testing.T, slots int64) (*harness, *slottedModel) {
	t.Helper()
	var model *slottedModel
	h := startWith(t, 1<<30, Config{MaxBatch: 8, Prefetch: 20}, func(h *harness, c *Config) {
		model = &slottedModel{testModel: h.model, slots: slots}
		c.Backend = model
	})
	return h, model
}

// A model that runs only so many requests at once (a model server's
// concurrency) is admitted no more than its slots, though memory would take
// all: the rest wait unstarted, where a job's cancel still reaches them.
// A message needing more slots than there are takes them all and runs.
func TestAdmissionHoldsToTheModelsSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, model := startSlotted(t, 4)
		for i := range 12 {
			h.send("job", i, "mb=1 ms=1000", "mb=1 ms=1000")
		}
		h.send("big", 0, "mb=1 ms=10", "mb=1 ms=10", "mb=1 ms=10", "mb=1 ms=10", "mb=1 ms=10", "mb=1 ms=10")
		wait.For(t, time.Minute, "13 results", func() bool { r, _ := h.results.Stats(); return r == 13 })
		if most := model.most.Load(); most > 6 {
			t.Errorf("%d requests ran at once; want at most 4 (6 for the message that takes every slot)", most)
		}
		h.shutdown()
		if n := h.sub.adm.pools[backend.Slots].tryAcquire(4); !n {
			t.Error("the slots are not all back after shutdown")
		}
	})
}

// The slots follow what the model can run now: a model that offers fewer
// (its concurrency halved, its requests slower) is admitted fewer requests
// once two budget refreshes in a row read it, and more again once it
// offers them.
func TestAdmissionFollowsTheModelsSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, model := startSlotted(t, 8)
		model.now.Store(2)
		time.Sleep(3 * h.sub.cfg.BudgetRefresh) // two offers that agree
		if got := h.sub.adm.pools[backend.Slots].budget(); got != 2 {
			t.Fatalf("%d slots after the model offers 2; want 2", got)
		}
		for i := range 8 {
			h.send("job", i, "mb=1 ms=1000")
		}
		wait.For(t, time.Minute, "8 results", func() bool { r, _ := h.results.Stats(); return r == 8 })
		if most := model.most.Load(); most > 2 {
			t.Errorf("%d requests ran at once; want at most the 2 slots offered", most)
		}
		model.most.Store(0)
		model.now.Store(8)
		time.Sleep(3 * h.sub.cfg.BudgetRefresh) // two offers that agree
		for i := range 8 {
			h.send("job", 8+i, "mb=1 ms=1000")
		}
		wait.For(t, time.Minute, "16 results", func() bool { r, _ := h.results.Stats(); return r == 16 })
		if most := model.most.Load(); most <= 2 {
			t.Errorf("%d requests ran at once after the model offers 8 slots again; want more than 2", most)
		}
		h.shutdown()
	})
}

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
