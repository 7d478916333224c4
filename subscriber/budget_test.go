package subscriber

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
)

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
			c.Backend = backend.InProcess{Model: workingModel{h.model}}
		})
		full := h.sub.Budget()
		if full != 64*mib-1 || h.sub.MaxBudget() != full {
			t.Fatalf("budget %d, largest %d; want the device less the reserve", full, h.sub.MaxBudget())
		}
		h.mixed(20)
		wait.For(t, 5*time.Minute, "20 results", func() bool { r, _ := h.results.Stats(); return r == 20 })
		if b := h.sub.Budget(); b != full {
			t.Fatalf("the subscriber's own batches moved the budget to %d", b)
		}

		release := otherProcess(t, h.dev, 24*mib)
		wait.For(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == full-24*mib })
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
		wait.For(t, 5*time.Minute, "10 more results", func() bool { r, _ := h.results.Stats(); return r == 30 })
		if p := h.sub.PeakBytes(); p > full-24*mib || p == 0 {
			t.Errorf("admitted %d at once with a budget of %d", p, full-24*mib)
		}
		if n := h.dev.OOMs(); n != 0 {
			t.Errorf("%d out-of-memory errors with another process on the device", n)
		}

		release()
		wait.For(t, time.Minute, "the budget to grow back", func() bool { return h.sub.Budget() == full })
		h.sub.peak.Store(0)
		for i := range 10 {
			h.send("grown", i, "mb=30 ms=200")
		}
		wait.For(t, 5*time.Minute, "10 more results", func() bool { r, _ := h.results.Stats(); return r == 40 })
		if p := h.sub.PeakBytes(); p != 60*mib {
			t.Errorf("admitted at most %d at once after growing back, want two large messages, 60 MiB", p)
		}
		h.shutdown()
		if n := h.dev.OOMs(); n != 0 {
			t.Errorf("%d out-of-memory errors", n)
		}
		if d, _ := h.dlq.Stats(); d != 0 {
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
			c.Backend = backend.InProcess{Model: workingModel{h.model}}
		})
		h.send("hog", 0, "mb=40 ms=30000")
		wait.For(t, time.Minute, "the hog to run", func() bool { return h.model.runs.Load() == 1 })
		// 32 MiB free: the other process takes 28, into the reserve.
		release := otherProcess(t, h.dev, 28*mib)
		wait.For(t, 10*time.Second, "the budget to shrink", func() bool { return h.sub.Budget() == 36*mib })
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
		wait.For(t, 2*time.Minute, "7 results", func() bool { r, _ := h.results.Stats(); return r == 7 })
		if h.sub.adm.shrinking() || h.sub.adm.withheldNow() != 28*mib {
			t.Errorf("shrinking %v, withheld %d; want the shrink through", h.sub.adm.shrinking(), h.sub.adm.withheldNow())
		}
		if n := h.dev.OOMs(); n != 0 {
			t.Errorf("%d out-of-memory errors", n)
		}
		release()
		wait.For(t, time.Minute, "the budget to grow back", func() bool { return h.sub.Budget() == 64*mib })
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
			c.Backend = backend.InProcess{Model: workingModel{h.model}}
		})
		release := otherProcess(t, h.dev, 32*mib)
		wait.For(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == 32*mib-1 })
		h.send("big", 0, "mb=40 ms=10")
		h.send("huge", 0, "mb=100")
		wait.For(t, time.Minute, "a backpressure hand-back", func() bool {
			return counter(h.sub.m.handedBack.WithLabelValues("backpressure")) > 0
		})
		wait.For(t, time.Minute, "the huge one dead-lettered", func() bool { d, _ := h.dlq.Stats(); return d == 1 })
		if n := h.model.runs.Load(); n != 0 {
			t.Errorf("ran %d batches with no room for the message", n)
		}
		release()
		wait.For(t, 2*time.Minute, "the result", func() bool { r, _ := h.results.Stats(); return r == 1 })
		h.shutdown()
		got, _ := h.resultsByKey()
		// Handed back as a fresh copy, its receive count starts again: the
		// wait was not its fault.
		if r, ok := got[job.Key{JobID: "big"}]; !ok || r.Attempt != 1 {
			t.Errorf("big: result %v at attempt %d; want it handed back and run later, at attempt 1", ok, r.Attempt)
		}
		d := h.dlq.All()
		if len(d) != 1 || !strings.HasPrefix(d[0].Attributes[job.AttrReason], "too_large") {
			t.Errorf("dead letters %d, first reason %q; want the huge one, too_large", len(d), d[0].Attributes[job.AttrReason])
		}
	})
}

