package calibrate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/refembed"
)

// roundingAlloc stands in for a GPU driver: every allocation takes a whole
// number of granules from the gpu.Sim, as cuMemAlloc takes whole 2 MiB pages.
// It keeps the most it held at once, rounding included, for roundingMeter.
type roundingAlloc struct {
	sim     *gpu.Sim
	granule int64

	mu         sync.Mutex
	held, peak int64
}

func (r *roundingAlloc) Alloc(n int64) (func(), error) {
	took := (n + r.granule - 1) / r.granule * r.granule
	free, err := r.sim.Alloc(took)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.held += took
	r.peak = max(r.peak, r.held)
	r.mu.Unlock()
	return sync.OnceFunc(func() {
		free()
		r.mu.Lock()
		r.held -= took
		r.mu.Unlock()
	}), nil
}

// roundingMeter measures a batch as the driver's free memory would show it:
// the most its roundingAlloc held during the batch beyond what it held
// before (the weights). The Embedder's own Measure counts the sizes asked
// for. One batch at a time, as Calibrate measures.
type roundingMeter struct {
	*refembed.Embedder
	alloc *roundingAlloc
}

func (m roundingMeter) Measure(ctx context.Context, items []job.Item) (int64, error) {
	m.alloc.mu.Lock()
	before := m.alloc.held
	m.alloc.peak = before
	m.alloc.mu.Unlock()
	_, err := m.Run(ctx, items)
	m.alloc.mu.Lock()
	defer m.alloc.mu.Unlock()
	return m.alloc.peak - before, err
}

// smallConfig runs fast on the CPU, yet its gathered rows take 1 KiB a
// token, so a batch's biggest buffer crosses 2 MiB granules as it grows.
var smallConfig = refembed.Config{Vocab: 1024, Dim: 256, Hidden: 64, Out: 16, MaxTokens: 512, Seed: 7}

