//go:build cuda

package gpu_test

// Tests of the CUDA BERT encoder: on the emulated GPU in make cuda-emu-test,
// and on a GPU from the test binary (make gpu-verify). The oracles are the
// CPU encoder of model/bert and, directly, ONNX Runtime's outputs committed
// with it (model/bert/golden).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"gorgonia.org/cu"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/model/bert"
)

// cudaBertTolerance bounds the absolute difference of any output component
// from the CPU encoder's and from ONNX Runtime's, the bound model/bert holds
// itself to against ONNX Runtime. Measured on the emulated GPU
// (TestCUDABertMatchesCPUAndONNX -v): see the FIGURE lines; the
// mutations of bert.cu it must catch (tanh for erf in GELU, the scores not
// scaled by 1/√d) move outputs by 1.9e-5 to 2.1 on the CPU (model/bert's
// goldenTolerance comment).
const cudaBertTolerance = 1e-5

const goldenRoot = "../model/bert/testdata/model"

type goldenFile struct {
	Oracle  string `json:"oracle"`
	Batches []struct {
		IDs     [][]int32              `json:"ids"`
		Outputs map[string][][]float32 `json:"outputs"`
	} `json:"batches"`
}

func readGolden(t *testing.T, dir string) goldenFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Batches) == 0 {
		t.Fatalf("%s: no batches", dir)
	}
	return g
}

func goldenDirs(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(goldenRoot, "*"))
	if err != nil || len(dirs) < 2 {
		t.Fatalf("%s: %v, %v", goldenRoot, dirs, err)
	}
	return dirs
}

var goldenModes = []struct {
	key       string
	pooling   bert.Pooling
	normalize bool
}{
	{"mean", bert.PoolMean, false}, {"cls", bert.PoolCLS, false}, {"max", bert.PoolMax, false},
	{"mean_norm", bert.PoolMean, true}, {"cls_norm", bert.PoolCLS, true}, {"max_norm", bert.PoolMax, true},
}

func maxAbsDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		e := math.Abs(float64(a[i]) - float64(b[i]))
		if !(e <= d) {
			d = e // NaN counts as the worst
		}
	}
	return d
}

func newCUDABert(t testing.TB, m *bert.Model) *gpu.CUDABert {
	t.Helper()
	cfg, w := m.GPU()
	c, err := gpu.NewCUDABert(0, m.Name(), w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Every pooling, with and without normalization, of both golden models
// (F32 and F16 weights): each batch as ONNX Runtime ran it and each item
// alone, against ONNX Runtime's output and the CPU encoder's.
func TestCUDABertMatchesCPUAndONNX(t *testing.T) {
	for _, dir := range goldenDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			g := readGolden(t, dir)
			base, err := bert.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			var worstONNX, worstCPU float64
			for _, mode := range goldenModes {
				s := base.Sentence()
				s.Pooling, s.Normalize = mode.pooling, mode.normalize
				m := base.WithSentence(s)
				c := newCUDABert(t, m)
				check := func(what string, ids [][]int32, want [][]float32) {
					got, err := c.Embed(context.Background(), ids)
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					cpu, err := m.Embed(ids)
					if err != nil {
						t.Fatal(err)
					}
					for i := range ids {
						do, dc := maxAbsDiff(got[i], want[i]), maxAbsDiff(got[i], cpu[i])
						worstONNX, worstCPU = max(worstONNX, do), max(worstCPU, dc)
						if !(do <= cudaBertTolerance) || !(dc <= cudaBertTolerance) {
							t.Errorf("%s, %s, item %d (%d tokens): differs from ONNX Runtime by %.3g, from the CPU by %.3g (tolerance %g)",
								mode.key, what, i, len(ids[i]), do, dc, cudaBertTolerance)
						}
					}
				}
				for bi, batch := range g.Batches {
					want := batch.Outputs[mode.key]
					if len(want) != len(batch.IDs) {
						t.Fatalf("batch %d: %d %s outputs for %d items", bi, len(want), mode.key, len(batch.IDs))
					}
					check(fmt.Sprintf("batch %d", bi), batch.IDs, want)
					for i := range batch.IDs {
						check(fmt.Sprintf("batch %d item %d alone", bi, i), batch.IDs[i:i+1], want[i:i+1])
					}
				}
				c.Close()
			}
			t.Logf("FIGURE cuda-bert %s (%s weights): largest |cuda - %s| %.3g, largest |cuda - cpu| %.3g (tolerance %g)",
				filepath.Base(dir), base.WeightDType(), g.Oracle, worstONNX, worstCPU, cudaBertTolerance)
		})
	}
}

