//go:build cuda

package refembed

// Tests of the CUDA backend. They need a GPU: build them with
// `make gpu-test-bin` and run build/gpu-test/refembed.test on a machine with the
// NVIDIA driver and cuBLAS (bench/README.md, "On a GPU"). Figures go to the
// log as lines starting "FIGURE", for the record.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gorgonia.org/cu"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/gputest"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/testenv/floats"
	"github.com/vramq/vramq/job"
)

// cudaTolerance bounds how far a CUDA output component may be from the CPU
// reference's. Both are float32; the GEMMs sum in cuBLAS's order instead of
// the CPU's, and GELU's tanh is ex2.approx-based, which moves a component of
// a unit vector by a few 1e-7 typically. 1e-5 leaves room for the worst of a
// few hundred items and still catches any real mistake (a wrong transpose or
// bias moves components by 1e-2 or more).
const cudaTolerance = 1e-5

// testTexts makes n item texts of 1 to about 700 words (past MaxTokens, so
// truncation is covered), from a vocabulary large enough to touch many rows
// of the embedding table; plus an empty and a non-letter item.
func testTexts(n int) []job.Item {
	r := Rand{State: 42}
	items := make([]job.Item, n)
	for i := range items {
		words := 1 + int(r.Uint64()%700)
		if i%3 != 0 {
			words = 1 + int(r.Uint64()%40)
		}
		var b strings.Builder
		for w := range words {
			if w > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "w%d", r.Uint64()%50000)
		}
		items[i] = job.Item{ID: fmt.Sprint(i), Text: b.String()}
	}
	// The edge cases replace the first items, as many as there are: n may be 1.
	for i, text := range []string{"", "!!! ???"}[:min(n, 2)] {
		items[i].Text = text
	}
	return items
}