func newCalibEmbedder(t *testing.T, cfg refembed.Config, mem gpu.Allocator) *refembed.Embedder {
	t.Helper()
	e, err := refembed.NewEmbedder(refembed.GenerateWeights(cfg), cfg, mem)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func tokensOf(cfg refembed.Config, items []job.Item) int64 {
	var n int64
	for _, it := range items {
		n += int64(cfg.CountTokens(it.Text))
	}
	return n
}

func TestCostModelPerBatch(t *testing.T) {
	m := gpu.CostModel{PerToken: 10, PerItem: 100, PerBatch: 1000}
	if got := m.Bytes(7, 2); got != 7*10+2*100+1000 {
		t.Errorf("Bytes(7, 2) = %d", got)
	}
	if got := m.Bytes(0, 0); got != 0 {
		t.Errorf("Bytes(0, 0) = %d: a Run of nothing allocates nothing", got)
	}
	if err := (gpu.CostModel{PerBatch: -1}).Validate(); err == nil {
		t.Error("a negative PerBatch validated")
	}

	// Once per Cost call: two messages estimated apart cost more than the
	// batch of both, by exactly the PerBatch the batch needs only once.
	e := newCalibEmbedder(t, smallConfig, nil)
	analytic := e.CostModel()
	if analytic != smallConfig.CostModel() || analytic.PerBatch != 0 {
		t.Fatalf("CostModel() = %+v before any SetCostModel, want the analytic %+v", analytic, smallConfig.CostModel())
	}
	a, b := texts("one two three"), texts("four five")
	both := append(append([]job.Item{}, a...), b...)
	if e.Cost(a)+e.Cost(b) != e.Cost(both) {
		t.Errorf("with PerBatch 0, costs must add up exactly: %d + %d != %d", e.Cost(a), e.Cost(b), e.Cost(both))
	}
	if err := e.SetCostModel(gpu.CostModel{PerToken: 1, PerItem: -1}); err == nil {
		t.Error("SetCostModel took a negative coefficient")
	}
	cal := gpu.CostModel{PerToken: analytic.PerToken, PerItem: analytic.PerItem, PerBatch: 3 << 20}
	if err := e.SetCostModel(cal); err != nil {
		t.Fatal(err)
	}
	if e.CostModel() != cal {
		t.Errorf("CostModel() = %+v after SetCostModel(%+v)", e.CostModel(), cal)
	}
	if got, want := e.Cost(a)+e.Cost(b)-e.Cost(both), cal.PerBatch; got != want {
		t.Errorf("sum of parts - cost of the batch = %d, want PerBatch %d", got, want)
	}
	if got, want := e.Cost(a), cal.Bytes(3, 1); got != want {
		t.Errorf("Cost = %d, want %d", got, want)
	}
}

func TestMeasureIsExactAlongsideOtherBatches(t *testing.T) {
	sim := gpu.NewSim(1 << 30)
	e := newCalibEmbedder(t, smallConfig, sim)
	items := Sweep{MaxItems: 6, Points: 4, Seed: 3}.Batches(smallConfig.MaxTokens)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for _, b := range items {
				if _, err := e.Run(t.Context(), b); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for _, b := range items {
		peak, err := e.Measure(t.Context(), b)
		if err != nil {
			t.Fatal(err)
		}
		if want := smallConfig.CostModel().Bytes(tokensOf(smallConfig, b), int64(len(b))); peak != want {
			t.Errorf("Measure(%d items) = %d with other batches running, want exactly %d", len(b), peak, want)
		}
	}
	wg.Wait()
	if _, err := e.Measure(t.Context(), nil); err != nil {
		t.Errorf("Measure of no items: %v", err)
	}
}

func TestSweepBatches(t *testing.T) {
	s := Sweep{MaxItems: 40, Points: 12, Seed: 5}
	b1, b2 := s.Batches(smallConfig.MaxTokens), s.Batches(smallConfig.MaxTokens)
	if !reflect.DeepEqual(b1, b2) {
		t.Fatal("the same sweep made different batches")
	}
	if reflect.DeepEqual(b1, Sweep{MaxItems: 40, Points: 12, Seed: 6}.Batches(smallConfig.MaxTokens)) {
		t.Error("another seed made the same batches")
	}
	mt := smallConfig.MaxTokens
	seen := map[[2]int]bool{}
	counts := map[int]bool{}
	lengths := map[int]bool{}
	for _, b := range b1 {
		n, total := len(b), 0
		for _, it := range b {
			k := smallConfig.CountTokens(it.Text)
			if k < 1 || k > mt || len(strings.Fields(it.Text)) != k {
				t.Fatalf("item of %d words counts %d tokens (max %d)", len(strings.Fields(it.Text)), k, mt)
			}
			total += k
			lengths[k] = true
		}
		seen[[2]int{n, total}] = true
		counts[n] = true
	}
	for _, corner := range [][2]int{{1, 1}, {1, mt}, {40, 40}, {40, 40 * mt}} {
		if !seen[corner] {
			t.Errorf("no batch of %d items, %d tokens: the sweep must include the corners of its range", corner[0], corner[1])
		}
	}
	for n := 1; n <= 16; n++ {
		if !counts[n] {
			t.Errorf("no batch of %d items", n)
		}
	}
	if len(lengths) < 100 {
		t.Errorf("only %d distinct item lengths: the batches should mix lengths", len(lengths))
	}
	if err := (Sweep{MaxItems: 0, Points: 1}).Validate(); err == nil || !strings.Contains(err.Error(), "max items") || !strings.Contains(err.Error(), "points") {
		t.Errorf("Validate of a zero sweep: %v", err)
	}
}

// On the CPU reference model the allocator is exact, so the fit must find
// the analytic model itself, with nothing per batch.
func TestCalibrateRecoversAnalyticModel(t *testing.T) {
	cfg := refembed.DefaultConfig()
	sim := gpu.NewSim(1 << 30)
	e := newCalibEmbedder(t, cfg, sim)
	tm, err := timed.New(cfg, timed.Timing{Throughput: 1 << 50}, gpu.NewSim(1<<30))
	if err != nil {
		t.Fatal(err)
	}
	defer tm.Close()
	for _, m := range []Meter{e, tm} {
		c, err := Calibrate(t.Context(), m, "sim", Sweep{MaxItems: 8, Points: 16, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", c)
		want := cfg.CostModel()
		if c.Raw != want || c.Cost != want {
			t.Errorf("%s: raw %+v, fitted %+v; want the analytic %+v exactly", m.Name(), c.Raw, c.Cost, want)
		}
		if c.WorstUnderRaw.Bytes != 0 || c.Margin != 0 || c.WorstOver.Bytes != 0 {
			t.Errorf("%s: worst under %v, margin %d, worst over %v; want all 0", m.Name(), c.WorstUnderRaw, c.Margin, c.WorstOver)
		}
		if c.Model != m.Name() || c.Device != "sim" || len(c.Samples) < 50 {
			t.Errorf("calibration of %s on %s with %d samples", c.Model, c.Device, len(c.Samples))
		}
	}
	if used, _ := sim.MemInfo(); used.Used != cfg.WeightBytes() {
		t.Errorf("after the sweep %d bytes are in use, want only the weights' %d", used.Used, cfg.WeightBytes())
	}
}

// Over an allocator that rounds every buffer up, as a GPU driver does, the
// fitted model must not under-estimate any sample, nor any batch of the
// sweep's range that the sweep did not measure.
func TestCalibrateRoundingAllocatorNeverUnderEstimates(t *testing.T) {
	const maxItems = 48
	cfg, granules := smallConfig, []int64{2 << 20, 64 << 10}
	freshRandom := 150
	if raceDetector {
		// Each case runs hundreds of batches of the CPU model, which the
		// race detector slows more than tenfold, for no concurrency to
		// check. Under it (make test) the rows are a quarter as wide and
		// the granules a quarter as large: the same number of tokens fill
		// a granule, so the allocations jump at the same batches, with a
		// quarter of the arithmetic. A plain go test runs the real sizes.
		// And one granule, the driver's, with fewer random fresh batches.
		cfg.Dim /= 4
		granules, freshRandom = []int64{granules[0] / 4}, 50
	}
	for _, granule := range granules {
		t.Run(bytesize.Format(granule), func(t *testing.T) {
			t.Parallel()
			alloc := &roundingAlloc{sim: gpu.NewSim(4 << 30), granule: granule}
			e := newCalibEmbedder(t, cfg, alloc)
			meter := roundingMeter{e, alloc}
			c, err := Calibrate(t.Context(), meter, "rounding", Sweep{MaxItems: maxItems, Points: 32, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s", c)
			if c.WorstUnderRaw.Bytes <= 0 || c.Cost.PerBatch <= c.Raw.PerBatch {
				t.Errorf("the least squares under-estimated nothing (%v), or PerBatch was not raised (%d to %d): the test shows nothing",
					c.WorstUnderRaw, c.Raw.PerBatch, c.Cost.PerBatch)
			}
			for _, s := range c.Samples {
				if est := c.Cost.Bytes(s.Tokens, int64(s.Items)); est < s.Bytes {
					t.Errorf("%v estimated at %d", s, est)
				}
			}
			if c.Cost.PerBatch != c.Raw.PerBatch+c.WorstUnderRaw.Bytes+c.Margin {
				t.Errorf("PerBatch %d != raw %d + worst under-estimate %d + margin %d", c.Cost.PerBatch, c.Raw.PerBatch,
					c.WorstUnderRaw.Bytes, c.Margin)
			}
			if err := e.SetCostModel(c.Cost); err != nil {
				t.Fatal(err)
			}

			// Fresh batches: uniform lengths, the sweep's mixed lengths
			// with another seed, and totals just past each point where the
			// gathered rows fill a granule (where an allocation jumps).
			r := rand.New(rand.NewPCG(99, 1))
			var fresh [][]job.Item
			for range freshRandom {
				n := 1 + r.IntN(maxItems)
				items := make([]job.Item, n)
				for i := range items {
					items[i] = job.Item{ID: strconv.Itoa(i), Text: sweepText(r, 1+r.IntN(cfg.MaxTokens))}
				}
				fresh = append(fresh, items)
			}
			fresh = append(fresh, Sweep{MaxItems: maxItems, Points: 16, Seed: 12345}.Batches(cfg.MaxTokens)...)
			perGranule := int(granule / (4 * int64(cfg.Dim)))
			maxTotal := maxItems * cfg.MaxTokens
			// Every granule's edge for 2 MiB; a spread of 48 of them for
			// the many edges of 64 KiB.
			stride := perGranule * max(1, maxTotal/perGranule/48)
			for total := perGranule + 1; total <= maxTotal; total += stride {
				for _, n := range []int{(total + cfg.MaxTokens - 1) / cfg.MaxTokens, maxItems} {
					if n > total || n > maxItems {
						continue
					}
					items := make([]job.Item, n)
					for i, k := range splitTokens(r, total, n, cfg.MaxTokens) {
						items[i] = job.Item{ID: strconv.Itoa(i), Text: sweepText(r, k)}
					}
					fresh = append(fresh, items)
				}
			}
			var worstSlack int64 = -1
			for _, items := range fresh {
				peak, err := meter.Measure(t.Context(), items)
				if err != nil {
					t.Fatal(err)
				}
				est := e.Cost(items)
				if est < peak {
					t.Errorf("fresh batch of %d items, %d tokens: measured %d, estimated %d: under by %d",
						len(items), tokensOf(cfg, items), peak, est, peak-est)
				}
				if worstSlack < 0 || est-peak < worstSlack {
					worstSlack = est - peak
				}
			}
			t.Logf("%d fresh batches, none under-estimated; the closest was over by %s", len(fresh), exactBytes(worstSlack))
		})
	}
}

// The bound from monotonicity alone (Calibration.MonotoneBound, what the
// report sets beside the measured margin) is checked against every batch of
// a small range, for a memory function that is monotone but far from
// linear, from as few as 9 samples: where the measured margin, from so few,
// may fall short.
func TestMonotoneBoundCoversEveryBatchInRange(t *testing.T) {
	const maxN, maxT = 7, 30
	truth := func(tok, n int64) int64 { // three rounded buffers and a fixed one
		round := func(x, g int64) int64 { return (x + g - 1) / g * g }
		return round(37*tok, 256) + round(101*n, 512) + round(5*tok+3*n, 128) + 64
	}
	r := rand.New(rand.NewPCG(4, 4))
	for trial := range 50 {
		var samples []Sample
		add := func(tok, n int64) {
			samples = append(samples, Sample{Items: int(n), Tokens: tok, Bytes: truth(tok, n)})
		}
		add(1, 1)
		add(maxT, 1)
		add(maxN, maxN)
		add(maxN*maxT, maxN)
		for range 5 + r.IntN(20) {
			n := 1 + r.Int64N(maxN)
			add(n+r.Int64N(n*maxT-n+1), n)
		}
		c, err := Fit(samples)
		if err != nil {
			t.Fatal(err)
		}
		bound := c.Raw
		bound.PerBatch += c.WorstUnderRaw.Bytes + c.MonotoneBound
		for n := int64(1); n <= maxN; n++ {
			for tok := n; tok <= n*maxT; tok++ {
				if est, want := bound.Bytes(tok, n), truth(tok, n); est < want {
					t.Fatalf("trial %d (%d samples): batch of %d items, %d tokens: estimated %d, needs %d\n%s", trial, len(samples), n, tok, est, want, c)
				}
			}
		}
	}
}

func TestFit(t *testing.T) {
	// Exact data with a constant: recovered exactly, no margin.
	var samples []Sample
	for n := 1; n <= 5; n++ {
		for tok := int64(n); tok <= int64(n)*40; tok += 7 {
			samples = append(samples, Sample{Items: n, Tokens: tok, Bytes: 100*tok + 1000*int64(n) + 5000})
		}
	}
	c, err := Fit(samples)
	if err != nil {
		t.Fatal(err)
	}
	if want := (gpu.CostModel{PerToken: 100, PerItem: 1000, PerBatch: 5000}); c.Cost != want || c.Margin != 0 || c.WorstOver.Bytes != 0 {
		t.Errorf("fit of exact data: %+v, margin %d, worst over %v; want %+v", c.Cost, c.Margin, c.WorstOver, want)
	}

	// A negative intercept is not allowed: least squares pins it at 0 and
	// still covers every sample.
	samples = samples[:0]
	for tok := int64(1); tok <= 50; tok++ {
		samples = append(samples, Sample{Items: 1, Tokens: tok, Bytes: max(0, 100*tok-2000)})
	}
	c, err = Fit(samples)
	if err != nil {
		t.Fatal(err)
	}
	if c.Raw.PerToken < 0 || c.Raw.PerItem < 0 || c.Raw.PerBatch < 0 {
		t.Errorf("negative coefficient: %+v", c.Raw)
	}
	for _, s := range samples {
		if c.Cost.Bytes(s.Tokens, 1) < s.Bytes {
			t.Errorf("%v under-estimated by %+v", s, c.Cost)
		}
	}

	// One item per batch: items and batches cannot be told apart, and the
	// constant goes per item, the larger charge for batches of several.
	samples = samples[:0]
	for tok := int64(1); tok <= 20; tok++ {
		samples = append(samples, Sample{Items: 1, Tokens: tok, Bytes: 10*tok + 300})
	}
	if c, err = Fit(samples); err != nil {
		t.Fatal(err)
	}
	if want := (gpu.CostModel{PerToken: 10, PerItem: 300}); c.Cost != want {
		t.Errorf("fit of one-item batches: %+v, want %+v", c.Cost, want)
	}

	for _, bad := range [][]Sample{nil, {{Items: 0, Tokens: 1, Bytes: 1}}, {{Items: 2, Tokens: 1, Bytes: 1}},
		{{Items: 1, Tokens: 1, Bytes: -1}}} {
		if _, err := Fit(bad); err == nil {
			t.Errorf("Fit(%v) took it", bad)
		}
	}
}

func TestCostModelFile(t *testing.T) {
	e := newCalibEmbedder(t, smallConfig, gpu.NewSim(1<<30))
	c, err := Calibrate(t.Context(), e, "sim", Sweep{MaxItems: 4, Points: 4, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := c.File()
	f.PerBatch = 4096 // as a GPU's would have
	path := filepath.Join(t.TempDir(), "cost.json")
	if err := SaveCostModel(path, f); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"model"`, `"device"`, `"per_token"`, `"per_item"`, `"per_batch"`, `"samples"`,
		`"worst_under_estimate_raw"`, `"worst_over_estimate"`, `"fitted_at"`} {
		if !strings.Contains(string(raw), key) {
			t.Errorf("the file has no %s:\n%s", key, raw)
		}
	}
	got, err := ReadCostModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(f, got); diff != "" {
		t.Errorf("round trip (-saved +read):\n%s", diff)
	}

	loaded, err := LoadCostModel(path, e, "sim")
	if err != nil {
		t.Fatal(err)
	}
	if e.CostModel() != loaded.CostModel || e.CostModel().PerBatch != 4096 {
		t.Errorf("after LoadCostModel the model applies %+v, want %+v", e.CostModel(), loaded.CostModel)
	}
	if got, want := e.Cost(texts("a b")), smallConfig.CostModel().Bytes(2, 1)+4096; got != want {
		t.Errorf("Cost = %d after loading, want %d", got, want)
	}

	other := newCalibEmbedder(t, refembed.Config{Vocab: 1024, Dim: 128, Hidden: 64, Out: 16, MaxTokens: 512}, nil)
	before := other.CostModel()
	if _, err := LoadCostModel(path, other, "sim"); err == nil || !strings.Contains(err.Error(), "fitted for model") {
		t.Errorf("a cost model of %s loaded onto %s: %v", f.Model, other.Name(), err)
	}
	if other.CostModel() != before {
		t.Error("a refused cost model was applied")
	}
	if _, err := LoadCostModel(path, e, "NVIDIA H100 80GB HBM3"); err == nil || !strings.Contains(err.Error(), "fitted on device") {
		t.Errorf("a cost model fitted on sim loaded for a GPU: %v", err)
	}
	tm, err := timed.New(smallConfig, timed.DefaultTiming(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tf := f
	tf.Model = tm.Name()
	tpath := filepath.Join(t.TempDir(), "timed.json")
	if err := SaveCostModel(tpath, tf); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCostModel(tpath, tm, "sim"); err == nil || !strings.Contains(err.Error(), "does not take") {
		t.Errorf("a model without SetCostModel: %v", err)
	}

	for _, tc := range []struct{ body, want string }{
		{`{"model":"m","device":"d","per_token":1,"per_item":1,"per_batch":-5}`, "negative"},
		{`{"model":"m","device":"d","per_token":1,"per_item":1}`, `missing "per_batch"`},
		{`{"model":"m","device":"d","per_token":1,"per_item":1,"per_bacth":5,"per_batch":0}`, "unknown field"},
		{`{"device":"d","per_token":1,"per_item":1,"per_batch":0}`, `no "model"`},
		{`not json`, "invalid"},
	} {
		p := filepath.Join(t.TempDir(), "bad.json")
		if err := os.WriteFile(p, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadCostModel(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadCostModel(%s) = %v, want an error saying %q", tc.body, err, tc.want)
		}
	}
	if _, err := ReadCostModel(filepath.Join(t.TempDir(), "none.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
	if err := SaveCostModel(path, CostModelFile{Model: "m", Device: "d", CostModel: gpu.CostModel{PerItem: -1}}); err == nil {
		t.Error("SaveCostModel wrote a negative coefficient")
	}
}

func TestCalibrateReportsOutOfMemory(t *testing.T) {
	cfg := smallConfig
	e := newCalibEmbedder(t, cfg, gpu.NewSim(cfg.WeightBytes()+1<<20))
	_, err := Calibrate(t.Context(), e, "sim", Sweep{MaxItems: 8, Points: 4, Seed: 1})
	if !errors.Is(err, gpu.ErrOutOfMemory) || !strings.Contains(err.Error(), "items") {
		t.Errorf("a sweep too big for the device: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Calibrate(ctx, e, "sim", Sweep{MaxItems: 2, Points: 2, Seed: 1}); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled sweep: %v", err)
	}
}

func texts(ss ...string) []job.Item {
	items := make([]job.Item, len(ss))
	for i, s := range ss {
		items[i] = job.Item{ID: fmt.Sprint(i), Text: s}
	}
	return items
}

var (
	_ Meter               = (*refembed.Embedder)(nil)
	_ Meter               = (*timed.Model)(nil)
	_ gpu.CostModelSetter = (*refembed.Embedder)(nil)
)
