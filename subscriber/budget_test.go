package subscriber

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// The resizable admission alone.

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

// The subscriber, its budget following the device.

// otherProcess takes n bytes of the simulated device, as another process on
// the same GPU would. The test calls it only while its work leaves room.
func otherProcess(t *testing.T, dev *gpu.Sim, n int64) func() {
	t.Helper()
	free, err := dev.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return free
}

// Another process takes memory while the subscriber runs: the budget shrinks
// by as much, admission keeps within it and nothing runs out of memory; the
// memory comes back and so does the budget.
func TestBudgetFollowsAnotherProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, 64*mib, Config{MaxInflight: 40, BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			c.Model = workingModel{h.model}
		})
		full := h.sub.Budget()
		if full != 64*mib-1 || h.sub.MaxBudget() != full {
			t.Fatalf("budget %d, largest %d; want the device less the reserve", full, h.sub.MaxBudget())
		}
		h.mixed(20)
		waitFor(t, 5*time.Minute, "20 results", func() bool { r, _ := h.results.stats(); return r == 20 })
		if b := h.sub.Budget(); b != full {
			t.Fatalf("the subscriber's own batches moved the budget to %d", b)
		}

		release := otherProcess(t, h.dev, 24*mib)
		waitFor(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == full-24*mib })
		if g := int64(counter(h.sub.m.budget)); g != full-24*mib {
			t.Errorf("budget_bytes %d, want %d", g, full-24*mib)
		}
		if g := int64(counter(h.sub.m.deviceProcess)); g != 24*mib {
			t.Errorf("device_memory_process_bytes %d, want the 24 MiB the Sim counts", g)
		}
		h.sub.peak.Store(0) // what follows is admitted under the new budget
		for i := range 10 {
			h.send("shrunk", i, "mb=30 ms=200") // two at once would need 60 MiB of the 40 left
		}
		waitFor(t, 5*time.Minute, "10 more results", func() bool { r, _ := h.results.stats(); return r == 30 })
		if p := h.sub.PeakBytes(); p > full-24*mib || p == 0 {
			t.Errorf("admitted %d at once with a budget of %d", p, full-24*mib)
		}
		if n := h.dev.OOMs(); n != 0 {
			t.Errorf("%d out-of-memory errors with another process on the device", n)
		}

		release()
		waitFor(t, time.Minute, "the budget to grow back", func() bool { return h.sub.Budget() == full })
		h.sub.peak.Store(0)
		for i := range 10 {
			h.send("grown", i, "mb=30 ms=200")
		}
		waitFor(t, 5*time.Minute, "10 more results", func() bool { r, _ := h.results.stats(); return r == 40 })
		if p := h.sub.PeakBytes(); p != 60*mib {
			t.Errorf("admitted at most %d at once after growing back, want two large messages, 60 MiB", p)
		}
		h.shutdown()
		if n := h.dev.OOMs(); n != 0 {
			t.Errorf("%d out-of-memory errors", n)
		}
		if d, _ := h.dlq.stats(); d != 0 {
			t.Errorf("%d dead letters", d)
		}
	})
}

// A shrink below what is in flight admits nothing new until the work in
// flight lets go, even where the old budget had room for it; then the
// smaller budget holds.
func TestBudgetShrinkPendingAdmitsNothingNew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 72 MiB less an 8 MiB reserve: a budget of 64 MiB.
		h := startWith(t, 72*mib, Config{VRAMReserve: 8 * mib, MaxBatch: 1, BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			c.Model = workingModel{h.model}
		})
		h.send("hog", 0, "mb=40 ms=30000")
		waitFor(t, time.Minute, "the hog to run", func() bool { return h.model.runs.Load() == 1 })
		// 32 MiB free: the other process takes 28, into the reserve.
		release := otherProcess(t, h.dev, 28*mib)
		waitFor(t, 10*time.Second, "the budget to shrink", func() bool { return h.sub.Budget() == 36*mib })
		// The shrink queues in the FIFO from a goroutine of its own: wait
		// until it is there (a message asking in the instant before would
		// still be admitted within the old budget).
		synctest.Wait()
		if !h.sub.adm.shrinking() {
			t.Fatal("no pending shrink with 40 MiB in flight and a budget of 36 MiB")
		}
		for i := range 6 {
			h.send("small", i, "mb=4 ms=100") // the old budget had room for all six
		}
		time.Sleep(10 * time.Second) // the hog still runs
		if n := counter(h.sub.m.admitted); n != 1 {
			t.Errorf("%d admitted while the shrink waited, want the hog alone", n)
		}
		waitFor(t, 2*time.Minute, "7 results", func() bool { r, _ := h.results.stats(); return r == 7 })
		if h.sub.adm.shrinking() || h.sub.adm.withheldNow() != 28*mib {
			t.Errorf("shrinking %v, withheld %d; want the shrink through", h.sub.adm.shrinking(), h.sub.adm.withheldNow())
		}
		if n := h.dev.OOMs(); n != 0 {
			t.Errorf("%d out-of-memory errors", n)
		}
		release()
		waitFor(t, time.Minute, "the budget to grow back", func() bool { return h.sub.Budget() == 64*mib })
		if w := h.sub.adm.withheldNow(); w != 0 {
			t.Errorf("%d still withheld after growing back", w)
		}
		h.shutdown()
	})
}

