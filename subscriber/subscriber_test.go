package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queuetest"
)

const mib = 1 << 20

// testModel runs on a simulated device. An item's text says what it costs and
// how long it runs: "mb=30 ms=200", optionally "hang" (never returns until
// cancelled), "invalid" (rejected as poison), "lie=N" (really needs N times
// its estimate) or "delay=MS" (a launch before it allocates).
type testModel struct {
	dev     *gpu.Sim
	runs    atomic.Int64
	working atomic.Int64 // what its batches hold; reported by workingModel
}

// workingModel is the test model reporting its working set
// (gpu.WorkingSet), as the project's models do.
type workingModel struct{ *testModel }

func (m workingModel) Working() int64 { return m.working.Load() }

type itemSpec struct {
	mb, ms, lie, delay int
	hang, invalid      bool
	stubborn           bool // ignores ctx: runs its ms out whatever the timeout (issue 20)
	// Issue 14: "panic" panics in Run, "costpanic" in Cost; "nan" answers
	// NaN; "out=N" answers an embedding of N floats.
	panics, costPanics, nan bool
	out                     int
}

func parseSpec(text string) itemSpec {
	s := itemSpec{lie: 1}
	for f := range strings.FieldsSeq(text) {
		switch {
		case f == "hang":
			s.hang = true
		case f == "invalid":
			s.invalid = true
		case f == "stubborn":
			s.stubborn = true
		case f == "panic":
			s.panics = true
		case f == "costpanic":
			s.costPanics = true
		case f == "nan":
			s.nan = true
		default:
			var k string
			var v int
			if n, _ := fmt.Sscanf(strings.Replace(f, "=", " ", 1), "%s %d", &k, &v); n == 2 {
				switch k {
				case "mb":
					s.mb = v
				case "ms":
					s.ms = v
				case "lie":
					s.lie = v
				case "delay":
					s.delay = v
				case "out":
					s.out = v
				}
			}
		}
	}
	return s
}

func (m *testModel) Name() string   { return "test-model" }
func (m *testModel) Weights() int64 { return 0 }

func (m *testModel) Cost(items []job.Item) int64 {
	var c int64
	for _, it := range items {
		s := parseSpec(it.Text)
		if s.costPanics {
			panic("test model: cost of " + it.ID)
		}
		c += int64(s.mb) * mib
	}
	return c
}