// A message that runs out of memory in a batch of one while a shrink is
// pending runs alone with the budget the shrink leads to, once the work in
// flight lets go: no deadlock between the two.
func TestExclusiveRunWithShrinkPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, 72*mib, Config{VRAMReserve: 8 * mib, MaxBatch: 1, BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			c.Backend = backend.InProcess{Model: workingModel{h.model}}
		})
		h.send("hog", 0, "mb=40 ms=20000")
		// Admitted beside the hog; allocates 36 MiB after 10 s.
		h.send("liar", 0, "mb=4 lie=9 delay=10000 ms=100")
		wait.For(t, 5*time.Second, "both to run", func() bool { return h.model.runs.Load() == 2 })
		release := otherProcess(t, h.dev, 28*mib)
		defer release()
		wait.For(t, 9*time.Second, "a pending shrink", func() bool { return h.sub.Budget() == 36*mib && h.sub.adm.shrinking() })
		// The liar runs out of memory (4 MiB free), then alone once the
		// hog is done: 36 MiB of the 44 the other process leaves.
		wait.For(t, 2*time.Minute, "2 results", func() bool { r, _ := h.results.Stats(); return r == 2 })
		h.shutdown()
		if n := counter(h.sub.m.oomRetries); n != 1 || h.dev.OOMs() != 1 {
			t.Errorf("%d OOM retries, %d OOMs; want the liar's one", n, h.dev.OOMs())
		}
		if d, _ := h.dlq.Stats(); d != 0 {
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
			func(h *harness, c *Config) { c.Backend = backend.InProcess{Model: workingModel{h.model}} })
		h.send("hog", 0, "mb=40 ms=600000")
		wait.For(t, time.Minute, "the hog to run", func() bool { return h.model.runs.Load() == 1 })
		release := otherProcess(t, h.dev, 28*mib)
		defer release()
		wait.For(t, 10*time.Second, "a pending shrink", func() bool { return h.sub.adm.shrinking() })
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
		if live, invisible := h.work.Stats(); live != 5 || invisible != 0 {
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
		wait.For(t, time.Minute, "it to run", func() bool { return h.model.runs.Load() == 1 })
		time.Sleep(10 * time.Second)
		if b := h.sub.Budget(); b != 64*mib-1 {
			t.Errorf("budget %d while busy, want it untouched", b)
		}
		wait.For(t, time.Minute, "the result", func() bool { r, _ := h.results.Stats(); return r == 1 })
		release := otherProcess(t, h.dev, 16*mib)
		defer release()
		wait.For(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == 48*mib-1 })
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
		wait.For(t, time.Minute, "the free memory gauge", func() bool { return counter(h.sub.m.deviceFree) == 48*mib })
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

// messages counts log records by message, and keeps their attributes as
// key=value.
type messages struct {
	mu    sync.Mutex
	n     map[string]int
	attrs []string
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n[r.Message]++
	r.Attrs(func(a slog.Attr) bool {
		m.attrs = append(m.attrs, a.String())
		return true
	})
	return nil
}
func (m *messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *messages) WithGroup(string) slog.Handler      { return m }

// logged says whether a record had the attribute key=value.
func (m *messages) logged(kv string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.attrs, kv)
}

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
			c.Device, c.Backend, c.Logger = dev, backend.InProcess{Model: workingModel{h.model}}, slog.New(logs)
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
		wait.For(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == 48*mib-1 })
		if n := logs.count("budget changed"); n != 1 {
			t.Errorf("%d budget changes logged, want 1", n)
		}
		h.shutdown()
	})
}

// A budget that grows (another process lets go of its memory) brings the
// next probe of a learned batch limit forward: with a clean run far off, the
// limit from the state file goes up at the first full batch after the
// growth.
func TestBudgetGrowthProbesTheBatchLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "state.json")
		if err := os.WriteFile(state, []byte(`{"model":"test-model","device":"sim","batch_limit":2}`), 0o644); err != nil {
			t.Fatal(err)
		}
		var release func()
		h := startWith(t, 64*mib, Config{MaxBatch: 8, BudgetRefresh: time.Second, BatchLimitProbeAfter: 1000, StateFile: state},
			func(h *harness, c *Config) {
				c.Backend = backend.InProcess{Model: workingModel{h.model}}
				release = otherProcess(t, h.dev, 32*mib)
			})
		if l := h.sub.state.batchLimit(); l != 2 {
			t.Fatalf("batch limit %d from the state file, want 2", l)
		}
		small := h.sub.Budget()
		release()
		wait.For(t, time.Minute, "the budget to grow", func() bool { return h.sub.Budget() > small })
		for i := range 8 {
			h.send("after", i, "mb=1 ms=100")
		}
		wait.For(t, time.Minute, "8 results", func() bool { r, _ := h.results.Stats(); return r == 8 })
		h.shutdown()
		if l := h.sub.state.batchLimit(); l != 3 {
			t.Errorf("batch limit %d after the budget grew and full batches of 2 ran, want the probe at 3", l)
		}
		if n := counter(h.sub.m.batchLimitChanges.WithLabelValues("probe")); n != 1 {
			t.Errorf("%d probes counted, want 1", n)
		}
		if g := counter(h.sub.m.batchLimit); g != 3 {
			t.Errorf("batch_limit_messages %d, want 3", g)
		}
	})
}