// The erf GELU uses, on the device, against math.Erf: relative error over
// [-6, 6] (beyond, erf is ±1 in float32).
func TestCUDABertErf(t *testing.T) {
	base, err := bert.Load(filepath.Join(goldenRoot, "tiny-f32"))
	if err != nil {
		t.Fatal(err)
	}
	c := newCUDABert(t, base)
	xs := make([]float32, 120001)
	for i := range xs {
		xs[i] = float32(-6 + 12*float64(i)/float64(len(xs)-1))
	}
	xs = append(xs, 0, 1e-30, -1e-7, 1e-3, 0.99999994, 1, 1.0000001)
	got, err := c.Erf(xs)
	if err != nil {
		t.Fatal(err)
	}
	const tolerance = 4e-7 // about 3 float32 ulps
	var worst float64
	var at float32
	for i, x := range xs {
		want := math.Erf(float64(x))
		rel := math.Abs(float64(got[i]) - want)
		if want != 0 {
			rel /= math.Abs(want)
		}
		if !(rel <= worst) {
			worst, at = rel, x
		}
	}
	t.Logf("FIGURE cuda-bert erf: largest relative error against math.Erf %.3g (at x = %g) over %d points in [-6, 6]", worst, at, len(xs))
	if !(worst <= tolerance) {
		t.Errorf("erf: relative error %.3g at x = %g, over %g", worst, at, tolerance)
	}
}

// A bad item is ErrInvalidInput before anything runs.
func TestCUDABertInvalidInput(t *testing.T) {
	base, err := bert.Load(filepath.Join(goldenRoot, "tiny-f32"))
	if err != nil {
		t.Fatal(err)
	}
	c := newCUDABert(t, base)
	long := make([]int32, base.MaxSeqLength()+1)
	for name, ids := range map[string][][]int32{
		"empty": {{101, 102}, {}}, "too long": {long}, "id past the vocabulary": {{101, int32(base.Config().VocabSize), 102}}, "negative id": {{-1}},
	} {
		if _, err := c.Embed(context.Background(), ids); !errors.Is(err, gpu.ErrInvalidInput) {
			t.Errorf("%s: err %v, want ErrInvalidInput", name, err)
		}
	}
}

// devThread is a CUDA context of the test's own on a locked OS thread, as
// another tenant of the GPU: it takes memory and reads the device's free
// memory.
type devThread struct {
	ops  chan func()
	done chan struct{}
}

func newDevThread(t *testing.T) *devThread {
	t.Helper()
	d := &devThread{ops: make(chan func()), done: make(chan struct{})}
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer close(d.done)
		ctx, err := cu.Device(0).MakeContext(cu.SchedBlockingSync)
		started <- err
		if err != nil {
			return
		}
		for op := range d.ops {
			op()
		}
		_ = ctx.Destroy()
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(d.ops); <-d.done })
	return d
}

func (d *devThread) run(op func()) {
	done := make(chan struct{})
	d.ops <- func() { defer close(done); op() }
	<-done
}

func (d *devThread) free(t *testing.T) int64 {
	var free int64
	d.run(func() {
		var err error
		if free, _, err = cu.MemInfo(); err != nil {
			t.Error(err)
		}
	})
	return free
}