func (m *testModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	m.runs.Add(1)
	var need int64
	var took, delay time.Duration
	hang, stubborn := false, false
	for _, it := range items {
		s := parseSpec(it.Text)
		need += int64(s.mb*s.lie) * mib
		took = max(took, time.Duration(s.ms)*time.Millisecond)
		delay = max(delay, time.Duration(s.delay)*time.Millisecond)
		hang = hang || s.hang
		stubborn = stubborn || s.stubborn
		if s.invalid {
			return nil, fmt.Errorf("item %s: %w", it.ID, fault.ErrInvalidInput)
		}
		if s.panics {
			var seen []string
			_ = seen[len(it.ID)] // a real runtime error, as a model's bug would raise
		}
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	free, err := m.dev.Alloc(need)
	if err != nil {
		return nil, err
	}
	m.working.Add(need)
	defer func() { m.working.Add(-need); free() }()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if stubborn {
		time.Sleep(took)
	}
	select {
	case <-time.After(took):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	outs := make([]job.Output, len(items))
	for i, it := range items {
		outs[i] = job.Output{ID: it.ID, Embedding: []float32{float32(len(it.Text))}}
		switch s := parseSpec(it.Text); {
		case s.nan:
			outs[i].Embedding[0] = float32(math.NaN())
		case s.out > 0:
			outs[i].Embedding = make([]float32, s.out)
		}
	}
	return outs, nil
}

type harness struct {
	t                  *testing.T
	work, results, dlq *queuetest.Mem
	dev                *gpu.Sim
	model              *testModel
	sub                *Subscriber
	reg                *prometheus.Registry
	stop               context.CancelFunc
	done               chan error
}

// start runs a subscriber on in-memory queues and a simulated device of
// capacity bytes. Call it inside a synctest bubble.
func start(t *testing.T, capacity int64, cfg Config) *harness {
	t.Helper()
	return startWith(t, capacity, cfg, nil)
}

// startWith is start with setup, when not nil, changing the configuration
// last: another model, device or logger.
func startWith(t *testing.T, capacity int64, cfg Config, setup func(*harness, *Config)) *harness {
	t.Helper()
	h := &harness{t: t, work: queuetest.NewMem(), results: queuetest.NewMem(), dlq: queuetest.NewMem(), dev: gpu.NewSim(capacity),
		reg: prometheus.NewRegistry()}
	h.model = &testModel{dev: h.dev}
	cfg.Queue, cfg.Results, cfg.DLQ, cfg.Backend, cfg.Device = h.work, h.results, h.dlq, backend.InProcess{Model: h.model}, h.dev
	cfg.Registerer = h.reg
	if cfg.VRAMReserve == 0 {
		cfg.VRAMReserve = 1 // keep the whole simulated device for work
	}
	if cfg.WaitTime == 0 {
		cfg.WaitTime = time.Second
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	} else {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if setup != nil {
		setup(h, &cfg)
	}
	sub, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.sub = sub
	ctx, cancel := context.WithCancel(t.Context())
	h.stop = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- sub.Run(ctx) }()
	return h
}

// send puts one work message with one item per spec on the work queue.
func (h *harness) send(jobID string, chunk int, specs ...string) {
	w := job.Work{V: job.Version, JobID: jobID, Chunk: chunk}
	for i, s := range specs {
		w.Items = append(w.Items, job.Item{ID: fmt.Sprintf("i%d", i), Text: s})
	}
	b, _ := json.Marshal(w)
	h.work.Put(string(b), job.Attributes(w.Key()))
}

// shutdown stops the subscriber and checks that Run returned nil and that
// the protocol was kept.
func (h *harness) shutdown() {
	h.t.Helper()
	h.stop()
	if err := <-h.done; err != nil {
		h.t.Fatalf("Run: %v", err)
	}
	if v := h.work.Violations(); len(v) > 0 {
		h.t.Errorf("queue protocol violations: %q", v)
	}
	if l := h.sub.Ledger(); l.Received != l.Deleted+l.Released+l.Lost+l.Abandoned {
		h.t.Errorf("ledger does not balance: %+v", l)
	}
	// A batch cut off by the grace holds its weight until the model
	// returns (run.go hands it over to a goroutine that waits for
	// that), which may be a moment after Run returns: wait for it, as long
	// as a model's run may take to see its cancellation.
	for deadline := time.Now().Add(10 * time.Second); unreleased(h.sub) != nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if err := unreleased(h.sub); err != nil {
		h.t.Errorf("after shutdown: %v", err)
	}
}

// resultsByKey reads every result message, counting duplicates.
func (h *harness) resultsByKey() (map[job.Key]job.Result, int) {
	got := map[job.Key]job.Result{}
	dups := 0
	for _, m := range h.results.All() {
		var r job.Result
		if err := json.Unmarshal([]byte(m.Body), &r); err != nil {
			h.t.Fatalf("result %q: %v", m.Body, err)
		}
		if _, ok := got[r.Key()]; ok {
			dups++
		}
		got[r.Key()] = r
	}
	return got, dups
}

func counter(c prometheus.Collector) int { return int(testutil.ToFloat64(c)) }

func observations(h prometheus.Histogram) uint64 {
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		panic(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// mixed sends n messages of the bimodal workload from the source articles:
// mostly small inputs, every fourth a large one.
func (h *harness) mixed(n int) {
	for i := range n {
		spec := "mb=4 ms=50"
		if i%4 == 0 {
			spec = "mb=30 ms=200"
		}
		h.send("job", i, spec)
	}
}

func TestVRAMAdmissionRunsMixedWorkloadWithoutOOM(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{Admission: AdmitVRAM, MaxInflight: 40})
		h.mixed(40)
		wait.For(t, 5*time.Minute, "40 results", func() bool { live, _ := h.results.Stats(); return live >= 40 })
		h.shutdown()

		got, dups := h.resultsByKey()
		if len(got) != 40 || dups != 0 {
			t.Errorf("results: %d distinct, %d duplicates; want 40, 0", len(got), dups)
		}
		if h.dev.OOMs() != 0 {
			t.Errorf("vram admission ran out of memory %d times", h.dev.OOMs())
		}
		if live, _ := h.work.Stats(); live != 0 {
			t.Errorf("%d messages left on the work queue", live)
		}
		if live, _ := h.dlq.Stats(); live != 0 {
			t.Errorf("%d messages in the DLQ", live)
		}
		if peak := h.dev.Peak(); peak > h.sub.Budget() {
			t.Errorf("peak device use %d above budget %d", peak, h.sub.Budget())
		}
		if peak := h.sub.PeakBytes(); peak > h.sub.Budget() || peak == 0 {
			t.Errorf("peak admitted %d, budget %d", peak, h.sub.Budget())
		}
		if n := observations(h.sub.m.batchSize); n == 0 {
			t.Error("no batches observed")
		}
	})
}

// The naive strategies run out of memory on the same workload and recover by
// splitting batches and running alone, losing nothing.
func TestNaiveStrategiesOOMAndRecover(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"count", Config{Admission: AdmitCount, Count: 4, MaxInflight: 40}},
		{"none", Config{Admission: AdmitNone, MaxInflight: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := start(t, 64*mib, tc.cfg)
				// Large ones together: four of them need 120 MiB of 64.
				for i := range 24 {
					spec := "mb=4 ms=50"
					if i%2 == 0 {
						spec = "mb=30 ms=200"
					}
					h.send("job", i, spec)
				}
				wait.For(t, 10*time.Minute, "24 results", func() bool { live, _ := h.results.Stats(); return live >= 24 })
				h.shutdown()
				got, _ := h.resultsByKey()
				if len(got) != 24 {
					t.Errorf("%d distinct results, want 24", len(got))
				}
				if h.dev.OOMs() == 0 || counter(h.sub.m.oomRetries) == 0 {
					t.Errorf("%s admission: %d OOMs, %d OOM retries; want some of each", tc.name, h.dev.OOMs(), counter(h.sub.m.oomRetries))
				}
				if live, _ := h.dlq.Stats(); live != 0 {
					t.Errorf("%d messages dead-lettered; recovery should lose none", live)
				}
				if live, _ := h.work.Stats(); live != 0 {
					t.Errorf("%d messages left on the work queue", live)
				}
			})
		})
	}
}

func TestHeartbeatKeepsSlowMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{Visibility: 3 * time.Second})
		h.send("slow", 0, "mb=1 ms=20000")
		wait.For(t, time.Minute, "the result", func() bool { live, _ := h.results.Stats(); return live == 1 })
		h.shutdown()
		got, dups := h.resultsByKey()
		if r := got[job.Key{JobID: "slow"}]; r.Attempt != 1 || dups != 0 {
			t.Errorf("attempt %d, %d duplicates; want delivered once", r.Attempt, dups)
		}
		// 20 s at one extension a second or two.
		if n := counter(h.sub.m.extensions); n < 6 {
			t.Errorf("%d extensions for a 20 s job with a 3 s timeout", n)
		}
		if n := h.model.runs.Load(); n != 1 {
			t.Errorf("model ran %d times, want 1", n)
		}
	})
}

func TestPoisonGoesToDLQWithReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{})
		h.work.Put(`{"v":1,"job_id":"j","chunk":0,"items":[]}`, nil)
		h.work.Put(`not json`, map[string]string{"trace": "abc"})
		h.send("big", 0, "mb=100")
		h.send("bad", 0, "mb=1 invalid", "invalid") // every item refused: the chunk goes (itemerrors_test.go)
		h.send("ok", 0, "mb=1")
		wait.For(t, time.Minute, "4 dead letters and 1 result", func() bool {
			d, _ := h.dlq.Stats()
			r, _ := h.results.Stats()
			return d == 4 && r == 1
		})
		h.shutdown()
		reasons := map[string]int{}
		for _, m := range h.dlq.All() {
			reason := m.Attributes[job.AttrReason]
			kind, _, _ := strings.Cut(reason, ":")
			reasons[kind]++
			if m.Attributes[job.AttrSource] == "" {
				t.Errorf("dead letter %q has no source message id", m.Body)
			}
		}
		want := map[string]int{"malformed": 2, "too_large": 1, "invalid_input": 1}
		for k, n := range want {
			if reasons[k] != n {
				t.Errorf("DLQ reasons %v, want %v", reasons, want)
				break
			}
		}
		if live, _ := h.work.Stats(); live != 0 {
			t.Errorf("%d messages left on the work queue", live)
		}
	})
}

