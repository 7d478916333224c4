//go:build cuda

package refembed

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/cuda"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/job"
)

// The kernels of the model, compiled from kernels/embed.cu by `make ptx` and
// committed, so a build needs no CUDA compiler. The driver JIT-compiles the
// PTX for whatever GPU it finds (it targets sm_80 and later).
//
//go:embed kernels/embed.ptx
var embedPTX string

// CUDAEmbedder is the reference model (Embedder) on an NVIDIA GPU, through
// the CUDA driver API (gorgonia.org/cu) and cuBLAS. The weights are uploaded
// once. Each batch tokenizes on the host, allocates its working memory on the
// device as one allocation of exactly the buffers the cost model counts (so
// an estimate that is too small fails as an out-of-memory, which the
// subscriber recovers from by halving), gathers and mean-pools the token
// embeddings, runs the two dense layers as cuBLAS GEMMs with a bias+GELU and a
// bias+L2-norm kernel, copies the outputs back and frees its memory.
//
// CUDA binds a context to an OS thread, so one goroutine locked to its thread
// owns the context and makes every CUDA call; Run hands it batches. Batches
// therefore run one at a time, each on the default stream: the GPU does one
// batch's kernels while other batches are tokenized and queued. A
// CUDAEmbedder is safe for concurrent use.
type CUDAEmbedder struct {
	cfg     Config
	cost    gpu.CostModel
	name    string
	index   int
	weights int64
	// resident is the whole footprint of the loaded model as NVML saw it
	// (set by Open); 0 when unknown.
	resident int64

	closed  atomic.Bool
	working atomic.Int64
	// calibrated is the cost model SetCostModel gave; nil until then.
	calibrated atomic.Pointer[gpu.CostModel]
	// lost is the error that broke the context (wrapping gpu.ErrDeviceLost);
	// nil while it works.
	lost atomic.Pointer[error]

	// Owned by the context's goroutine.
	w   struct{ emb, w1, b1, w2, b2 cu.DevicePtr }
	fns struct{ gather, pool, gelu, norm cu.Function }
	own *cuda.Owner
}

// A CUDAEmbedder is also a calibrate.Meter (asserted in that package's
// tests, which import this one).
var _ gpu.CostModelSetter = (*CUDAEmbedder)(nil)

// NewCUDAEmbedder creates a CUDA context on GPU index (CUDA's numbering),
// loads the kernels and cuBLAS, and uploads w, shaped by cfg. It fails with
// an error wrapping gpu.ErrOutOfMemory when the weights do not fit.
func NewCUDAEmbedder(index int, w *Weights, cfg Config) (*CUDAEmbedder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if w == nil {
		return nil, errors.New("cuda embed: nil weights")
	}
	if err := w.CheckShape(cfg); err != nil {
		return nil, err
	}
	if err := cuda.CheckDevice(index); err != nil {
		return nil, err
	}
	e := &CUDAEmbedder{
		cfg:     cfg,
		cost:    cfg.CostModel(),
		name:    fmt.Sprintf("ref-embed-v1-v%d-d%d-h%d-o%d-t%d", cfg.Vocab, cfg.Dim, cfg.Hidden, cfg.Out, cfg.MaxTokens),
		index:   index,
		weights: w.Bytes(),
	}
	// The per-batch remainder the analytic model does not count: the
	// offsets array has one more entry than items, and each of the six
	// buffers may be padded to cuda.BufAlign. The driver's own rounding of the
	// allocation is measured by calibration (subscriber --calibrate).
	e.cost.PerBatch = 4 + 6*cuda.BufAlign
	e.own = cuda.NewOwner(e.name)
	if err := e.own.Start(func() error { return e.setup(w) }, e.teardown); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *CUDAEmbedder) setup(w *Weights) error {
	if err := e.own.Open(e.index, embedPTX, map[string]*cu.Function{
		"gather": &e.fns.gather, "mean_pool": &e.fns.pool, "bias_gelu": &e.fns.gelu, "bias_l2norm": &e.fns.norm,
	}); err != nil {
		return err
	}
	var err error
	for _, t := range []struct {
		dst *cu.DevicePtr
		src []float32
	}{{&e.w.emb, w.Embedding}, {&e.w.w1, w.W1}, {&e.w.b1, w.B1}, {&e.w.w2, w.W2}, {&e.w.b2, w.B2}} {
		if *t.dst, err = cuda.Upload(t.src); err != nil {
			return fmt.Errorf("%s: load weights: %w", e.name, err)
		}
	}
	// One batch now, so cuBLAS makes its workspace and the driver loads
	// the kernels before the budget is read: both are fixed costs of the
	// loaded model, like the weights, not of any batch.
	if _, _, err := e.forward([]job.Item{{Text: "warm up"}}, false); err != nil {
		return fmt.Errorf("%s: first batch: %w", e.name, err)
	}
	return nil
}

