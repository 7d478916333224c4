package timed

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/refembed"
)

// testTiming makes the arithmetic easy: 1 MiB of cost is 1 ms of work.
var testTiming = Timing{Launch: 5 * time.Millisecond, Throughput: 1 << 30}

// itemsOfCost returns one item whose cost under cfg is as close to want as
// whole tokens allow, and that cost.
func itemsOfCost(t *testing.T, cfg refembed.Config, tokens int) ([]job.Item, int64) {
	t.Helper()
	text := ""
	for i := range tokens {
		if i > 0 {
			text += " "
		}
		text += "tok"
	}
	items := []job.Item{{ID: "a", Text: text}}
	return items, cfg.Cost(cfg.CostModel(), items)
}

func newTimed(t *testing.T, timing Timing, capacity int64) (*Model, *gpu.Sim) {
	t.Helper()
	cfg := refembed.DefaultConfig()
	sim := gpu.NewSim(cfg.WeightBytes() + capacity)
	m, err := New(cfg, timing, sim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, sim
}

func within(got, want time.Duration) bool {
	d := got - want
	return d > -time.Microsecond && d < time.Microsecond
}

func TestWeightBytesMatchesGeneratedWeights(t *testing.T) {
	for _, cfg := range []refembed.Config{refembed.DefaultConfig(), {Vocab: 64, Dim: 8, Hidden: 16, Out: 4, MaxTokens: 32, Seed: 3}} {
		if got, want := cfg.WeightBytes(), refembed.GenerateWeights(cfg).Bytes(); got != want {
			t.Errorf("%+v: WeightBytes %d, generated weights %d", cfg, got, want)
		}
	}
}

func TestTimedModelCostsWhatEmbedderCosts(t *testing.T) {
	cfg := refembed.DefaultConfig()
	emb, err := refembed.NewEmbedder(refembed.GenerateWeights(cfg), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(cfg, DefaultTiming(), nil)
	if err != nil {
		t.Fatal(err)
	}
	items := []job.Item{{ID: "1", Text: "a few words here"}, {ID: "2", Text: ""}, {ID: "3", Text: "one"}}
	if got, want := m.Cost(items), emb.Cost(items); got != want {
		t.Errorf("timed cost %d, embedder cost %d", got, want)
	}
	if m.Weights() != emb.Weights() {
		t.Errorf("timed weights %d, embedder weights %d", m.Weights(), emb.Weights())
	}
}

// A batch alone takes its launch plus its cost over the throughput, holds
// its cost in device memory meanwhile, and returns one unit vector per item.
func TestTimedModelAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, sim := newTimed(t, testTiming, 64<<20)
		items, cost := itemsOfCost(t, m.cfg, 100)
		base, _ := sim.MemInfo()
		seen := make(chan gpu.MemInfo, 1)
		go func() {
			time.Sleep(testTiming.Launch + time.Microsecond)
			info, _ := sim.MemInfo()
			seen <- info
		}()
		start := time.Now()
		out, err := m.Run(context.Background(), items)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := time.Since(start), testTiming.Alone(cost); !within(got, want) {
			t.Errorf("batch took %v, want %v", got, want)
		}
		if during := <-seen; during.Used-base.Used != cost {
			t.Errorf("device memory during the batch: %d above the weights, want its cost %d", during.Used-base.Used, cost)
		}
		if after, _ := sim.MemInfo(); after.Used != base.Used {
			t.Errorf("memory after the batch %d, want %d: the batch's memory leaked", after.Used, base.Used)
		}
		if len(out) != 1 || out[0].ID != "a" || len(out[0].Embedding) != m.cfg.Out {
			t.Fatalf("outputs %+v: want one of %d values for item a", out, m.cfg.Out)
		}
		var norm float64
		for _, x := range out[0].Embedding {
			norm += float64(x) * float64(x)
		}
		if norm < 0.999 || norm > 1.001 {
			t.Errorf("output norm² %v, want 1", norm)
		}
		if busy := m.Busy(); !within(busy, testTiming.Alone(cost)-testTiming.Launch) {
			t.Errorf("busy %v, want the work time %v (launch not counted)", busy, testTiming.Alone(cost)-testTiming.Launch)
		}
	})
}

// Two batches at once share the device: a batch of one unit beside one of
// two units finishes after 2 units of time (it got half the device), and
// the larger one after 3, when it has had the device to itself for the
// last unit. Their launches overlap.
func TestTimedModelSharesThroughput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := newTimed(t, testTiming, 64<<20)
		small, c1 := itemsOfCost(t, m.cfg, 1000)
		large := append(append([]job.Item(nil), small...), small...)
		c2 := m.Cost(large)
		if c2 != 2*c1 {
			t.Fatalf("cost of twice the items %d, want %d", c2, 2*c1)
		}
		unit := time.Duration(float64(c1) / testTiming.Throughput * float64(time.Second))
		var wg sync.WaitGroup
		took := make([]time.Duration, 2)
		start := time.Now()
		for i, items := range [][]job.Item{small, large} {
			wg.Go(func() {
				if _, err := m.Run(context.Background(), items); err != nil {
					t.Error(err)
				}
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		if want := testTiming.Launch + 2*unit; !within(took[0], want) {
			t.Errorf("small batch took %v, want %v", took[0], want)
		}
		if want := testTiming.Launch + 3*unit; !within(took[1], want) {
			t.Errorf("large batch took %v, want %v", took[1], want)
		}
		if busy := m.Busy(); !within(busy, 3*unit) {
			t.Errorf("busy %v, want %v: the device worked without a pause", busy, 3*unit)
		}
	})
}