func newCUDATestModel(t testing.TB) (*CUDAEmbedder, *Weights, Config) {
	t.Helper()
	cfg := DefaultConfig()
	w := GenerateWeights(cfg)
	m, err := NewCUDAEmbedder(0, w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, w, cfg
}

// Check 1: the CUDA outputs equal the CPU reference's within cudaTolerance,
// for a few hundred inputs in batches of several sizes.
func TestCUDAMatchesCPU(t *testing.T) {
	m, w, cfg := newCUDATestModel(t)
	cpu, err := NewEmbedder(w, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	items := testTexts(400)
	want, err := cpu.Run(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	var worst float64
	var worstItem int
	for _, size := range []int{1, 7, 64, 400} {
		for lo := 0; lo < len(items); lo += size {
			hi := min(lo+size, len(items))
			got, err := m.Run(context.Background(), items[lo:hi])
			if err != nil {
				t.Fatalf("batch [%d,%d): %v", lo, hi, err)
			}
			for i, o := range got {
				if o.ID != items[lo+i].ID || len(o.Embedding) != cfg.Out {
					t.Fatalf("output %d: id %q, %d values; want id %q, %d", lo+i, o.ID, len(o.Embedding), items[lo+i].ID, cfg.Out)
				}
				var norm float64
				for j, v := range o.Embedding {
					d := math.Abs(float64(v) - float64(want[lo+i].Embedding[j]))
					if d > worst || math.IsNaN(d) {
						worst, worstItem = d, lo+i
					}
					norm += float64(v) * float64(v)
				}
				if math.Abs(norm-1) > 1e-5 {
					t.Errorf("item %d: |y|² = %v, want 1", lo+i, norm)
				}
			}
		}
	}
	t.Logf("FIGURE check1: %d items, batch sizes 1/7/64/400: largest |cuda - cpu| of a component %.3g (item %d), tolerance %g",
		len(items), worst, worstItem, cudaTolerance)
	if !(worst <= cudaTolerance) {
		t.Errorf("largest difference from the CPU reference %.3g (item %d) exceeds %g", worst, worstItem, cudaTolerance)
	}
}

// Check 2: a batch larger than the free memory fails with gpu.ErrOutOfMemory,
// nothing is left allocated, the model keeps working, and halving the batch
// until it fits computes the same outputs.
func TestCUDAOutOfMemoryThenHalving(t *testing.T) {
	m, w, cfg := newCUDATestModel(t)
	items := testTexts(256)
	for i := range items {
		items[i].Text = strings.Repeat("word ", 500) + items[i].Text // ~512 tokens each
	}
	cost := m.Cost(items)

	// Hold all but half the batch's memory, from this process's context on
	// another thread, as another tenant of the GPU would.
	hog := hogMemory(t, m, cost/2)
	_, err := m.Run(context.Background(), items)
	if !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("a batch of %s with %s free: err %v, want gpu.ErrOutOfMemory", bytesize.Format(cost), bytesize.Format(cost/2), err)
	}
	if n := m.Working(); n != 0 {
		t.Fatalf("after the OOM the model still holds %d bytes", n)
	}
	got, size, err := gputest.Halve(items, func(part []job.Item) ([]job.Output, error) {
		return m.Run(context.Background(), part)
	})
	if err != nil {
		t.Fatal(err)
	}
	hog()
	cpu, _ := NewEmbedder(w, cfg, nil)
	want, _ := cpu.Run(context.Background(), items)
	for i := range want {
		for j := range want[i].Embedding {
			if d := math.Abs(float64(got[i].Embedding[j] - want[i].Embedding[j])); !(d <= cudaTolerance) {
				t.Fatalf("after halving, item %d differs from the CPU by %g", i, d)
			}
		}
	}
	t.Logf("FIGURE check2: batch of %d items (%s estimated) with %s free: gpu.ErrOutOfMemory, then halving ran it in batches of %d; outputs within %g of the CPU", len(items), bytesize.Format(cost), bytesize.Format(cost/2), size, cudaTolerance)
}

// hogMemory allocates device memory until about leave bytes are free, and
// returns a func that frees it.
func hogMemory(t *testing.T, m *CUDAEmbedder, leave int64) (release func()) {
	t.Helper()
	var ptrs []cu.DevicePtr
	err := m.own.Do(func() {
		free, _, err := cu.MemInfo()
		if err != nil {
			t.Error(err)
			return
		}
		// In 256 MiB pieces, then smaller, since one huge allocation may
		// fail on fragmentation before the memory runs out.
		for piece := int64(256 << 20); piece >= 1<<20; piece /= 2 {
			for free-piece > leave {
				p, err := cu.MemAlloc(piece)
				if err != nil {
					break
				}
				ptrs = append(ptrs, p)
				free -= piece
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		_ = m.own.Do(func() {
			for _, p := range ptrs {
				_ = cu.MemFree(p)
			}
		})
	}
}

// devicePage is the granule in which the CUDA driver's free memory moves.
const devicePage = 2 << 20

// Measure reports at least what the batch allocates, and the driver's
// rounding on top: a calibration sample.
func TestCUDAMeasure(t *testing.T) {
	m, _, _ := newCUDATestModel(t)
	for _, n := range []int{1, 16, 256} {
		items := testTexts(n)
		peak, err := m.Measure(context.Background(), items)
		if err != nil {
			t.Fatal(err)
		}
		cost := m.Cost(items)
		t.Logf("FIGURE measure: %d items: estimated %s, driver measured %s", n, bytesize.Format(cost), bytesize.Format(peak))
		// The driver's free memory moves in whole pages (2 MiB): a batch that
		// fits in a page already mapped reads as 0, so one page is allowed.
		if peak+devicePage < cost-m.CostModel().PerBatch {
			t.Errorf("%d items: measured %d bytes, below the %d the batch allocates", n, peak, cost)
		}
	}
}

// Check 4: this backend's outputs against PyTorch running the same model
// with the same weights on the same GPU; then items/s of both, for three
// batch sizes, taking turns in one run, as figures only. Nothing asserts a
// ratio, so the name says outputs: this is a test model, one kernel per item,
// and runs 0.06 of PyTorch's items/s at batch 512 on an H200
// (bench/gpu/nvidia-h200.md), which no threshold worth stating would pass.
// It runs when VRAMQ_TORCH_PYTHON names a python with PyTorch (and
// bench/torch/embed.py is next to the test binary or in the checkout).
func TestCUDAOutputsAgainstTorch(t *testing.T) {
	python, script := torchReference(t)
	m, w, cfg := newCUDATestModel(t)
	dir := t.TempDir()
	weights := filepath.Join(dir, "model.safetensors")
	batch := filepath.Join(dir, "batch.safetensors")
	writeFile(t, weights, func(f *os.File) error { return WriteWeights(f, cfg, w) })
	sizes := []int{8, 64, 512}
	items := testTexts(sizes[len(sizes)-1])
	writeFile(t, batch, func(f *os.File) error { return WriteTokenBatch(f, cfg, items) })

	// The same outputs first: PyTorch's embeddings of all the items, against
	// this backend's.
	torchOut := filepath.Join(dir, "torch.safetensors")
	if out, err := exec.Command(python, script, "--weights", weights, "--batch", batch, "--device", "cuda", "--out", torchOut).CombinedOutput(); err != nil {
		t.Fatalf("%s --out: %v\n%s", script, err, out)
	}
	want, err := LoadEmbeddings(torchOut)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Run(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	var worst float64
	for i := range got {
		for j, v := range got[i].Embedding {
			worst = max(worst, math.Abs(float64(v)-float64(want[i][j])))
		}
	}
	t.Logf("FIGURE check4: %d items: largest |vramq CUDA - PyTorch| of a component %.3g", len(items), worst)
	if !(worst <= cudaTolerance) {
		t.Errorf("PyTorch's outputs differ from this backend's by up to %.3g, over %g: not the same model", worst, cudaTolerance)
	}

	const rounds = 3
	ours := map[int][]float64{}
	theirs := map[int][]float64{}
	for round := range rounds {
		for _, b := range sizes {
			ours[b] = append(ours[b], timeItemsPerSecond(t, m, items[:b]))
		}
		out, err := exec.Command(python, script, "--weights", weights, "--batch", batch, "--device", "cuda",
			"--bench", strings.Trim(strings.Join(strings.Fields(fmt.Sprint(sizes)), ","), "[]")).Output()
		if err != nil {
			t.Fatalf("round %d: %s: %v", round, script, err)
		}
		for b, ips := range parseTorchBench(t, out) {
			theirs[b] = append(theirs[b], ips)
		}
	}
	for _, b := range sizes {
		o, p := floats.Median(ours[b]), floats.Median(theirs[b])
		t.Logf("FIGURE check4: batch %d: vramq CUDA %.0f items/s, PyTorch %.0f items/s, ratio %.2f (median of %d rounds; vramq %v, torch %v)",
			b, o, p, o/p, rounds, ours[b], theirs[b])
	}
}

// timeItemsPerSecond runs items as one batch for about a second after a
// warm-up, and returns items per second.
func timeItemsPerSecond(t *testing.T, m *CUDAEmbedder, items []job.Item) float64 {
	for range 3 {
		if _, err := m.Run(context.Background(), items); err != nil {
			t.Fatal(err)
		}
	}
	start, n := time.Now(), 0
	for time.Since(start) < time.Second {
		if _, err := m.Run(context.Background(), items); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return float64(n*len(items)) / time.Since(start).Seconds()
}

func writeFile(t *testing.T, path string, write func(*os.File) error) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(write(f), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// parseTorchBench reads embed.py --bench's JSON lines: batch size to items/s.
func parseTorchBench(t *testing.T, out []byte) map[int]float64 {
	t.Helper()
	res := map[int]float64{}
	for line := range strings.Lines(string(out)) {
		var r struct {
			Batch     int     `json:"batch"`
			ItemsPerS float64 `json:"items_per_s"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("embed.py --bench: %q: %v", line, err)
		}
		res[r.Batch] = r.ItemsPerS
	}
	return res
}