func (e *CUDAEmbedder) teardown() {
	for _, p := range []cu.DevicePtr{e.w.emb, e.w.w1, e.w.b1, e.w.w2, e.w.b2} {
		if p != 0 {
			_ = cu.MemFree(p)
		}
	}
	e.own.Release()
}

// Name says the model and its shape, as Embedder's does: the two backends
// compute the same function, and a calibrated cost model names it.
func (e *CUDAEmbedder) Name() string { return e.name }

// Product is the GPU's product name, e.g. "NVIDIA H100 80GB HBM3".
func (e *CUDAEmbedder) Product() string { return e.own.Product }

// gpu.Device names the GPU, e.g. "NVIDIA H100 80GB HBM3 (cuda:0)".
func (e *CUDAEmbedder) Device() string { return e.own.DeviceName }

// Config is the configuration the model was made with.
func (e *CUDAEmbedder) Config() Config { return e.cfg }

// MaxTokens is the most tokens the model reads from an item
// (calibrate.Meter).
func (e *CUDAEmbedder) MaxTokens() int { return e.cfg.MaxTokens }

// CountTokens is how many tokens the model reads from text, as Cost counts
// them (calibrate.Meter).
func (e *CUDAEmbedder) CountTokens(text string) int { return e.cfg.CountTokens(text) }

// Weights is the device memory the loaded model holds: the weights, and
// when Open could measure it with NVML, the CUDA context and cuBLAS's
// workspace too, which no batch can use either.
func (e *CUDAEmbedder) Weights() int64 { return max(e.resident, e.weights) }

// CostModel is the calibrated model SetCostModel gave, or else the
// allocation's own: the analytic model plus the per-batch padding.
func (e *CUDAEmbedder) CostModel() gpu.CostModel {
	if m := e.calibrated.Load(); m != nil {
		return *m
	}
	return e.cost
}

// SetCostModel makes Cost apply m, a model calibrated on this GPU (subscriber
// --calibrate), which counts the driver's rounding too.
func (e *CUDAEmbedder) SetCostModel(m gpu.CostModel) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("%s: %w", e.name, err)
	}
	e.calibrated.Store(&m)
	return nil
}

// Cost is the device memory Run needs for items as one batch: what the
// calibrated model says, but never less than the allocation Run makes. A
// fitted line can dip below the allocation outside the batches it was
// fitted on; admission must not.
func (e *CUDAEmbedder) Cost(items []job.Item) int64 {
	var tokens int64
	for _, it := range items {
		tokens += int64(e.cfg.CountTokens(it.Text))
	}
	n := int64(len(items))
	own := e.cost.Bytes(tokens, n)
	if m := e.calibrated.Load(); m != nil {
		return max(own, m.Bytes(tokens, n))
	}
	return own
}

// Working is the device memory batches hold now, the driver's rounding
// aside.
func (e *CUDAEmbedder) Working() int64 { return e.working.Load() }

// MemGetInfo is the CUDA driver's view of the device's memory, the cross-check
// of NVML's.
func (e *CUDAEmbedder) MemGetInfo() (free, total int64, err error) {
	if e.closed.Load() {
		return 0, 0, fmt.Errorf("%s: %w", e.name, gpu.ErrClosed)
	}
	if lost := e.lost.Load(); lost != nil {
		return 0, 0, *lost
	}
	if derr := e.own.Do(func() {
		if free, total, err = cu.MemInfo(); err != nil {
			err = e.classify(err)
		}
	}); derr != nil {
		return 0, 0, derr
	}
	return free, total, err
}

