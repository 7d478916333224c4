package refembed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// defaultWeights are generated once: every test reads them, none writes.
var defaultWeights = sync.OnceValue(func() *Weights {
	return GenerateWeights(DefaultConfig())
})

func newTestEmbedder(t testing.TB, mem gpu.Allocator) *Embedder {
	t.Helper()
	e, err := NewEmbedder(defaultWeights(), DefaultConfig(), mem)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func texts(ss ...string) []job.Item {
	items := make([]job.Item, len(ss))
	for i, s := range ss {
		items[i] = job.Item{ID: fmt.Sprint(i), Text: s}
	}
	return items
}

// sampleItems has items of many lengths, an empty one, a binary one and one
// past MaxTokens, and is not a multiple of the four rows matMulBias groups.
func sampleItems() []job.Item {
	items := texts(
		"The cat sat on the mat.",
		"",
		"GPU memory is the scarce resource; admission control keeps it from running out.",
		strings.Repeat("long text ", 400), // 800 words, truncated to 512
		"東京タワー",
		"x",
		"Queues hand out messages; the consumer decides how many it can hold.",
	)
	items = append(items, job.Item{ID: "binary", Data: []byte{1, 2, 3}})
	return items
}

func run(t *testing.T, e *Embedder, items []job.Item) []job.Output {
	t.Helper()
	out, err := e.Run(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(items) {
		t.Fatalf("Run gave %d outputs for %d items", len(out), len(items))
	}
	for i := range out {
		if out[i].ID != items[i].ID {
			t.Fatalf("output %d has id %q, want %q", i, out[i].ID, items[i].ID)
		}
	}
	return out
}

func cosine(a, b []float32) float64 {
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	return dot / math.Sqrt(na*nb)
}

func TestEmbedDeterministic(t *testing.T) {
	cfg := DefaultConfig()
	w1, w2 := GenerateWeights(cfg), GenerateWeights(cfg)
	if !slices.Equal(w1.Embedding, w2.Embedding) || !slices.Equal(w1.W1, w2.W1) || !slices.Equal(w1.B1, w2.B1) ||
		!slices.Equal(w1.W2, w2.W2) || !slices.Equal(w1.B2, w2.B2) {
		t.Fatal("the same seed generated different weights")
	}
	// Pin a few values so that a change to the generator, which would change
	// every embedding ever stored, cannot pass unnoticed.
	pinned := []float32{w1.Embedding[0], w1.W1[0], w1.B1[0], w1.W2[0], w1.B2[0]}
	want := []float32{-1.1992863, 0.003866583, -0.017563783, -0.024585042, -0.0029849857}
	if !slices.Equal(pinned, want) {
		t.Errorf("first weights = %#v, want %#v", pinned, want)
	}

	other := cfg
	other.Seed++
	if slices.Equal(GenerateWeights(other).W1, w1.W1) {
		t.Error("a different seed generated the same weights")
	}
	wider := cfg
	wider.Vocab *= 2
	if !slices.Equal(GenerateWeights(wider).W1, w1.W1) {
		t.Error("changing Vocab changed W1, which it does not shape")
	}

	e1, err := NewEmbedder(w1, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	e2, err := NewEmbedder(w2, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := run(t, e1, sampleItems()), run(t, e2, sampleItems())
	for i := range a {
		if !slices.Equal(a[i].Embedding, b[i].Embedding) {
			t.Errorf("item %d: outputs differ between runs", i)
		}
	}
}

func TestEmbedUnitNorm(t *testing.T) {
	e := newTestEmbedder(t, nil)
	for i, o := range run(t, e, sampleItems()) {
		if len(o.Embedding) != DefaultConfig().Out {
			t.Fatalf("item %d: %d dims", i, len(o.Embedding))
		}
		var ss float64
		for _, v := range o.Embedding {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("item %d: %v in output", i, v)
			}
			ss += float64(v) * float64(v)
		}
		if math.Abs(math.Sqrt(ss)-1) > 1e-5 {
			t.Errorf("item %d: norm %v", i, math.Sqrt(ss))
		}
	}
}

func TestEmbedSimilarity(t *testing.T) {
	e := newTestEmbedder(t, nil)
	out := run(t, e, texts(
		"The cat sat on the mat in the sun.",
		"A cat sat on a mat in the sun!",
		"Quarterly revenue grew eight percent, beating analyst estimates.",
		"the CAT sat on THE mat, in the sun",
	))
	similar := cosine(out[0].Embedding, out[1].Embedding)
	unrelated := cosine(out[0].Embedding, out[2].Embedding)
	t.Logf("cosine: similar %.3f, unrelated %.3f", similar, unrelated)
	if similar < unrelated+0.1 {
		t.Errorf("similar texts (%.3f) not clearly closer than unrelated ones (%.3f)", similar, unrelated)
	}
	if !slices.Equal(out[0].Embedding, out[3].Embedding) {
		t.Error("case and punctuation changed the embedding")
	}
}

func TestEmbedBatchingLeavesOutputsUnchanged(t *testing.T) {
	e := newTestEmbedder(t, nil)
	items := sampleItems()
	batch := run(t, e, items)
	for i, it := range items {
		alone := run(t, e, []job.Item{it})
		if !slices.Equal(alone[0].Embedding, batch[i].Embedding) {
			t.Errorf("item %d: batched output differs from its output alone", i)
		}
	}
	// Enough items for several row blocks, with the same item everywhere.
	many := make([]job.Item, 2*rowBlock+3)
	for i := range many {
		many[i] = job.Item{ID: fmt.Sprint(i), Text: items[i%len(items)].Text}
	}
	for i, o := range run(t, e, many) {
		if !slices.Equal(o.Embedding, batch[i%len(items)].Embedding) {
			t.Errorf("item %d of %d: output differs from the small batch's", i, len(many))
		}
	}
}

func TestEmbedOutputsDoNotAlias(t *testing.T) {
	e := newTestEmbedder(t, nil)
	out := run(t, e, texts("a", "b"))
	second := slices.Clone(out[1].Embedding)
	_ = append(out[0].Embedding, 42)
	if !slices.Equal(out[1].Embedding, second) {
		t.Error("appending to one output changed the next")
	}
}

func TestEmbedCostModel(t *testing.T) {
	cfg := DefaultConfig()
	m := cfg.CostModel()
	if want := (gpu.CostModel{PerToken: 4 + 4*256, PerItem: 4 + 4*(256+1024+256)}); m != want {
		t.Errorf("CostModel() = %+v, want %+v", m, want)
	}
	e := newTestEmbedder(t, nil)
	if got := e.Cost(nil); got != 0 {
		t.Errorf("Cost(nil) = %d", got)
	}
	for _, tt := range []struct {
		text   string
		tokens int64
	}{
		{"", 1},
		{"one", 1},
		{"one two three", 3},
		{strings.Repeat("w ", 10_000), 512},
	} {
		if got, want := e.Cost(texts(tt.text)), m.Bytes(tt.tokens, 1); got != want {
			t.Errorf("Cost(%.20q) = %d, want %d (%d tokens)", tt.text, got, want, tt.tokens)
		}
	}
}

func TestEmbedCostAdds(t *testing.T) {
	e := newTestEmbedder(t, nil)
	items := sampleItems()
	var sum int64
	for _, it := range items {
		sum += e.Cost([]job.Item{it})
	}
	if got := e.Cost(items); got != sum {
		t.Errorf("Cost(all) = %d, sum of Cost(each) = %d", got, sum)
	}
	for cut := range len(items) + 1 {
		if a, b, all := e.Cost(items[:cut]), e.Cost(items[cut:]), e.Cost(items); a+b != all {
			t.Errorf("split at %d: %d + %d != %d", cut, a, b, all)
		}
	}
}

func TestEmbedCostIsWhatRunAllocates(t *testing.T) {
	for _, items := range [][]job.Item{
		texts(""),
		texts("one item of a few words"),
		sampleItems(),
	} {
		sim := gpu.NewSim(1 << 30)
		e := newTestEmbedder(t, sim)
		if m, _ := sim.MemInfo(); m.Used != e.Weights() {
			t.Fatalf("after NewEmbedder, Used = %d, want Weights() = %d", m.Used, e.Weights())
		}
		run(t, e, items)
		if got, want := sim.Peak(), e.Weights()+e.Cost(items); got != want {
			t.Errorf("%d items: Peak() = %d, want Weights()+Cost() = %d (off by %d)", len(items), got, want, got-want)
		}
		if m, _ := sim.MemInfo(); m.Used != e.Weights() {
			t.Errorf("after Run, Used = %d, want Weights() = %d", m.Used, e.Weights())
		}
		e.Close()
		if m, _ := sim.MemInfo(); m.Used != 0 {
			t.Errorf("after Close, Used = %d", m.Used)
		}
	}
}

func TestEmbedOutOfMemory(t *testing.T) {
	items := sampleItems()
	probe := newTestEmbedder(t, nil)
	need := probe.Weights() + probe.Cost(items)

	sim := gpu.NewSim(need - 1)
	e := newTestEmbedder(t, sim)
	_, err := e.Run(context.Background(), items)
	if !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("Run one byte short: err = %v, want gpu.ErrOutOfMemory", err)
	}
	t.Logf("OOM: %v", err)
	if m, _ := sim.MemInfo(); m.Used != e.Weights() {
		t.Errorf("after the OOM, Used = %d, want Weights() = %d", m.Used, e.Weights())
	}
	// The halves fit, which is what the subscriber's retry relies on.
	run(t, e, items[:len(items)/2])
	run(t, e, items[len(items)/2:])

	exact := gpu.NewSim(need)
	run(t, newTestEmbedder(t, exact), items)

	if _, err := NewEmbedder(defaultWeights(), DefaultConfig(), gpu.NewSim(probe.Weights()-1)); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("NewEmbedder on a device smaller than the weights: err = %v, want gpu.ErrOutOfMemory", err)
	}
}

func TestEmbedContext(t *testing.T) {
	sim := gpu.NewSim(1 << 30)
	e := newTestEmbedder(t, sim)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Run(ctx, sampleItems()); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context: err = %v", err)
	}
	if m, _ := sim.MemInfo(); m.Used != e.Weights() {
		t.Errorf("after a cancelled Run, Used = %d, want %d", m.Used, e.Weights())
	}
}