// A batch that does not fit fails with gpu.ErrOutOfMemory after its launch, as
// a framework does part way into the forward pass, holding nothing after.
func TestTimedModelOutOfMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, sim := newTimed(t, testTiming, 1<<10)
		items, _ := itemsOfCost(t, m.cfg, 100)
		start := time.Now()
		_, err := m.Run(context.Background(), items)
		if !errors.Is(err, gpu.ErrOutOfMemory) {
			t.Fatalf("Run: %v, want gpu.ErrOutOfMemory", err)
		}
		if got := time.Since(start); got != testTiming.Launch {
			t.Errorf("the OOM came after %v, want the launch time %v", got, testTiming.Launch)
		}
		if info, _ := sim.MemInfo(); info.Used != m.Weights() {
			t.Errorf("memory in use %d after an OOM, want the weights %d", info.Used, m.Weights())
		}
	})
}

// A cancelled batch lets go of its memory and its share of the device: the
// batch beside it finishes as if it had been alone from then on.
func TestTimedModelCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, sim := newTimed(t, testTiming, 64<<20)
		items, c := itemsOfCost(t, m.cfg, 1000)
		unit := time.Duration(float64(c) / testTiming.Throughput * float64(time.Second))
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := m.Run(ctx, items)
			errc <- err
		}()
		start := time.Now()
		go func() {
			// Cancel when both have done half a unit of work each.
			time.Sleep(testTiming.Launch + unit)
			cancel()
		}()
		if _, err := m.Run(context.Background(), items); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled batch: %v, want context.Canceled", err)
		}
		// Half a unit done when sharing for one unit of time, the other half
		// alone: done at launch + 1.5 units.
		if got, want := time.Since(start), testTiming.Launch+unit+unit/2; !within(got, want) {
			t.Errorf("remaining batch took %v, want %v", got, want)
		}
		if info, _ := sim.MemInfo(); info.Used != m.Weights() {
			t.Errorf("memory in use %d, want the weights %d", info.Used, m.Weights())
		}
	})
}

func TestTimedModelClosed(t *testing.T) {
	m, sim := newTimed(t, DefaultTiming(), 1<<20)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Run(context.Background(), []job.Item{{ID: "x"}}); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("Run after Close: %v, want gpu.ErrClosed", err)
	}
	if info, _ := sim.MemInfo(); info.Used != 0 {
		t.Errorf("memory in use %d after Close, want 0", info.Used)
	}
}

func TestTimingValidate(t *testing.T) {
	for _, bad := range []Timing{{Launch: -1, Throughput: 1}, {Throughput: 0}, {Throughput: -5}} {
		if bad.Validate() == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	if err := DefaultTiming().Validate(); err != nil {
		t.Errorf("default timing: %v", err)
	}
}

// The device does not wait for the host. When the timer that should end
// the first of two tasks fires late, the device is brought up to date as it
// would have run: the small task ended at its due time and the large one
// had the whole device from then on. Charging the late interval evenly to
// both, as if the finished task still had work, loses throughput every time
// the machine is busy.
func TestSharedDeviceLateTimerLosesNoThroughput(t *testing.T) {
	const rate = 1 << 20        // bytes per second
	unit := float64(rate) / 100 // 10 ms of the whole device
	d := newSharedDevice(rate)
	t0 := time.Unix(1000, 0)
	small := &task{remaining: unit, done: make(chan struct{})}
	large := &task{remaining: 2 * unit, done: make(chan struct{})}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.last = t0
	d.tasks[small], d.tasks[large] = struct{}{}, struct{}{}
	// Shared, the small task is done after 20 ms; the timer fires at 25 ms.
	d.advance(t0.Add(25 * time.Millisecond))
	select {
	case <-small.done:
	default:
		t.Fatal("the small task is not done at 25 ms")
	}
	if _, left := d.tasks[small]; left {
		t.Error("the small task is still in progress")
	}
	// The large one: 1 unit by 20 ms, then the whole device for 5 ms.
	if want := unit / 2; math.Abs(large.remaining-want) > finishSlack {
		t.Errorf("large task has %.0f bytes left at 25 ms, want %.0f", large.remaining, want)
	}
	if d.busy != 25*time.Millisecond {
		t.Errorf("busy %v, want 25ms", d.busy)
	}
	d.advance(t0.Add(time.Second))
	select {
	case <-large.done:
	default:
		t.Fatal("the large task is not done a second later")
	}
	if want := 30 * time.Millisecond; d.busy < want-time.Microsecond || d.busy > want+time.Microsecond {
		t.Errorf("busy %v after both, want %v: the device idles once its work is done", d.busy, want)
	}
}