// Run embeds items as one batch on the GPU. Out of device memory, from the
// allocation or from cuBLAS, returns an error wrapping gpu.ErrOutOfMemory with
// nothing left allocated. Once the batch is handed to the GPU, Run waits for
// it even if ctx ends, so that its memory is free when Run returns.
func (e *CUDAEmbedder) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	outs, _, err := e.run(ctx, items, false)
	return outs, err
}

// Measure runs items as one batch and returns the most device memory it held
// at once, as the driver counts free memory: the allocation with the
// driver's rounding, and anything cuBLAS took for it.
func (e *CUDAEmbedder) Measure(ctx context.Context, items []job.Item) (int64, error) {
	_, peak, err := e.run(ctx, items, true)
	return peak, err
}

func (e *CUDAEmbedder) run(ctx context.Context, items []job.Item, measure bool) (outs []job.Output, peak int64, err error) {
	if e.closed.Load() {
		return nil, 0, fmt.Errorf("%s: %w", e.name, gpu.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if lost := e.lost.Load(); lost != nil {
		return nil, 0, *lost
	}
	if len(items) == 0 {
		return []job.Output{}, 0, nil
	}
	if derr := e.own.Do(func() {
		// The context may have ended while the batch waited its turn.
		if err = ctx.Err(); err == nil {
			if outs, peak, err = e.forward(items, measure); err != nil {
				err = e.classify(err)
			}
		}
	}); derr != nil {
		return nil, 0, derr
	}
	return outs, peak, err
}

// forward is one batch, on the context's goroutine.
func (e *CUDAEmbedder) forward(items []job.Item, measure bool) ([]job.Output, int64, error) {
	tokens, offsets := e.cfg.Tokenize(items)
	n, total := len(items), len(tokens)
	dim, hidden, out := e.cfg.Dim, e.cfg.Hidden, e.cfg.Out

	// One allocation, carved into the buffers the cost model counts.
	var layout [6]int64
	var size int64
	for i, b := range []int64{
		4 * int64(total), 4 * int64(n+1), 4 * int64(total*dim), 4 * int64(n*dim), 4 * int64(n*hidden), 4 * int64(n*out),
	} {
		layout[i] = size
		size += (b + cuda.BufAlign - 1) / cuda.BufAlign * cuda.BufAlign
	}
	var before int64
	if measure {
		before, _, _ = cu.MemInfo()
	}
	base, err := cu.MemAlloc(size)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: batch of %d items, %d tokens, %s: %w", e.name, n, total, bytesize.Format(size), cuda.MapError(err))
	}
	// Counted from after the allocation until before the free, so that
	// Working never exceeds what is allocated: the subscriber adds it to
	// the free memory to size the budget, which must not come out high.
	e.working.Add(size)
	defer func() {
		e.working.Add(-size)
		_ = cu.MemFree(base)
	}()
	buf := func(i int) cu.DevicePtr { return base + cu.DevicePtr(layout[i]) }
	dTokens, dOffsets, dRows, dPooled, dHidden, dOut := buf(0), buf(1), buf(2), buf(3), buf(4), buf(5)

	if err := cu.MemcpyHtoD(dTokens, unsafe.Pointer(&tokens[0]), 4*int64(total)); err != nil {
		return nil, 0, err
	}
	if err := cu.MemcpyHtoD(dOffsets, unsafe.Pointer(&offsets[0]), 4*int64(n+1)); err != nil {
		return nil, 0, err
	}
	var (
		nTok, nItems     = int64(total), int64(n)
		dimL, hidL, outL = int64(dim), int64(hidden), int64(out)
	)
	if err := cuda.Launch(e.fns.gather, cuda.Grid(int64(total*dim)), 256, &dTokens, &e.w.emb, &dRows, &nTok, &dimL); err != nil {
		return nil, 0, err
	}
	if err := cuda.Launch(e.fns.pool, min(n, 65535), min(cuda.Pow2(dim), 256), &dRows, &dOffsets, &dPooled, &nItems, &dimL); err != nil {
		return nil, 0, err
	}
	if err := e.own.Blas.Gemm(dHidden, dPooled, e.w.w1, n, dim, hidden); err != nil {
		return nil, 0, err
	}
	if err := cuda.Launch(e.fns.gelu, cuda.Grid(int64(n*hidden)), 256, &dHidden, &e.w.b1, &nItems, &hidL); err != nil {
		return nil, 0, err
	}
	if err := e.own.Blas.Gemm(dOut, dHidden, e.w.w2, n, hidden, out); err != nil {
		return nil, 0, err
	}
	if err := cuda.Launch(e.fns.norm, min(n, 65535), min(cuda.Pow2(out), 1024), &dOut, &e.w.b2, &nItems, &outL); err != nil {
		return nil, 0, err
	}
	var peak int64
	if measure {
		// Read before the copy back synchronizes: cuBLAS has whatever it
		// took for these GEMMs until they finish.
		after, _, _ := cu.MemInfo()
		peak = before - after
	}
	res := make([]float32, n*out)
	// A synchronous copy on the default stream: it waits for the kernels,
	// and reports any error they hit.
	if err := cu.MemcpyDtoH(unsafe.Pointer(&res[0]), dOut, 4*int64(n*out)); err != nil {
		return nil, 0, fmt.Errorf("%s: batch of %d items: %w", e.name, n, cuda.MapError(err))
	}
	outputs := make([]job.Output, n)
	for i, it := range items {
		outputs[i] = job.Output{ID: it.ID, Embedding: res[i*out : (i+1)*out : (i+1)*out]}
	}
	return outputs, peak, nil
}

// classify turns err, from a call on the context's goroutine, into
// gpu.ErrDeviceLost when the context is broken, and remembers it: later calls
// fail at once. Whichever call reports a sticky error (a kernel's fault shows
// at the next synchronizing call, a cuBLAS call reports only its own status),
// the context itself answers with it, so it is asked.
func (e *CUDAEmbedder) classify(err error) error {
	return cuda.Classify(err, e.name+" on "+e.own.DeviceName, &e.lost)
}

// Close frees the weights, cuBLAS's handle and the context. Run fails with
// gpu.ErrClosed afterwards; a batch already running finishes first. Later calls
// do nothing.
func (e *CUDAEmbedder) Close() error {
	e.closed.Store(true)
	e.own.Stop()
	return nil
}

// CUDABackend is a GPU with the reference model loaded on it.
type CUDABackend struct {
	// Device reports the GPU's memory: NVML's view of the same GPU when
	// NVML answers (it also knows this process's share), else the CUDA
	// driver's.
	Device gpu.Device
	Model  *CUDAEmbedder
	// CrossCheck compares NVML's free memory with the driver's, read one
	// after the other at open; empty when NVML did not answer.
	CrossCheck string
}

// OpenCUDA loads the model shaped by cfg with weights w onto CUDA device
// index and opens that GPU's memory reports. NVML and CUDA may number GPUs
// differently, so the NVML device is found by the UUID CUDA gives.
func OpenCUDA(index int, w *Weights, cfg Config) (*CUDABackend, error) {
	var model *CUDAEmbedder
	dev, footprint, check, err := cuda.OpenDevice(index, func() (cuda.Model, error) {
		var err error
		model, err = NewCUDAEmbedder(index, w, cfg)
		return model, err
	})
	if err != nil {
		return nil, err
	}
	// Another process allocating meanwhile would inflate the footprint;
	// the weights are the floor.
	model.resident = max(footprint, model.weights)
	return &CUDABackend{Device: dev, Model: model, CrossCheck: check}, nil
}

// Close unloads the model and closes the device.
func (b *CUDABackend) Close() error {
	return errors.Join(b.Model.Close(), b.Device.Close())
}