// hog allocates until about leave bytes are free, and returns the release.
func (d *devThread) hog(leave int64) (release func()) {
	var ptrs []cu.DevicePtr
	d.run(func() {
		free, _, err := cu.MemInfo()
		if err != nil {
			return
		}
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
	return func() {
		d.run(func() {
			for _, p := range ptrs {
				_ = cu.MemFree(p)
			}
		})
	}
}

// longBatch is n items of the model's full length, ids spread over the
// vocabulary.
func longBatch(m *bert.Model, n int) [][]int32 {
	ids := make([][]int32, n)
	for i := range ids {
		item := make([]int32, m.MaxSeqLength())
		for p := range item {
			item[p] = int32((i*131 + p*7 + 3) % m.Config().VocabSize)
		}
		ids[i] = item
	}
	return ids
}

// With memory taken so that a long batch cannot fit, Embed fails with
// ErrOutOfMemory holding nothing, the device's free memory is as before,
// and halving the batch until it fits gives the CPU encoder's outputs.
func TestCUDABertOutOfMemoryThenHalving(t *testing.T) {
	base, err := bert.Load(filepath.Join(goldenRoot, "tiny-f32"))
	if err != nil {
		t.Fatal(err)
	}
	c := newCUDABert(t, base)
	ids := longBatch(base, 64)
	need := c.WorkingBytes(len(ids), base.MaxSeqLength())
	other := newDevThread(t)
	release := other.hog(need / 2)
	defer release()
	free := other.free(t)
	if free >= need {
		t.Fatalf("could not take memory: %s free, the batch needs %s", gpu.FormatBytes(free), gpu.FormatBytes(need))
	}
	if _, err := c.Embed(context.Background(), ids); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("a batch of %s with %s free: err %v, want ErrOutOfMemory", gpu.FormatBytes(need), gpu.FormatBytes(free), err)
	}
	if n := c.Working(); n != 0 {
		t.Fatalf("after the OOM the model holds %d bytes", n)
	}
	if after := other.free(t); after != free {
		t.Fatalf("free memory %d before the failed batch, %d after", free, after)
	}
	var got [][]float32
	var split func(part [][]int32) int
	split = func(part [][]int32) int {
		out, err := c.Embed(context.Background(), part)
		if errors.Is(err, gpu.ErrOutOfMemory) && len(part) > 1 {
			h := len(part) / 2
			return max(split(part[:h]), split(part[h:]))
		}
		if err != nil {
			t.Fatalf("batch of %d: %v", len(part), err)
		}
		got = append(got, out...)
		return len(part)
	}
	size := split(ids)
	if size == len(ids) {
		t.Fatalf("the whole batch ran after failing")
	}
	want, err := base.Embed(ids)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if d := maxAbsDiff(got[i], want[i]); !(d <= cudaBertTolerance) {
			t.Fatalf("after halving, item %d differs from the CPU by %g", i, d)
		}
	}
	t.Logf("FIGURE cuda-bert oom: %d items × %d tokens (%s) with %s free: ErrOutOfMemory, then halving ran batches of %d, within %g of the CPU",
		len(ids), base.MaxSeqLength(), gpu.FormatBytes(need), gpu.FormatBytes(free), size, cudaBertTolerance)
}

// emulatedGranule is the emulated driver's allocation granule.
const emulatedGranule = 2 << 20

// The estimate covers what a batch takes from the device: the device-wide
// free memory drops by at least the estimate (the allocation is real) and,
// on the emulated GPU, by no more than the estimate rounded up to the
// emulator's granule (nothing else is allocated while a batch runs, cuBLAS
// included). The CPU encoder's estimate is logged beside it.
func TestCUDABertWorkingBytesCoversAllocation(t *testing.T) {
	base, err := bert.Load(filepath.Join(goldenRoot, "tiny-f32"))
	if err != nil {
		t.Fatal(err)
	}
	c := newCUDABert(t, base)
	emulated := strings.HasPrefix(c.Device(), "vramq CPU-emulated GPU")
	for _, shape := range []struct{ items, seqLen int }{{1, 2}, {3, 17}, {8, 128}, {33, 64}} {
		ids := longBatch(base, shape.items)
		for i := range ids {
			ids[i] = ids[i][:shape.seqLen]
		}
		ids[0] = ids[0][:1] // padding too
		est := c.WorkingBytes(shape.items, shape.seqLen)
		peak, err := c.Measure(context.Background(), ids)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("FIGURE cuda-bert memory: %d items × %d tokens: estimate %s, device measured %s, CPU encoder's estimate %s",
			shape.items, shape.seqLen, gpu.FormatBytes(est), gpu.FormatBytes(peak), gpu.FormatBytes(base.WorkingBytes(shape.items, shape.seqLen)))
		if peak < est {
			t.Errorf("%d×%d: the device lost %d bytes, below the estimate %d: the batch did not allocate what it says", shape.items, shape.seqLen, peak, est)
		}
		if rounded := (est + emulatedGranule - 1) / emulatedGranule * emulatedGranule; emulated && peak > rounded {
			t.Errorf("%d×%d: the device lost %d bytes, over the estimate %d rounded to the granule (%d)", shape.items, shape.seqLen, peak, est, rounded)
		}
	}
}