// A message larger than the budget now, but not than the largest the device
// could give, waits and is handed back by the admit timeout, not
// dead-lettered: it runs once the other process lets go. One larger than the
// device could ever give is dead-lettered.
func TestMessageAboveShrunkBudgetWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, 64*mib, Config{AdmitTimeout: 10 * time.Second, BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			c.Model = workingModel{h.model}
		})
		release := otherProcess(t, h.dev, 32*mib)
		waitFor(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == 32*mib-1 })
		h.send("big", 0, "mb=40 ms=10")
		h.send("huge", 0, "mb=100")
		waitFor(t, time.Minute, "a backpressure release", func() bool {
			return counter(h.sub.m.released.WithLabelValues("now")) > 0
		})
		waitFor(t, time.Minute, "the huge one dead-lettered", func() bool { d, _ := h.dlq.stats(); return d == 1 })
		if n := h.model.runs.Load(); n != 0 {
			t.Errorf("ran %d batches with no room for the message", n)
		}
		release()
		waitFor(t, 2*time.Minute, "the result", func() bool { r, _ := h.results.stats(); return r == 1 })
		h.shutdown()
		got, _ := h.resultsByKey()
		if r, ok := got[job.Key{JobID: "big"}]; !ok || r.Attempt < 2 {
			t.Errorf("big: result %v at attempt %d; want it released and run later", ok, r.Attempt)
		}
		d := h.dlq.all()
		if len(d) != 1 || !strings.HasPrefix(d[0].attrs[job.AttrReason], "too_large") {
			t.Errorf("dead letters %d, first reason %q; want the huge one, too_large", len(d), d[0].attrs[job.AttrReason])
		}
	})
}

// A message that runs out of memory in a batch of one while a shrink is
// pending runs alone with the budget the shrink leads to, once the work in
// flight lets go: no deadlock between the two.
func TestExclusiveRunWithShrinkPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, 72*mib, Config{VRAMReserve: 8 * mib, MaxBatch: 1, BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			c.Model = workingModel{h.model}
		})
		h.send("hog", 0, "mb=40 ms=20000")
		// Admitted beside the hog; allocates 36 MiB after 10 s.
		h.send("liar", 0, "mb=4 lie=9 delay=10000 ms=100")
		waitFor(t, 5*time.Second, "both to run", func() bool { return h.model.runs.Load() == 2 })
		release := otherProcess(t, h.dev, 28*mib)
		defer release()
		waitFor(t, 9*time.Second, "a pending shrink", func() bool { return h.sub.Budget() == 36*mib && h.sub.adm.shrinking() })
		// The liar runs out of memory (4 MiB free), then alone once the
		// hog is done: 36 MiB of the 44 the other process leaves.
		waitFor(t, 2*time.Minute, "2 results", func() bool { r, _ := h.results.stats(); return r == 2 })
		h.shutdown()
		if n := counter(h.sub.m.oomRetries); n != 1 || h.dev.OOMs() != 1 {
			t.Errorf("%d OOM retries, %d OOMs; want the liar's one", n, h.dev.OOMs())
		}
		if d, _ := h.dlq.stats(); d != 0 {
			t.Errorf("%d dead letters", d)
		}
		if h.sub.adm.withheldNow() != 28*mib || h.sub.Budget() != 36*mib {
			t.Errorf("withheld %d, budget %d after the exclusive run; want 28 MiB, 36 MiB", h.sub.adm.withheldNow(), h.sub.Budget())
		}
	})
}