// A message not admitted in time is handed back for another consumer, as a
// fresh copy: waiting for room is not its fault, so the redrive (here at
// two receives) never sees it, however many times it is handed back.
func TestBackpressureHandsBackWhatCannotBeAdmitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, 64*mib, Config{AdmitTimeout: 10 * time.Second, MaxBatch: 1}, func(h *harness, _ *Config) {
			h.work.Redrive(h.dlq, 2)
		})
		h.send("hog", 0, "mb=50 ms=60000")
		time.Sleep(2 * time.Second) // the hog is admitted first
		h.send("waiter", 0, "mb=30 ms=10")
		wait.For(t, 30*time.Second, "a backpressure hand-back", func() bool {
			return counter(h.sub.m.handedBack.WithLabelValues("backpressure")) > 0
		})
		wait.For(t, 3*time.Minute, "both results", func() bool { live, _ := h.results.Stats(); return live == 2 })
		if n := counter(h.sub.m.handedBack.WithLabelValues("backpressure")); n < 3 {
			t.Errorf("handed back %d times; want at least 3 (a minute's wait at a 10 s admit timeout)", n)
		}
		h.shutdown()
		if d, _ := h.dlq.Stats(); d != 0 {
			t.Errorf("%d dead-lettered; want none", d)
		}
		got, _ := h.resultsByKey()
		if r, ok := got[job.Key{JobID: "waiter"}]; !ok || r.Attempt != 1 {
			t.Errorf("waiter: result %v at attempt %d; want it run from a fresh copy, at attempt 1", ok, r.Attempt)
		}
	})
}

// A subscriber whose messages start slowly (each runs 20 s, one at a time)
// keeps no more of them received than start within half its admit timeout:
// the rest stay visible on the queue for another consumer, rather than held
// a whole admit timeout, handed back and received again. Prefetch of them
// held was the third subscriber's idle minute in bench/modelserver.md's
// sharing runs (prefetchNow).
func TestSlowStartsKeepTheRestOnTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{AdmitTimeout: 10 * time.Second, Prefetch: 20, MaxBatch: 1})
		const n = 30
		for i := range n {
			h.send("slow", i, "mb=40 ms=20000") // one at a time on 64 MiB
		}
		time.Sleep(time.Minute) // the first Prefetch are handed back, and the flow is read
		before := counter(h.sub.m.handedBack.WithLabelValues("backpressure"))
		most, hidden := 0, 0
		for range 120 {
			time.Sleep(time.Second)
			most = max(most, int(h.sub.waiting.Load()))
			_, invisible := h.work.Stats()
			hidden = max(hidden, invisible)
		}
		// The running one, one waiting, and, as one run ends, the one
		// received to wait next.
		if hidden > 3 {
			t.Errorf("up to %d messages invisible on the queue; want 3 at most", hidden)
		}
		if most > 1 {
			t.Errorf("up to %d messages waiting; want 1 (a start every 20 s, 5 s wanted)", most)
		}
		// One waiting a run of 20 s is handed back at most once each 10 s.
		if got := counter(h.sub.m.handedBack.WithLabelValues("backpressure")) - before; got > 13 {
			t.Errorf("%d backpressure hand-backs in 2 minutes; want at most 13", got)
		}
		if g := testutil.ToFloat64(h.sub.m.prefetch); g != 1 {
			t.Errorf("prefetch gauge at %v; want 1", g)
		}
		h.shutdown()
	})
}

func TestShutdownReleasesEverythingItHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{ShutdownGrace: 2 * time.Second, Prefetch: 10, MaxInflight: 30})
		for i := range 30 {
			h.send("job", i, "mb=10 ms=5000")
		}
		wait.For(t, time.Minute, "work to start", func() bool { return h.model.runs.Load() > 0 })
		h.shutdown()
		// Nothing is left invisible: every message is done or back on the queue.
		live, invisible := h.work.Stats()
		results, _ := h.results.Stats()
		if invisible != 0 {
			t.Errorf("%d messages left invisible after shutdown", invisible)
		}
		if live+results != 30 {
			t.Errorf("%d left + %d results = %d, want 30", live, results, live+results)
		}
		if held := h.sub.keeper.held.Load(); held != 0 {
			t.Errorf("%d leases still held", held)
		}
	})
}