func TestEmbedClose(t *testing.T) {
	sim := gpu.NewSim(1 << 30)
	e := newTestEmbedder(t, sim)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if m, _ := sim.MemInfo(); m.Used != 0 {
		t.Errorf("after Close, Used = %d", m.Used)
	}
	if _, err := e.Run(context.Background(), texts("x")); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("Run after Close: err = %v, want gpu.ErrClosed", err)
	}
}

func TestEmbedEmptyBatch(t *testing.T) {
	out, err := newTestEmbedder(t, nil).Run(context.Background(), nil)
	if err != nil || len(out) != 0 {
		t.Errorf("Run(nil) = %v, %v", out, err)
	}
}

func TestEmbedConcurrent(t *testing.T) {
	items := sampleItems()
	want := run(t, newTestEmbedder(t, nil), items)

	// Room for the weights and two batches: of four runners, some must OOM.
	probe := newTestEmbedder(t, nil)
	sim := gpu.NewSim(probe.Weights() + 2*probe.Cost(items))
	e := newTestEmbedder(t, sim)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				out, err := e.Run(context.Background(), items)
				if errors.Is(err, gpu.ErrOutOfMemory) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				for i := range out {
					if !slices.Equal(out[i].Embedding, want[i].Embedding) {
						t.Errorf("item %d: concurrent output differs", i)
					}
				}
			}
		})
	}
	wg.Wait()
	if m, _ := sim.MemInfo(); m.Used != e.Weights() {
		t.Errorf("after every Run, Used = %d, want %d", m.Used, e.Weights())
	}
	if p := sim.Peak(); p > e.Weights()+2*e.Cost(items) {
		t.Errorf("Peak() = %d beyond capacity", p)
	}
}

func TestEmbedConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	bad := Config{Vocab: 1, Dim: 0, Hidden: -1, Out: 1 << 30, MaxTokens: 0}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad config: no error")
	}
	for _, field := range []string{"Vocab", "Dim", "Hidden", "Out", "MaxTokens"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	if _, err := NewEmbedder(defaultWeights(), bad, nil); err == nil {
		t.Error("NewEmbedder with a bad config: no error")
	}
}

func TestNewEmbedderChecksShapes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Hidden = 512
	if _, err := NewEmbedder(defaultWeights(), cfg, nil); err == nil || !strings.Contains(err.Error(), "W1") {
		t.Errorf("weights for Hidden 1024 with a config of 512: err = %v", err)
	}
	if _, err := NewEmbedder(nil, DefaultConfig(), nil); err == nil {
		t.Error("nil weights: no error")
	}
}

func TestEmbedWeightsBytes(t *testing.T) {
	e := newTestEmbedder(t, nil)
	const want = 4 * (16384*256 + 256*1024 + 1024 + 1024*256 + 256)
	if got := e.Weights(); got != want {
		t.Errorf("Weights() = %d, want %d", got, want)
	}
	if !strings.HasPrefix(e.Name(), "ref-embed-v1-") || !strings.Contains(e.Name(), "d256") {
		t.Errorf("Name() = %q", e.Name())
	}
}

func TestMatMulBias(t *testing.T) {
	// 5 rows: one block of four and one row on its own.
	const rows, k, m = 5, 3, 2
	a := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	b := []float32{1, 0, 0, 1, 1, 1}
	bias := []float32{0.5, -0.5}
	got := make([]float32, rows*m)
	matMulBias(got, a, b, bias, rows, k, m)
	var want []float32
	for i := range rows {
		r := a[i*k : (i+1)*k]
		want = append(want, r[0]+r[2]+0.5, r[1]+r[2]-0.5)
	}
	if !slices.Equal(got, want) {
		t.Errorf("matMulBias = %v, want %v", got, want)
	}
}

func BenchmarkEmbedderRun(b *testing.B) {
	e := newTestEmbedder(b, nil)
	// 64 distinct words per item: no two items, and no two words of one
	// item, share an embedding row.
	item := func(i int) job.Item {
		var sb strings.Builder
		for w := range 64 {
			fmt.Fprintf(&sb, "w%dx%d ", i, w)
		}
		return job.Item{ID: fmt.Sprint(i), Text: sb.String()}
	}
	for _, n := range []int{1, 8, 32} {
		items := make([]job.Item, n)
		for i := range items {
			items[i] = item(i)
		}
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				if _, err := e.Run(ctx, items); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "items/s")
		})
	}
}

func BenchmarkGenerateEmbedWeights(b *testing.B) {
	for b.Loop() {
		GenerateWeights(DefaultConfig())
	}
}
