//go:build cuda

package bert_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/calibrate"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/bert"
)

// Calibrated on the device (the emulated GPU in make cuda-emu-test, a real
// one in make gpu-verify), a BERT's estimate is never below what a batch
// really takes from the device, the driver's rounding and cuBLAS included:
// at every item count of the range and lengths from 1 to max_seq_length,
// the longest included, both for the fitted cost model of a shape and for
// the Embedder's Cost of a message of texts of that length. A cost model
// file fitted on another device is refused. On a GPU the model has
// all-MiniLM-L6-v2's shape, and the fit is written to
// $VRAMQ_COST_MODEL_OUT when set (make gpu-verify's run.sh keeps it).
func TestCUDABertCalibratedCostCoversEveryBatch(t *testing.T) {
	emulated := os.Getenv("VRAMQ_EMU_STATE") != ""
	// On the emulator, one layer of 32 heads of width 2: the attention
	// scores are most of a long batch, which spans several of the driver's
	// 2 MiB granules, so the fit sees the length² term through the
	// rounding; and the emulator, which runs every score's thread on the
	// CPU, takes seconds rather than minutes.
	cfg := bert.Config{VocabSize: 30522, HiddenSize: 64, NumLayers: 1, NumHeads: 32, IntermediateSize: 128,
		MaxPositionEmbeddings: 128, TypeVocabSize: 2, LayerNormEps: 1e-12}
	maxLen, sweep := 128, calibrate.Sweep{MaxItems: 4, Points: 6, Seed: 1}
	counts := []int{1, 2, 3, 4}
	lengths := []int{1, 2, 17, 64, 65, 100, 127, 128}
	if !emulated {
		cfg = bert.Config{VocabSize: 30522, HiddenSize: 384, NumLayers: 6, NumHeads: 12, IntermediateSize: 1536,
			MaxPositionEmbeddings: 512, TypeVocabSize: 2, LayerNormEps: 1e-12}
		maxLen, sweep = 512, calibrate.Sweep{MaxItems: 64, Points: 32, Seed: 1}
		counts = []int{1, 2, 3, 5, 8, 13, 21, 34, 55, 63, 64}
		lengths = []int{1, 2, 3, 17, 64, 65, 128, 129, 200, 255, 256, 257, 384, 450, 511, 512}
	}
	on, err := bert.OpenCUDA(generateModelDir(t, "calib-cuda", cfg, maxLen), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer on.Device.Close()
	defer on.Embedder.Close()
	e, device := on.Embedder, gpu.Kind(on.Device)
	ctx := context.Background()
	c, err := calibrate.CalibrateShapes(ctx, e, device, sweep)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(c.String(), "\n") {
		t.Logf("FIGURE cuda-bert calibration: %s", line)
	}
	path := filepath.Join(t.TempDir(), "cost.json")
	if out := os.Getenv("VRAMQ_COST_MODEL_OUT"); out != "" {
		path = out
	}
	if err := calibrate.SaveCostModel(path, c.File()); err != nil {
		t.Fatal(err)
	}
	short, long := []job.Item{{ID: "s", Text: "a"}}, []job.Item{{ID: "l", Text: textOf(maxLen)}}
	analyticShort, analyticLong := e.Cost(short), e.Cost(long)
	if _, err := calibrate.LoadCostModel(path, e, "another GPU"); err == nil || !strings.Contains(err.Error(), "fitted on device") {
		t.Errorf("a cost model fitted on %s loaded for another GPU: %v", device, err)
	}
	if _, err := calibrate.LoadCostModel(path, e, device); err != nil {
		t.Fatal(err)
	}
	if e.CostModel() != c.Cost || c.Cost.PerScore == 0 {
		t.Fatalf("the Embedder applies %+v, want the fit %+v, with a length² term", e.CostModel(), c.Cost)
	}
	t.Logf("FIGURE cuda-bert calibrated cost: a 3-token text %s (analytic %s), a %d-token text %s (analytic %s)",
		bytesize.Format(e.Cost(short)), bytesize.Format(analyticShort), maxLen, bytesize.Format(e.Cost(long)), bytesize.Format(analyticLong))
	// Issue 37's figure: the largest batch of 3-token texts a fixed budget
	// admits, each its own message (charged the per-batch bytes each), with
	// the margin measured and with the bound from monotonicity that was the
	// margin before.
	const budget = 8 << 30
	now := e.Cost(short)
	before := now + c.MonotoneBound - c.Margin
	t.Logf("FIGURE cuda-bert calibrated cost: margin %s measured (bound from monotonicity %s): a 3-token text %s (before %s); "+
		"3-token messages in an 8 GiB budget: %d (before %d)", bytesize.Format(c.Margin), bytesize.Format(c.MonotoneBound),
		bytesize.Format(now), bytesize.Format(before), budget/now, budget/before)

	var closest int64 = -1
	for _, n := range counts {
		for _, l := range lengths {
			ids := make([][]int32, n)
			var items []job.Item
			for i := range ids {
				ids[i] = make([]int32, l)
				for k := range ids[i] {
					ids[i][k] = int32(1000 + (i*31+k*7)%20000)
				}
				if l >= 2 {
					items = append(items, job.Item{ID: fmt.Sprint(i), Text: textOf(l)})
				}
			}
			// The texts' own ids, so that Run's one sub-batch is this batch.
			for i, it := range items {
				if ids[i], err = e.Tokens(it); err != nil || len(ids[i]) != l {
					t.Fatalf("%d tokens of %q: %d, %v", l, it.Text, len(ids[i]), err)
				}
			}
			peak, err := on.Encoder.Measure(ctx, ids)
			if err != nil {
				t.Fatalf("%d items × %d tokens: %v", n, l, err)
			}
			if est := c.Cost.Padded(int64(n), int64(l), int64(cfg.NumHeads)); est < peak {
				t.Errorf("%d items × %d tokens: the fit estimates %d, the device lost %d", n, l, est, peak)
			}
			if items != nil {
				est := e.Cost(items)
				if est < peak {
					t.Errorf("%d texts of %d tokens: Cost %d, the device lost %d", n, l, est, peak)
				}
				if closest < 0 || est-peak < closest {
					closest = est - peak
				}
			}
		}
	}
	t.Logf("FIGURE cuda-bert calibrated cost: %d item counts × %d lengths up to %d, none under-estimated; the closest Cost was over by %s",
		len(counts), len(lengths), maxLen, bytesize.Format(closest))
}

// An encoder served in half precision is another model to a cost model:
// its name says its precision (and fused attention), so a cost model
// fitted for the float32 encoder of the same directory is refused, and one
// fitted for it is taken.
func TestCUDABertHalfPrecisionRefusesFloat32CostModel(t *testing.T) {
	cfg := bert.Config{VocabSize: 30522, HiddenSize: 64, NumLayers: 1, NumHeads: 4, IntermediateSize: 128,
		MaxPositionEmbeddings: 64, TypeVocabSize: 2, LayerNormEps: 1e-12}
	dir := generateModelDir(t, "variant", cfg, 64)
	on, err := bert.OpenCUDAWith(dir, 0, bert.CUDAOptions{Precision: bert.GPUFloat16, Attention: bert.GPUAttentionFused})
	if err != nil {
		t.Fatal(err)
	}
	defer on.Device.Close()
	defer on.Embedder.Close()
	if got, want := on.Embedder.Name(), "bert:variant@float16+fused-attention"; got != want {
		t.Errorf("name %q, want %q", got, want)
	}
	device := gpu.Kind(on.Device)
	for _, c := range []struct {
		model string
		ok    bool
	}{{"bert:variant", false}, {"bert:variant@float16+fused-attention", true}} {
		path := filepath.Join(t.TempDir(), "cost.json")
		f := calibrate.CostModelFile{Model: c.model, Device: device, Form: calibrate.FormPadded, Heads: cfg.NumHeads,
			CostModel: gpu.CostModel{PerToken: 1, PerScore: 1, PerBatch: 1}}
		if err := calibrate.SaveCostModel(path, f); err != nil {
			t.Fatal(err)
		}
		_, err := calibrate.LoadCostModel(path, on.Embedder, device)
		if c.ok != (err == nil) {
			t.Errorf("a cost model fitted for %q: %v; want it taken: %v", c.model, err, c.ok)
		}
	}
}
