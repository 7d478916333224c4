package bert

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/wordpiece"
)

// servedShape is a small model with the real tokenizer's vocabulary, so
// that texts tokenize as they would for all-MiniLM-L6-v2.
var servedShape = Generated{
	Config: Config{VocabSize: 30522, HiddenSize: 32, NumLayers: 2, NumHeads: 2,
		IntermediateSize: 64, MaxPositionEmbeddings: 128, TypeVocabSize: 2, LayerNormEps: 1e-12},
	MaxSeqLength: 96,
	Seed:         11,
}

// servedModelDir generates servedShape into a temporary directory.
func servedModelDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "served-tiny")
	if err := Generate(dir, "../wordpiece/testdata/tokenizer", servedShape); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sentence returns a text of about words words from r.
func sentence(r *rand.Rand, words int) string {
	pool := strings.Fields("the quick brown fox jumps over a lazy dog while queue messages wait for memory on the device déjà vu naïve 東京 emoji 🙂 unbelievably antidisestablishmentarianism")
	var b strings.Builder
	for i := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(pool[r.IntN(len(pool))])
	}
	return b.String()
}

// TestEmbedderRunsLikeEmbed checks that Run's outputs, computed in
// sub-batches by length bucket, are what Embed gives for each text's
// tokens alone, in the items' order and with their ids; and that the model
// is named after its directory.
func TestEmbedderRunsLikeEmbed(t *testing.T) {
	e, err := Open(servedModelDir(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if e.Name() != "bert:served-tiny" {
		t.Errorf("Name() = %q, want bert:served-tiny", e.Name())
	}
	r := rand.New(rand.NewPCG(1, 2))
	var items []job.Item
	for i, words := range []int{0, 3, 40, 1, 200, 12, 12, 70, 5} {
		items = append(items, job.Item{ID: fmt.Sprintf("i%d", i), Text: sentence(r, words)})
	}
	outs, err := e.Run(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != len(items) {
		t.Fatalf("%d outputs for %d items", len(outs), len(items))
	}
	long := false
	var tokens, longest int64
	for i, it := range items {
		ids := e.tok.Encode(it.Text, e.m.MaxSeqLength())
		long = long || len(ids) == e.m.MaxSeqLength()
		tokens += int64(len(ids))
		longest = max(longest, int64(len(ids)))
		want, err := e.m.Embed([][]int32{ids})
		if err != nil {
			t.Fatal(err)
		}
		if outs[i].ID != it.ID {
			t.Errorf("output %d has id %q, want %q", i, outs[i].ID, it.ID)
		}
		if d := maxAbsDiff(outs[i].Embedding, want[0]); d > paddingTolerance || len(outs[i].Embedding) != e.m.Dim() {
			t.Errorf("item %d (%d tokens): %d values, %.3g from Embed alone", i, len(ids), len(outs[i].Embedding), d)
		}
	}
	if !long {
		t.Error("no item reached max_seq_length: truncation is not exercised")
	}
	p := e.Padding()
	if p.Tokens != tokens || p.Computed < tokens || 16*(p.Computed-tokens) >= tokens || p.OneBatch != longest*int64(len(items)) {
		t.Errorf("Padding() = %+v; want %d tokens, under 1/16 more computed, %d as one batch", p, tokens, longest*int64(len(items)))
	}
}

// TestEmbedderRefusesBinaryData checks that an item with data instead of
// text fails its batch as invalid input, naming the item, in Run and Launch.
func TestEmbedderRefusesBinaryData(t *testing.T) {
	e, err := Open(servedModelDir(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	items := []job.Item{{ID: "ok", Text: "fine"}, {ID: "bin", Data: []byte{0, 1, 2}}}
	_, err = e.Run(context.Background(), items)
	if !errors.Is(err, fault.ErrInvalidInput) || !strings.Contains(err.Error(), `"bin"`) || !strings.Contains(err.Error(), "binary data") {
		t.Errorf("Run with binary data: %v, want invalid input naming item \"bin\"", err)
	}
}

// TestOpenRefuses checks that a directory that is not a whole model fails
// with the loader's error, and that a tokenizer larger than the model's
// vocabulary is refused at start.
func TestOpenRefuses(t *testing.T) {
	if _, err := Open(t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("Open(empty dir) = %v, want an error naming config.json", err)
	}
	// The committed tiny model has 512 ids and no tokenizer of its own.
	if _, err := Open("testdata/model/tiny-f32", nil); err == nil {
		t.Error("Open(a model without tokenizer files) succeeded")
	}
	m, err := Load("testdata/model/tiny-f32")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := wordpiece.Load("../wordpiece/testdata/tokenizer")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewEmbedder(m, tok, nil); err == nil || !strings.Contains(err.Error(), "vocab_size is 512") {
		t.Errorf("NewEmbedder(512-id model, 30522-id tokenizer) = %v, want a vocabulary error", err)
	}
}

// TestEmbedderTakesMemoryFromDevice checks that the weights are allocated
// on the device at Open and freed at Close, that a sub-batch's memory is
// held only while it runs, and that a batch too large for the device fails
// with ErrOutOfMemory having freed everything.
func TestEmbedderTakesMemoryFromDevice(t *testing.T) {
	dir := servedModelDir(t)
	sim := gpu.NewSim(1 << 30)
	e, err := Open(dir, sim)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := sim.MemInfo(); info.Used != e.Weights() || e.Weights() == 0 {
		t.Fatalf("after Open the device holds %d bytes, want the weights' %d", info.Used, e.Weights())
	}
	items := []job.Item{{ID: "a", Text: sentence(rand.New(rand.NewPCG(3, 3)), 300)}}
	if _, err := e.Run(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	if info, _ := sim.MemInfo(); info.Used != e.Weights() || e.Working() != 0 {
		t.Errorf("after Run the device holds %d bytes (working %d), want only the weights' %d", info.Used, e.Working(), e.Weights())
	}
	if peak := sim.Peak(); peak <= e.Weights() || peak-e.Weights() > e.Cost(items) {
		t.Errorf("Run's peak working memory %d is not in (0, Cost %d]", peak-e.Weights(), e.Cost(items))
	}
	e.Close()

	small := gpu.NewSim(e.Weights() + 1<<10)
	e, err = Open(dir, small)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Run(context.Background(), items); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("Run on a device with no room for the batch: %v, want ErrOutOfMemory", err)
	}
	if info, _ := small.MemInfo(); info.Used != e.Weights() {
		t.Errorf("after an OOM the device holds %d bytes, want only the weights' %d", info.Used, e.Weights())
	}
	e.Close()
	if info, _ := small.MemInfo(); info.Used != 0 {
		t.Errorf("after Close the device holds %d bytes", info.Used)
	}
	if _, err := e.Run(context.Background(), items); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v, want ErrClosed", err)
	}
	if _, err := Open(dir, gpu.NewSim(1<<10)); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("Open on a device too small for the weights: %v, want ErrOutOfMemory", err)
	}
}

// TestBucketLadder checks the ladder's promises: never below the length,
// never past the limit, padding under 1/16 of the length, exact up to 31.
func TestBucketLadder(t *testing.T) {
	for _, maxLen := range []int{2, 128, 512} {
		for n := 1; n <= maxLen; n++ {
			b := bucketOf(n, maxLen)
			if b < n || b > maxLen {
				t.Fatalf("bucketOf(%d, %d) = %d: below the length or past the limit", n, maxLen, b)
			}
			if n < 32 && b != n {
				t.Fatalf("bucketOf(%d, %d) = %d, want exact below 32", n, maxLen, b)
			}
			if 16*(b-n) >= n {
				t.Fatalf("bucketOf(%d, %d) = %d pads %d tokens, 1/16 of the length or more", n, maxLen, b, b-n)
			}
		}
	}
	distinct := map[int]bool{}
	for n := 1; n <= 512; n++ {
		distinct[bucketOf(n, 512)] = true
	}
	if len(distinct) > 31+16*4+1 {
		t.Errorf("%d buckets up to 512, want at most 96", len(distinct))
	}
}

// TestSeqBytesBoundsWorkingBytes checks the additive bound the cost rests
// on: a sub-batch of any size, padded to any length within a bucket, needs
// at most the size times the bucket's per-sequence bytes.
func TestSeqBytesBoundsWorkingBytes(t *testing.T) {
	for _, c := range []Config{servedShape.Config, miniLM, paddingConfig} {
		maxLen := min(c.MaxPositionEmbeddings, 512)
		for l := 1; l <= maxLen; l++ {
			per := c.seqBytes(bucketOf(l, maxLen))
			for _, n := range []int{1, 2, 3, 4, 7, 16, 33, 64, 256} {
				if need := c.WorkingBytes(n, l); need > int64(n)*per {
					t.Fatalf("hidden %d: WorkingBytes(%d, %d) = %d, over %d × seqBytes(%d) = %d",
						c.HiddenSize, n, l, need, n, bucketOf(l, maxLen), int64(n)*per)
				}
			}
		}
	}
}

// TestCostBoundsAllocation checks that Cost is never below what a launched
// batch really allocates (runtime.MemStats.TotalAlloc over its Run, the
// device phase; Launch's tokenizing is the host's), for batches of one
// length from 1 to max_seq_length tokens and of mixed lengths, of 1 to 48
// items; and that it is not far above it either.
func TestCostBoundsAllocation(t *testing.T) {
	backends(t, testCostBoundsAllocation)
}

func testCostBoundsAllocation(t *testing.T) {
	e, err := Open(servedModelDir(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Texts of every token length: [CLS] + n−2 pieces + [SEP], from a word
	// that is one piece.
	text := func(n int) string { return strings.TrimSpace(strings.Repeat("the ", max(n-2, 0))) }
	if got := len(e.tok.Encode(text(10), 0)); got != 10 {
		t.Fatalf("text(10) has %d tokens, want 10", got)
	}
	r := rand.New(rand.NewPCG(8, 8))
	type batch struct {
		name  string
		items []job.Item
	}
	var batches []batch
	for n := 1; n <= e.m.MaxSeqLength(); n += 1 + n/8 {
		size := []int{1, 3, 16, 48}[n%4]
		items := make([]job.Item, size)
		for i := range items {
			items[i] = job.Item{ID: fmt.Sprint(i), Text: text(n)}
		}
		batches = append(batches, batch{fmt.Sprintf("%d×%d tokens", size, max(n, 2)), items})
	}
	for k := range 6 {
		items := make([]job.Item, 1+r.IntN(40))
		for i := range items {
			items[i] = job.Item{ID: fmt.Sprint(i), Text: text(2 + r.IntN(e.m.MaxSeqLength()+20))}
		}
		batches = append(batches, batch{fmt.Sprintf("mixed %d: %d items", k, len(items)), items})
	}
	worst := 0.0
	for _, b := range batches {
		var most uint64
		for range 2 {
			l, err := e.Launch(context.Background(), b.items)
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			if _, err := l.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			most = max(most, after.TotalAlloc-before.TotalAlloc)
		}
		cost := e.Cost(b.items)
		worst = max(worst, float64(cost)/float64(most))
		if int64(most) > cost {
			t.Errorf("%s: Run allocated %d bytes, over Cost %d", b.name, most, cost)
		}
		// The slack the additive bound costs: each sequence carries the
		// fixed cost of every parallel call, which a batch pays once.
		fixed := int64(len(b.items)) * e.m.cfg.seqOverhead(1)
		if cost > 2*int64(most)+fixed+64<<10 {
			t.Errorf("%s: Cost %d is over twice the %d bytes allocated (and %d of fixed shares, and 64 KiB)", b.name, cost, most, fixed)
		}
	}
	t.Logf("%d batches; Cost at most %.2f× what Run allocated", len(batches), worst)
}

// TestCostAddsUp checks gpu.Model's contract on random splits: the cost of
// a batch is at most the sum of its parts', and grows with the length
// (quadratically, as attention does).
func TestCostAddsUp(t *testing.T) {
	e, err := Open(servedModelDir(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 9))
	for range 50 {
		items := make([]job.Item, 2+r.IntN(30))
		for i := range items {
			items[i] = job.Item{ID: fmt.Sprint(i), Text: sentence(r, r.IntN(100))}
		}
		cut := 1 + r.IntN(len(items)-1)
		if whole, parts := e.Cost(items), e.Cost(items[:cut])+e.Cost(items[cut:]); whole > parts {
			t.Fatalf("Cost of %d items %d, over the sum of its parts' %d", len(items), whole, parts)
		}
	}
	c := servedShape.Config
	d1, d2 := c.seqBytes(64)-c.seqBytes(32), c.seqBytes(96)-c.seqBytes(64)
	if d1 <= 0 || d2 <= d1 {
		t.Errorf("seqBytes grows by %d from 32 to 64 tokens and %d from 64 to 96: not growing faster with the length", d1, d2)
	}
	if e.Cost(nil) != 0 {
		t.Error("Cost of no items is not 0")
	}
}

// TestLengthClass checks the batcher's classes: messages whose longest
// texts are in one octave of tokens share a class, messages of short and
// long texts do not, and a message's class is its longest item's.
func TestLengthClass(t *testing.T) {
	e, err := Open(servedModelDir(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	text := func(n int) job.Item { return job.Item{ID: "x", Text: strings.TrimSpace(strings.Repeat("the ", n-2))} }
	short, short2, long := e.LengthClass([]job.Item{text(40)}), e.LengthClass([]job.Item{text(60), text(5)}), e.LengthClass([]job.Item{text(90)})
	if short != short2 {
		t.Errorf("messages of 40 and of 60 tokens at most: classes %d and %d, want one", short, short2)
	}
	if long == short {
		t.Errorf("messages of 60 and 90 tokens at most share class %d", long)
	}
	if mixed := e.LengthClass([]job.Item{text(5), text(90)}); mixed != long {
		t.Errorf("a message with a 90-token text has class %d, want the long class %d", mixed, long)
	}
}