// A device counted in units other than bytes (a model server's tokens, a
// million of them) resizes the budget on a change of a few of its
// thousandths, as a GPU does on a change of a few MiB; the 1 MiB floor of
// the tolerance would have been the whole device.
func TestBudgetToleranceInDeviceUnits(t *testing.T) {
	if got := budgetTolerance(backend.DeviceBytes, 1, 1<<30, 1<<30); got != 1<<20 {
		t.Errorf("a 1 GiB GPU's tolerance is %d, want the 1 MiB it always had", got)
	}
	if got := budgetTolerance(backend.KVTokens, 1, 8<<20, 10_000); got != 10_000/8 {
		t.Errorf("a budget of 10,000 tokens: tolerance %d, want an eighth of it", got)
	}
	if got := budgetTolerance(backend.DeviceBytes, 64<<20, 80<<30, 70<<30); got != 8<<20 {
		t.Errorf("an 80 GiB GPU with a 64 MiB reserve: tolerance %d, want an eighth of the reserve", got)
	}
	// A KV pool of 32,768 tokens agrees within 8 of them, a 4096th: at a
	// 1024th the subscriber's KV benchmark preempted (bench/modelserver.md).
	if got := budgetTolerance(backend.KVTokens, 1, 32_768, 32_767); got != 8 {
		t.Errorf("a 32,768-token KV pool: tolerance %d, want 8 tokens", got)
	}
	synctest.Test(t, func(t *testing.T) {
		const total = 1 << 20 // tokens, as modelserver.DefaultTokensInFlight
		h := startWith(t, total, Config{BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			c.Backend = backend.InProcess{Model: workingModel{h.model}}
		})
		if b := h.sub.Budget(); b != total-1 {
			t.Fatalf("budget %d, want the device less the reserve", b)
		}
		release := otherProcess(t, h.dev, 30_000)
		wait.For(t, time.Minute, "the budget to shrink by 30,000 units", func() bool { return h.sub.Budget() == total-1-30_000 })
		release()
		wait.For(t, time.Minute, "the budget to grow back", func() bool { return h.sub.Budget() == total-1 })
		h.shutdown()
	})
	// A budget of a few messages on a large device (fakeoai's KV pool:
	// 8 Mi tokens), as a model server's rate limits leave it: a change of
	// a third of it is followed, though a 1024th of the device is more.
	synctest.Test(t, func(t *testing.T) {
		const total = 8 << 20
		h := startWith(t, total, Config{BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			c.Backend = backend.InProcess{Model: workingModel{h.model}}
		})
		defer otherProcess(t, h.dev, total-12_000)()
		wait.For(t, time.Minute, "a budget of 12,000 units", func() bool { return h.sub.Budget() == 12_000-1 })
		defer otherProcess(t, h.dev, 4_000)()
		wait.For(t, time.Minute, "the budget to shrink to 8,000 units", func() bool { return h.sub.Budget() == 8_000-1 })
		h.shutdown()
	})
}

// Two readings change what is in force only when they agree (within tol)
// on a target more than tol from it: the lesser of them, within bounds.
func TestAgreed(t *testing.T) {
	for _, tc := range []struct {
		a, b, now, tol, lo, hi int64
		want                   int64
		ok                     bool
	}{
		{a: 100, b: 150, now: 10, tol: 20},           // readings disagree
		{a: 100, b: 110, now: 95, tol: 20, hi: 1000}, // agree, on what is in force
		{a: 100, b: 110, now: 10, tol: 20, hi: 1000, want: 100, ok: true},
		{a: 0, b: 5, now: 100, tol: 20, lo: 1, hi: 1000, want: 1, ok: true}, // never below lo
		{a: 900, b: 905, now: 10, tol: 20, hi: 500, want: 500, ok: true},    // nor above hi
	} {
		got, ok := agreed(tc.a, tc.b, tc.now, tc.tol, tc.lo, tc.hi)
		if ok != tc.ok || ok && got != tc.want {
			t.Errorf("agreed(%d, %d, now %d, tol %d, %d..%d) = %d, %v; want %d, %v", tc.a, tc.b, tc.now, tc.tol, tc.lo, tc.hi, got, ok, tc.want, tc.ok)
		}
	}
}

