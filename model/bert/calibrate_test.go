package bert_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/calibrate"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/bert"
)

// tokenizerRoot is the MiniLM tokenizer's files: copied next to the test
// binary as bert-tokenizer by make gpu-verify, else in the checkout.
var tokenizerRoot = func() string {
	if fi, err := os.Stat("bert-tokenizer"); err == nil && fi.IsDir() {
		return "bert-tokenizer"
	}
	return "../wordpiece/testdata/tokenizer"
}()

// calibModelDir generates a small BERT with the MiniLM tokenizer (so that
// "a" is one token) into a directory named name.
func calibModelDir(t *testing.T, name string, heads, maxSeqLen int) string {
	t.Helper()
	return generateModelDir(t, name, bert.Config{VocabSize: 30522, HiddenSize: 32, NumLayers: 2, NumHeads: heads,
		IntermediateSize: 64, MaxPositionEmbeddings: 128, TypeVocabSize: 2, LayerNormEps: 1e-12}, maxSeqLen)
}

func generateModelDir(t *testing.T, name string, cfg bert.Config, maxSeqLen int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	g := bert.Generated{Config: cfg, MaxSeqLength: maxSeqLen, Seed: 5}
	if err := bert.Generate(dir, tokenizerRoot, g); err != nil {
		t.Fatal(err)
	}
	return dir
}

// textOf is a text of exactly tokens tokens, [CLS] and [SEP] included.
func textOf(tokens int) string { return strings.TrimSpace(strings.Repeat("a ", tokens-2)) }

// peakAlloc is an Allocator on a Sim that keeps the most held through it
// since the last reset: a whole Run's peak, sub-batches and all.
type peakAlloc struct {
	sim              *gpu.Sim
	mu               sync.Mutex
	held, peak, base int64
}

func (p *peakAlloc) Alloc(n int64) (func(), error) {
	free, err := p.sim.Alloc(n)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.held += n
	p.peak = max(p.peak, p.held)
	p.mu.Unlock()
	return func() {
		free()
		p.mu.Lock()
		p.held -= n
		p.mu.Unlock()
	}, nil
}

// reset returns the most held since the last reset beyond what was held
// then (the weights), and starts again.
func (p *peakAlloc) reset() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	peak := p.peak - p.base
	p.peak, p.base = p.held, p.held
	return peak
}

// On the simulated device a shape's measurement is what the sub-batch
// takes from the Allocator, the analytic WorkingBytes; a shape the model
// cannot run is invalid input.
func TestMeasureShapeOnSim(t *testing.T) {
	e, err := bert.Open(calibModelDir(t, "measure", 2, 96), gpu.NewSim(1<<30))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, sh := range []calibrate.Shape{{Items: 1, SeqLen: 1}, {Items: 3, SeqLen: 17}, {Items: 5, SeqLen: 96}} {
		peak, err := e.MeasureShape(t.Context(), sh.Items, sh.SeqLen)
		if err != nil {
			t.Fatal(err)
		}
		if want := e.Model().WorkingBytes(sh.Items, sh.SeqLen); peak != want {
			t.Errorf("%+v: measured %d, want WorkingBytes %d", sh, peak, want)
		}
	}
	for _, sh := range []calibrate.Shape{{Items: 0, SeqLen: 4}, {Items: 1, SeqLen: 0}, {Items: 1, SeqLen: 97}} {
		if _, err := e.MeasureShape(t.Context(), sh.Items, sh.SeqLen); !errors.Is(err, fault.ErrInvalidInput) {
			t.Errorf("%+v: %v, want ErrInvalidInput", sh, err)
		}
	}
	if e.AttentionHeads() != 2 || e.MaxSeqLength() != 96 {
		t.Errorf("heads %d, max sequence length %d", e.AttentionHeads(), e.MaxSeqLength())
	}
}

