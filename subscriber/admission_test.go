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
	return &Subscriber{admitting: admitting{adm: a}, m: newMetrics(prometheus.NewRegistry())}
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

// slottedModel is the test model with request slots (backend.Offerer):
// each item is a request, and it counts the most items it ran at once.
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

func (m *slottedModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
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
		c.Model = model
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