// A backend that owns its memory (backend.MemoryOwner: a model with its
// device, a model server with its KV cache) bounds the budget with no
// Config.Device, and the budget follows that memory; a Device given
// besides is refused, as a second owner of the one bound.
func TestBudgetFollowsTheBackendsOwnMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, 64*mib, Config{BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			c.Backend, c.Device = backend.InProcess{Model: workingModel{h.model}, Device: h.dev}, nil
		})
		full := h.sub.Budget()
		if full != 64*mib-1 {
			t.Fatalf("budget %d, want the backend's device less the reserve", full)
		}
		release := otherProcess(t, h.dev, 24*mib)
		defer release()
		wait.For(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == full-24*mib })
		h.shutdown()
	})
	dev := gpu.NewSim(mib)
	both := Config{Backend: backend.InProcess{Model: &testModel{dev: dev}, Device: dev}, Device: dev}
	if err := both.Validate(); err == nil || !strings.Contains(err.Error(), "leave Device unset") {
		t.Errorf("a Device besides the backend's own: %v, want it refused", err)
	}
	neither := Config{Backend: backend.InProcess{Model: &testModel{dev: dev}}}
	if err := neither.Validate(); err == nil || !strings.Contains(err.Error(), "no device") {
		t.Errorf("no memory at all: %v, want it refused", err)
	}
}

// kvTokensBackend is a backend bounded by a memory counted in KV tokens, as
// a model server's cache is (modelserver.KV): the Sim's units stand for
// tokens.
type kvTokensBackend struct {
	backend.InProcess
	dev *gpu.Sim
}

func (b kvTokensBackend) Memory() backend.Memory { return kvTokensMemory{b.dev} }

type kvTokensMemory struct{ *gpu.Sim }

func (kvTokensMemory) Unit() backend.Unit { return backend.KVTokens }
func (m kvTokensMemory) Read() (backend.Reading, error) {
	r, err := m.MemInfo()
	return backend.Reading(r), err
}

// Issue 32, item 3: a memory counted in KV tokens is shown in KV tokens, in
// its own series, and never as bytes: the budget's series are
// budget_kv_tokens and kv_cache_*_tokens, none of the GPU's *_bytes, and the
// logs of the budget say "KV tokens" where a GPU's say MiB.
func TestKVTokensAreShownAsTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pool = 32_768
		logs := &messages{n: map[string]int{}}
		h := startWith(t, pool, Config{BudgetRefresh: time.Second}, func(h *harness, c *Config) {
			c.Backend, c.Device = kvTokensBackend{InProcess: backend.InProcess{Model: workingModel{h.model}}, dev: h.dev}, nil
			c.Logger = slog.New(logs)
		})
		release := otherProcess(t, h.dev, 8_192)
		defer release()
		wait.For(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() == pool-1-8_192 })
		h.shutdown()

		fams, err := h.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, f := range fams {
			if len(f.GetMetric()) == 1 && f.GetMetric()[0].GetGauge() != nil {
				got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		for name, want := range map[string]float64{"vramq_subscriber_budget_kv_tokens": pool - 1 - 8_192,
			"vramq_subscriber_budget_max_kv_tokens": pool - 1, "vramq_subscriber_kv_cache_total_tokens": pool} {
			if v, ok := got[name]; !ok || v != want {
				t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
			}
		}
		for name := range got {
			if strings.HasSuffix(name, "_bytes") && (strings.Contains(name, "budget") || strings.Contains(name, "device_memory") ||
				strings.Contains(name, "inflight")) {
				t.Errorf("a KV-token memory exports %s", name)
			}
		}
		if logs.count("subscriber ready") != 1 || !logs.logged("budget=32767 KV tokens") {
			t.Errorf("the start is not logged with a budget of 32767 KV tokens: %q", logs.attrs)
		}
		if logs.count("budget changed: shrinking") != 1 || !logs.logged("new=24575 KV tokens") || !logs.logged("old=32767 KV tokens") {
			t.Errorf("the shrink is not logged from 32767 to 24575 KV tokens: %q", logs.attrs)
		}
		for _, a := range logs.attrs {
			if strings.Contains(a, "iB") {
				t.Errorf("the log shows KV tokens as bytes: %s", a)
			}
		}
	})
}