// Shutdown with a shrink pending exits within the grace: the shrink is
// cancelled rather than waited for, and every message is handed back.
func TestShutdownWithShrinkPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, 72*mib, Config{VRAMReserve: 8 * mib, MaxBatch: 1, BudgetRefresh: time.Second, ShutdownGrace: 2 * time.Second},
			func(h *harness, c *Config) { c.Model = workingModel{h.model} })
		h.send("hog", 0, "mb=40 ms=600000")
		waitFor(t, time.Minute, "the hog to run", func() bool { return h.model.runs.Load() == 1 })
		release := otherProcess(t, h.dev, 28*mib)
		defer release()
		waitFor(t, 10*time.Second, "a pending shrink", func() bool { return h.sub.adm.shrinking() })
		synctest.Wait() // the shrink is in the FIFO
		for i := range 4 {
			h.send("small", i, "mb=4")
		}
		time.Sleep(5 * time.Second)
		stopped := time.Now()
		h.shutdown()
		if took := time.Since(stopped); took >= 10*time.Minute {
			t.Errorf("shutdown waited %v, for the hog", took)
		}
		if live, invisible := h.work.stats(); live != 5 || invisible != 0 {
			t.Errorf("%d messages on the work queue, %d invisible; want all 5 handed back", live, invisible)
		}
		if h.sub.adm.shrinking() {
			t.Error("a shrink still pending after Run returned")
		}
	})
}

// A model that does not report its working set: the budget is read only
// while none of the subscriber's work is admitted, and still follows
// another process.
func TestBudgetWithoutWorkingSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{BudgetRefresh: time.Second})
		h.send("long", 0, "mb=30 ms=20000")
		waitFor(t, time.Minute, "it to run", func() bool { return h.model.runs.Load() == 1 })
		time.Sleep(10 * time.Second)
		if b := h.sub.Budget(); b != 64*mib-1 {
			t.Errorf("budget %d while busy, want it untouched", b)
		}
		waitFor(t, time.Minute, "the result", func() bool { r, _ := h.results.stats(); return r == 1 })
		release := otherProcess(t, h.dev, 16*mib)
		defer release()
		waitFor(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == 48*mib-1 })
		h.shutdown()
	})
}

// Under count admission the device is still read, for the gauges, and the
// budget left alone.
func TestCountAdmissionReadsDeviceOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{Admission: AdmitCount, BudgetRefresh: time.Second})
		release := otherProcess(t, h.dev, 16*mib)
		defer release()
		waitFor(t, time.Minute, "the free memory gauge", func() bool { return counter(h.sub.m.deviceFree) == 48*mib })
		if b := h.sub.Budget(); b != 64*mib-1 {
			t.Errorf("budget %d under count admission, want the one read at start", b)
		}
		h.shutdown()
	})
}

// failingDevice is a Sim whose memory cannot be read while fail is set.
type failingDevice struct {
	*gpu.Sim
	fail atomic.Bool
}

func (d *failingDevice) MemInfo() (gpu.MemInfo, error) {
	if d.fail.Load() {
		return gpu.MemInfo{}, errors.New("injected: NVML answers nothing")
	}
	return d.Sim.MemInfo()
}

// messages counts log records by message.
type messages struct {
	mu sync.Mutex
	n  map[string]int
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n[r.Message]++
	return nil
}
func (m *messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *messages) WithGroup(string) slog.Handler      { return m }
func (m *messages) count(prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, v := range m.n {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// While the device's memory cannot be read, the budget stays and one
// warning says so; once it answers, the budget follows it again.
func TestBudgetKeptWhileDeviceUnreadable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev := &failingDevice{}
		logs := &messages{n: map[string]int{}}
		h := startWith(t, 64*mib, Config{BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			dev.Sim = h.dev
			c.Device, c.Model, c.Logger = dev, workingModel{h.model}, slog.New(logs)
		})
		dev.fail.Store(true)
		release := otherProcess(t, h.dev, 16*mib)
		defer release()
		time.Sleep(10 * time.Second)
		if b := h.sub.Budget(); b != 64*mib-1 {
			t.Errorf("budget %d with the device unreadable, want the last one", b)
		}
		if n := logs.count("reading device memory failed"); n != 1 {
			t.Errorf("%d warnings for one streak of failures, want 1", n)
		}
		dev.fail.Store(false)
		waitFor(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == 48*mib-1 })
		if n := logs.count("budget changed"); n != 1 {
			t.Errorf("%d budget changes logged, want 1", n)
		}
		h.shutdown()
	})
}