// A batch that outlives its timeout is released; one that always hangs goes
// to the DLQ through the queue's redrive policy, not in a loop.
func TestHangingInferenceIsReleasedThenRedriven(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{InferenceTimeout: 5 * time.Second, RetryDelay: time.Second})
		h.work.Redrive(h.dlq, 3)
		h.send("hang", 0, "mb=1 hang")
		wait.For(t, 5*time.Minute, "the redrive", func() bool { d, _ := h.dlq.Stats(); return d == 1 })
		h.shutdown()
		if n := h.model.runs.Load(); n != 3 {
			t.Errorf("ran %d times, want maxReceiveCount=3", n)
		}
		if used := h.dev.Peak(); used == 0 {
			t.Error("the hanging model never allocated")
		}
		if mi, _ := h.dev.MemInfo(); mi.Used != 0 {
			t.Errorf("%d bytes still allocated after the hung runs were cancelled", mi.Used)
		}
	})
}

// An estimate that is too low makes even vram admission run out of memory;
// the batch is split, the size that worked is remembered, and a message that
// cannot fit even alone goes to the DLQ.
func TestUnderestimateSplitsLearnsAndDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "state.json")
		// MaxBatchBytes at the budget, so the eight form one batch.
		// The eight are on the queue before the subscriber starts, so that
		// one receive takes them all: sent while it runs, a receive could
		// take the first few alone, and a batch of those fits.
		h := startWith(t, 64*mib, Config{MaxBatch: 8, MaxBatchDelay: time.Second, MaxBatchBytes: 64 * mib, StateFile: state},
			func(h *harness, _ *Config) {
				for i := range 8 {
					h.send("lie", i, "mb=4 lie=4 ms=100") // 16 MiB each really: four fit
				}
			})
		// The huge one after the eight are done: in a batch with them it
		// would be the culprit that then fails alone, and such a split
		// rightly teaches the limit nothing (TestCulpritDoesNotPinBatchLimit).
		wait.For(t, 5*time.Minute, "8 results", func() bool { r, _ := h.results.Stats(); return r == 8 })
		h.send("huge", 0, "mb=10 lie=10") // 100 MiB really: never fits
		wait.For(t, 5*time.Minute, "8 results and 1 dead letter", func() bool {
			r, _ := h.results.Stats()
			d, _ := h.dlq.Stats()
			return r == 8 && d == 1
		})
		h.shutdown()
		if lim := h.sub.state.batchLimit(); lim >= 8 || lim < 1 {
			t.Errorf("batch limit %d after OOM at 8", lim)
		}
		b, err := os.ReadFile(state)
		if err != nil {
			t.Fatal(err)
		}
		var f learnedFile
		if err := json.Unmarshal(b, &f); err != nil || f.BatchLimit != h.sub.state.batchLimit() {
			t.Errorf("state file %s: %+v, %v", b, f, err)
		}
		d := h.dlq.All()
		if len(d) != 1 || !strings.HasPrefix(d[0].Attributes[job.AttrReason], "out_of_memory") {
			t.Errorf("dead letter reason %q", d[0].Attributes[job.AttrReason])
		}
		// A new subscriber starts from the learned limit.
		l := loadLearned(state, h.model.Name(), h.dev.Name(), 8, 32, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if l.batchLimit() != f.BatchLimit {
			t.Errorf("reloaded limit %d, want %d", l.batchLimit(), f.BatchLimit)
		}
	})
}

func TestResultSendFailureReleasesForRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{RetryDelay: time.Second})
		var fails atomic.Int64
		h.results.SendErr = func(string) error {
			if fails.Add(1) <= 2 {
				return errors.New("injected")
			}
			return nil
		}
		h.send("flaky", 0, "mb=1")
		wait.For(t, time.Minute, "the result", func() bool { r, _ := h.results.Stats(); return r == 1 })
		h.shutdown()
		got, _ := h.resultsByKey()
		if r := got[job.Key{JobID: "flaky"}]; r.Attempt != 3 {
			t.Errorf("result at attempt %d, want 3 (two failed sends released it twice)", r.Attempt)
		}
		if n := counter(h.sub.m.redelivered); n != 2 {
			t.Errorf("%v redeliveries counted, want 2 (received three times)", n)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	cfg := Config{Visibility: 2 * time.Second, WaitTime: 30 * time.Second, Admission: "fifo", MaxMessageBytes: 10}
	cfg.setDefaults()
	err := cfg.Validate()
	for _, want := range []string{"no work queue", "no backend", "admission \"fifo\"", "wait time", "visibility timeout", "max message bytes"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want it to mention %q", err, want)
		}
	}
}