// Calibrated (here on the simulated device, whose measurements are the
// analytic bound), the Embedder's Cost of a message covers what Run really
// takes for it, uniform or mixed in length, the longest sequences included:
// each item at its bucket, the per-batch bytes once. Cost then follows the
// cost model, not the analytic bound.
func TestCalibratedCostCoversRun(t *testing.T) {
	sim := gpu.NewSim(1 << 30)
	mem := &peakAlloc{sim: sim}
	// Eight heads of width 4: the attention scores are most of a long
	// batch, so a cost without the length² term falls short.
	e, err := bert.Open(calibModelDir(t, "calibrated", 8, 128), mem)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c, err := calibrate.CalibrateShapes(t.Context(), e, "sim", calibrate.Sweep{MaxItems: 6, Points: 8, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(c)
	path := filepath.Join(t.TempDir(), "cost.json")
	if err := calibrate.SaveCostModel(path, c.File()); err != nil {
		t.Fatal(err)
	}
	short := []job.Item{{ID: "s", Text: "a"}}
	analytic := e.Cost(short)
	if _, err := calibrate.LoadCostModel(path, e, "sim"); err != nil {
		t.Fatal(err)
	}
	if e.CostModel() != c.Cost || e.CostModel().PerScore == 0 {
		t.Fatalf("the Embedder applies %+v, want the fit %+v with a length² term", e.CostModel(), c.Cost)
	}
	if got := e.Cost(short); got == analytic || got != c.Cost.Padded(1, 3, 8) {
		t.Errorf("Cost of a 3-token text: %d calibrated (analytic %d), want the fit's %d", got, analytic, c.Cost.Padded(1, 3, 8))
	}
	check := func(items []job.Item) {
		t.Helper()
		mem.reset()
		if _, err := e.Run(context.Background(), items); err != nil {
			t.Fatal(err)
		}
		if peak, est := mem.reset(), e.Cost(items); est < peak || peak == 0 {
			t.Errorf("%s: estimated %d, Run took %d", describe(items), est, peak)
		}
	}
	for n := 1; n <= 6; n++ {
		for _, l := range []int{2, 3, 9, 16, 17, 33, 48, 64, 65, 80, 95, 96, 100, 127, 128} {
			items := make([]job.Item, n)
			for i := range items {
				items[i] = job.Item{ID: fmt.Sprint(i), Text: textOf(l)}
			}
			check(items)
		}
	}
	check([]job.Item{{ID: "a", Text: textOf(128)}, {ID: "b", Text: textOf(2)}, {ID: "c", Text: textOf(40)}, {ID: "d", Text: textOf(127)},
		{ID: "e", Text: strings.Repeat("a ", 500)}})
	// Messages of one short text each, run as one batch, are covered with
	// the per-batch part charged once (gpu.BatchCoster), as the subscriber
	// charges them.
	if e.BatchBytes() != c.Cost.PerBatch {
		t.Errorf("BatchBytes %d, want the fit's PerBatch %d", e.BatchBytes(), c.Cost.PerBatch)
	}
	for n := 1; n <= 6; n++ {
		items := make([]job.Item, n)
		est := e.BatchBytes()
		for i := range items {
			items[i] = job.Item{ID: fmt.Sprint(i), Text: textOf(3)}
			est += e.Cost(items[i:i+1]) - e.BatchBytes()
		}
		mem.reset()
		if _, err := e.Run(context.Background(), items); err != nil {
			t.Fatal(err)
		}
		if peak := mem.reset(); est < peak {
			t.Errorf("%d messages of a 3-token text, the per-batch part once: estimated %d, Run took %d", n, est, peak)
		}
	}
	if _, err := calibrate.LoadCostModel(path, e, "NVIDIA H100 80GB HBM3"); err == nil || !strings.Contains(err.Error(), "fitted on device") {
		t.Errorf("a cost model fitted on sim loaded for a GPU: %v", err)
	}
	other, err := bert.Open(calibModelDir(t, "other", 4, 128), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := calibrate.LoadCostModel(path, other, "sim"); err == nil || !strings.Contains(err.Error(), "fitted for model") ||
		!strings.Contains(err.Error(), "fitted for 8 attention heads, not 4") {
		t.Errorf("a cost model of another model: %v", err)
	}
}

func describe(items []job.Item) string {
	lens := make([]string, len(items))
	for i, it := range items {
		lens[i] = fmt.Sprint(len(strings.Fields(it.Text)) + 2)
	}
	return fmt.Sprintf("%d items of %s tokens", len(items), strings.Join(lens, ", "))
}

var _ calibrate.ShapeMeter = (*bert.Embedder)(nil)
