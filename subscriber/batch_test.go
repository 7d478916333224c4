package subscriber

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/subscriber/queue"
)

// recordingLauncher is a timed.Model that notes when each batch, named by
// its first item, launches and runs.
type recordingLauncher struct {
	*timed.Model
	mu     sync.Mutex
	events map[string]time.Time // "<item> launch-start" and so on
}

func (m *recordingLauncher) note(items []job.Item, what string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events[items[0].ID+" "+what] = time.Now()
}

func (m *recordingLauncher) at(item, what string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.events[item+" "+what]
	return t, ok
}

func (m *recordingLauncher) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	m.note(items, "launch-start")
	out, err := m.Model.Run(ctx, items)
	m.note(items, "run-end")
	return out, err
}

func (m *recordingLauncher) Launch(ctx context.Context, items []job.Item) (gpu.Launched, error) {
	m.note(items, "launch-start")
	l, err := m.Model.Launch(ctx, items)
	m.note(items, "launch-end")
	return recordedRun{l, m, items}, err
}

type recordedRun struct {
	gpu.Launched
	m     *recordingLauncher
	items []job.Item
}

func (r recordedRun) Run(ctx context.Context) ([]job.Output, error) {
	r.m.note(r.items, "run-start")
	out, err := r.Launched.Run(ctx)
	r.m.note(r.items, "run-end")
	return out, err
}

// Two large messages and room for one: the second is launched while it
// waits for the first's memory, so it starts work the moment the first
// returns, rather than the device idling through its launch.
func TestWaitingLargeMessageLaunchesWhileItWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ecfg := refembed.DefaultConfig()
		timing := timed.Timing{Launch: 10 * time.Millisecond, Throughput: 512 << 20}
		var m *recordingLauncher
		h := startWith(t, ecfg.WeightBytes()+20*mib, Config{}, func(h *harness, c *Config) {
			tm, err := timed.New(ecfg, timing, h.dev)
			if err != nil {
				t.Fatal(err)
			}
			m = &recordingLauncher{Model: tm, events: map[string]time.Time{}}
			c.Backend = backend.InProcess{Model: m}
		})
		works := workload.Spec{JobID: "large", Messages: 2, LargeEvery: 1, LargeItems: 32, LargeWords: 600, Seed: 3}.Works()
		if c := m.Cost(works[0].Items); c <= 10*mib || c > 20*mib {
			t.Fatalf("a large message costs %s; the test needs room for one of them, not two", bytesize.Format(c))
		}
		for _, w := range works {
			h.sendWork(w)
		}
		wait.For(t, time.Minute, "both messages deleted", func() bool { return h.sub.Ledger().Deleted == 2 })
		h.shutdown()
		first, second := works[0].Items[0].ID, works[1].Items[0].ID
		if _, ok := m.at(first, "launch-end"); ok {
			first, second = second, first // received in the other order
		}
		firstEnd, ok1 := m.at(first, "run-end")
		launched, ok2 := m.at(second, "launch-end")
		started, ok3 := m.at(second, "run-start")
		if !ok1 || !ok2 || !ok3 {
			t.Fatalf("events %v: want the first run in one go and the second launched ahead", m.events)
		}
		if !launched.Before(firstEnd) {
			t.Errorf("the second message's launch ended %v after the first's run: it did not overlap", launched.Sub(firstEnd))
		}
		if started.Sub(firstEnd) >= timing.Launch {
			t.Errorf("the second message started work %v after the first returned: the device waited out a launch", started.Sub(firstEnd))
		}
		if n := h.dev.OOMs(); n != 0 {
			t.Errorf("%d OOMs", n)
		}
		if got, dups := h.resultsByKey(); len(got) != 2 || dups != 0 {
			t.Errorf("%d results, %d duplicates", len(got), dups)
		}
	})
}

// classModel is the test model with length classes: an item's "class=N"
// is its class, and each Run notes the classes of its items.
type classModel struct {
	*testModel
	mu   sync.Mutex
	runs [][]int // the classes of each Run's items
}

func itemClass(it job.Item) int {
	var c int
	for f := range strings.FieldsSeq(it.Text) {
		fmt.Sscanf(f, "class=%d", &c)
	}
	return c
}

func (m *classModel) LengthClass(items []job.Item) int { return itemClass(items[0]) }

func (m *classModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	var classes []int
	for _, it := range items {
		classes = append(classes, itemClass(it))
	}
	m.mu.Lock()
	m.runs = append(m.runs, classes)
	m.mu.Unlock()
	return m.testModel.Run(ctx, items)
}

// With a model of length classes, messages of different classes never
// share a batch, while messages of one class still do.
func TestBatchesKeepLengthClassesApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var m *classModel
		h := startWith(t, 100*mib, Config{MaxBatch: 8, MaxBatchDelay: 50 * time.Millisecond}, func(h *harness, c *Config) {
			m = &classModel{testModel: h.model}
			c.Backend = backend.InProcess{Model: m}
		})
		for i := range 12 {
			h.send("classes", i, fmt.Sprintf("mb=1 ms=5 class=%d", i%3))
		}
		wait.For(t, time.Minute, "all messages deleted", func() bool { return h.sub.Ledger().Deleted == 12 })
		h.shutdown()
		shared := false
		for _, classes := range m.runs {
			for _, c := range classes {
				if c != classes[0] {
					t.Fatalf("a batch mixed length classes: %v (all batches %v)", classes, m.runs)
				}
			}
			shared = shared || len(classes) > 1
		}
		if !shared {
			t.Errorf("no batch held more than one message: %v", m.runs)
		}
	})
}

func TestBatcherFillsOrWaitsMaxDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 1<<30, Config{MaxBatch: 4, MaxBatchDelay: time.Second, Prefetch: 20})
		// A long batch keeps the device busy, so the batcher waits for
		// company (on an idle device it would not: batchdelay_test.go).
		h.send("busy", 0, "mb=1 ms=5000")
		wait.For(t, time.Minute, "the long batch to run", func() bool { return h.model.runs.Load() == 1 })
		for i := range 6 {
			h.send("b", i, "mb=1")
		}
		wait.For(t, time.Minute, "7 results", func() bool { r, _ := h.results.Stats(); return r == 7 })
		// Four go as soon as they are admitted; the other two after the delay.
		if runs := h.model.runs.Load() - 1; runs != 2 {
			t.Errorf("%d batches for 6 messages at max batch 4, want 2", runs)
		}
		h.shutdown()
	})
}

// The batcher alone, with a stand-in for runBatch that notes each batch and
// holds it until the test lets it return.

// heldRuns is a runBatch that notes each batch's messages and when it
// started, and returns once let go.
type heldRuns struct {
	mu      sync.Mutex
	batches [][]string
	starts  []time.Time
	letGo   chan struct{}
}

func (r *heldRuns) run(_ context.Context, tasks []*task) {
	var ids []string
	for _, t := range tasks {
		ids = append(ids, t.lease.msg.ID)
	}
	r.mu.Lock()
	r.batches = append(r.batches, ids)
	r.starts = append(r.starts, time.Now())
	r.mu.Unlock()
	<-r.letGo
}

func (r *heldRuns) got() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

// testBatcher is a batcher over the least of a subscriber: count
// admission, a learned limit of maxBatch, the given delay, and no queue
// behind its keeper (nothing here is released).
func testBatcher(t *testing.T, maxBatch int, delay time.Duration) (*batcher, *heldRuns) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	s := &Subscriber{cfg: Config{MaxBatchDelay: delay}, log: log, m: newMetrics(prometheus.NewRegistry(), backend.DeviceBytes), running: running{suspects: newIDSet()}}
	var err error
	if s.adm, err = newAdmission(AdmitCount, 0, 100); err != nil {
		t.Fatal(err)
	}
	s.state = loadLearned("", "model", "device", maxBatch, 0, log)
	s.keeper = newKeeper(nil, s.m, log, time.Minute, time.Hour, job.MaxBatch)
	s.waitingGauge = s.m.waiting
	b := s.newBatcher(t.Context())
	r := &heldRuns{letGo: make(chan struct{})}
	b.runBatch = r.run
	return b, r
}

// admitted hands the batcher a message of class, counted as waiting as the
// poller counts it.
func admitted(b *batcher, id string, class int) {
	b.s.waiting.Add(1)
	b.add(&task{lease: &lease{msg: queue.Message{ID: id}}, work: &job.Work{}, class: class, cost: 1})
}

// While something is still on its way, batches gather up to their delay;
// admission full sends every pending batch at once.
func TestBatcherSendsAllWhenAdmissionIsFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, r := testBatcher(t, 8, time.Second)
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); b.run(ctx) }()
		b.s.waiting.Add(1) // one more message on its way: the device is not left idle for it
		admitted(b, "a1", 1)
		time.Sleep(time.Millisecond)
		admitted(b, "b1", 2)
		admitted(b, "a2", 1)
		synctest.Wait()
		if got := r.got(); len(got) != 0 {
			t.Fatalf("batches %v went before their delay", got)
		}
		b.admissionFull()
		synctest.Wait()
		want := [][]string{{"a1", "a2"}, {"b1"}}
		got := r.got() // in the order their goroutines ran
		slices.SortFunc(got, func(x, y []string) int { return strings.Compare(x[0], y[0]) })
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("batches %v, want %v at once when admission is full", got, want)
		}
		close(r.letGo)
		b.close()
		stop()
		<-done
	})
}

// A batch gathering while another runs goes when that one returns, if
// nothing else is on its way, rather than at its delay; and until then
// it waits, as long as something runs.
func TestBatcherSendsWhatGatheredWhenTheDeviceFrees(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, r := testBatcher(t, 8, time.Second)
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); b.run(ctx) }()
		admitted(b, "first", 0) // idle device, nothing else coming: at once
		synctest.Wait()
		admitted(b, "second", 0)
		admitted(b, "third", 0)
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if got := r.got(); len(got) != 1 {
			t.Fatalf("batches %v while the first ran, want only the first", got)
		}
		r.letGo <- struct{}{}
		synctest.Wait()
		want := [][]string{{"first"}, {"second", "third"}}
		if got := r.got(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("batches %v, want %v", got, want)
		}
		if waited := r.starts[1].Sub(r.starts[0]); waited != 500*time.Millisecond {
			t.Errorf("the second batch went %v after the first, want when the first returned, 500ms", waited)
		}
		close(r.letGo)
		b.close()
		stop()
		<-done
	})
}
