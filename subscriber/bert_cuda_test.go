//go:build cuda

package subscriber

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/bert"
)

// bertCUDADir generates a small BERT model directory with the real
// tokenizer (model/wordpiece/testdata/tokenizer, all-MiniLM-L6-v2's), so texts
// tokenize as they would for a served sentence encoder. The golden
// tiny-f32 directory cannot be served: its 512-id vocabulary is below the
// tokenizer's. Its CUDA outputs are checked against ONNX Runtime in gpu's
// TestCUDABertMatchesCPUAndONNX; here the whole path is checked against the
// CPU Embedder.
func bertCUDADir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "served-tiny")
	g := bert.Generated{
		Config: bert.Config{VocabSize: 30522, HiddenSize: 32, NumLayers: 2, NumHeads: 2,
			IntermediateSize: 64, MaxPositionEmbeddings: 128, TypeVocabSize: 2, LayerNormEps: 1e-12},
		MaxSeqLength: 96,
		Seed:         11,
	}
	if err := bert.Generate(dir, "../model/wordpiece/testdata/tokenizer", g); err != nil {
		t.Fatal(err)
	}
	return dir
}

// bertTexts are messages of one or two texts of 1 to 150 words, mostly
// short: several length classes, and texts cut at max_seq_length.
func bertTexts(n int) [][]string {
	words := strings.Fields("the quick brown fox jumps over a lazy dog while queue messages wait for memory on the device " +
		"déjà vu naïve 東京 unbelievably")
	var msgs [][]string
	for i := range n {
		var texts []string
		for k := range 1 + i%4/3 {
			l := []int{1, 2, 4, 1, 12, 3, 40, 150}[(i+k)%8]
			var b strings.Builder
			for j := range l {
				if j > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(words[(i*7+j*3+k)%len(words)])
			}
			texts = append(texts, b.String())
		}
		msgs = append(msgs, texts)
	}
	return msgs
}

// TestCUDABertServesModelDir serves a model directory through the
// subscriber on the GPU (bert.OpenCUDA, as `subscriber -device=cuda:0
// -model DIR` does) with the device's free memory held down by another
// process to a few granules: every result equals the CPU Embedder's within
// 1e-5, and no admitted batch runs out of device memory, though several run
// at once. Without the driver's granule in Cost, the admitted batches'
// rounded allocations overrun the free memory.
func TestCUDABertServesModelDir(t *testing.T) {
	dir := bertCUDADir(t)
	b, err := bert.OpenCUDA(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Device.Close()
	defer b.Embedder.Close()
	t.Logf("%s; %s", b.Encoder.Device(), b.CrossCheck)
	cpu, err := bert.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := bertTexts(48)
	var most int64
	for _, texts := range msgs {
		var items []job.Item
		for _, s := range texts {
			items = append(items, job.Item{Text: s})
		}
		most = max(most, b.Embedder.Cost(items))
	}
	// Another tenant leaves the subscriber the fewest granules that hold
	// the costliest message: most messages are short, so without a
	// granule each they would be admitted several batches at once, each
	// batch's allocation rounded up to a granule of its own. What the other
	// process's CUDA context takes is measured, not assumed: contexts differ
	// between drivers and devices.
	target := (most + bert.Granule - 1) / bert.Granule * bert.Granule
	_, stop := startHogLeaving(t, b.Device, target)
	defer stop()
	m, err := b.Device.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("costliest message %s; free after the hog: %s", bytesize.Format(most), bytesize.Format(m.Free))
	// Less than one granule more than the target, or two batches of the
	// costliest size could be admitted and the check would be weaker.
	if m.Free < target || m.Free >= target+bert.Granule {
		t.Fatalf("free memory %s after the hog, want %s up to one granule (%s) more",
			bytesize.Format(m.Free), bytesize.Format(target), bytesize.Format(bert.Granule))
	}

	h := startWith(t, 1, Config{BudgetRefresh: 200 * time.Millisecond, MaxBatch: 2}, func(h *harness, c *Config) {
		c.Backend, c.Device = backend.InProcess{Model: b.Embedder}, b.Device
	})
	defer h.shutdown()
	budget := h.sub.Budget()
	want := map[string][]job.Output{}
	for i, texts := range msgs {
		h.send("bert", i, texts...)
		var items []job.Item
		for k, s := range texts {
			items = append(items, job.Item{ID: fmt.Sprintf("i%d", k), Text: s})
		}
		outs, err := cpu.Run(context.Background(), items)
		if err != nil {
			t.Fatal(err)
		}
		want[fmt.Sprint(i)] = outs
	}
	wait.For(t, 5*time.Minute, "48 results", func() bool { r, _ := h.results.Stats(); return r == len(msgs) })
	got, dups := h.resultsByKey()
	if dups != 0 {
		t.Errorf("%d duplicate results", dups)
	}
	var worst float64
	for k, r := range got {
		w := want[fmt.Sprint(k.Chunk)]
		if r.Model != b.Embedder.Name() || len(r.Outputs) != len(w) {
			t.Fatalf("chunk %d: model %q, %d outputs; want %q, %d", k.Chunk, r.Model, len(r.Outputs), b.Embedder.Name(), len(w))
		}
		for i, o := range r.Outputs {
			if o.ID != w[i].ID || len(o.Embedding) != len(w[i].Embedding) {
				t.Fatalf("chunk %d output %d: id %q, %d values; want %q, %d", k.Chunk, i, o.ID, len(o.Embedding), w[i].ID, len(w[i].Embedding))
			}
			for j := range o.Embedding {
				worst = max(worst, math.Abs(float64(o.Embedding[j]-w[i].Embedding[j])))
			}
		}
	}
	t.Logf("FIGURE bert-cuda: %d messages, budget %s, peak admitted %s, worst difference from the CPU %.3g",
		len(got), bytesize.Format(budget), bytesize.Format(h.sub.PeakBytes()), worst)
	if !(worst <= 1e-5) {
		t.Errorf("results differ from the CPU Embedder's by up to %.3g, over 1e-5", worst)
	}
	if n := counter(h.sub.m.oomRetries); n != 0 {
		t.Errorf("%d batches ran out of device memory: Cost is below what the GPU allocates", n)
	}
	if d, _ := h.dlq.Stats(); d != 0 {
		t.Errorf("%d dead letters", d)
	}
}

// The budget follows another process's memory with a BERT model served on
// the GPU as it does with the reference model.
func TestCUDABertBudgetFollowsFreeMemory(t *testing.T) {
	b, err := bert.OpenCUDA(bertCUDADir(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Device.Close()
	defer b.Embedder.Close()
	t.Logf("%s; %s", b.Encoder.Device(), b.CrossCheck)
	checkBudgetFollowsFreeMemory(t, b.Device, b.Embedder)
}
