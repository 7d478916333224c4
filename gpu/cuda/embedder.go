//go:build cuda

package cuda

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/calibrate"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/refembed"
)

// The kernels of the model, compiled from kernels/embed.cu by `make ptx` and
// committed, so a build needs no CUDA compiler. The driver JIT-compiles the
// PTX for whatever GPU it finds (it targets sm_80 and later).
//
//go:embed kernels/embed.ptx
var embedPTX string

// bufAlign is the alignment of each buffer inside a batch's one allocation:
// cuMemAlloc's own, so every buffer is as aligned as if allocated alone.
const bufAlign = 256

// Embedder is the reference model (refembed.Embedder) on an NVIDIA GPU, through
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
// Embedder is safe for concurrent use.
type Embedder struct {
	cfg     refembed.Config
	cost    gpu.CostModel
	name    string
	index   int
	weights int64
	// resident is the whole footprint of the loaded model as NVML saw it
	// (set by Open); 0 when unknown.
	resident int64

	closing sync.Once
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
	cudaOwner
}

var (
	_ calibrate.Meter     = (*Embedder)(nil)
	_ gpu.CostModelSetter = (*Embedder)(nil)
)

// NewEmbedder creates a CUDA context on GPU index (CUDA's numbering),
// loads the kernels and cuBLAS, and uploads w, shaped by cfg. It fails with
// an error wrapping gpu.ErrOutOfMemory when the weights do not fit.
func NewEmbedder(index int, w *refembed.Weights, cfg refembed.Config) (*Embedder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if w == nil {
		return nil, errors.New("cuda embed: nil weights")
	}
	if err := w.CheckShape(cfg); err != nil {
		return nil, err
	}
	if err := cudaDriverError(); err != nil {
		return nil, err
	}
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("%w: cuda: counting devices: %v", gpu.ErrNoDevice, err)
	}
	if index < 0 || index >= n {
		return nil, fmt.Errorf("%w: cuda: no device %d (%d found)", gpu.ErrNoDevice, index, n)
	}
	e := &Embedder{
		cfg:     cfg,
		cost:    cfg.CostModel(),
		name:    fmt.Sprintf("ref-embed-v1-v%d-d%d-h%d-o%d-t%d", cfg.Vocab, cfg.Dim, cfg.Hidden, cfg.Out, cfg.MaxTokens),
		index:   index,
		weights: w.Bytes(),
	}
	// The per-batch remainder the analytic model does not count: the
	// offsets array has one more entry than items, and each of the six
	// buffers may be padded to bufAlign. The driver's own rounding of the
	// allocation is measured by calibration (subscriber --calibrate).
	e.cost.PerBatch = 4 + 6*bufAlign
	e.cudaOwner = newCUDAOwner(e.name)
	if err := e.start(func() error { return e.setup(w) }, e.teardown); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Embedder) setup(w *refembed.Weights) error {
	if err := e.open(e.index, embedPTX, map[string]*cu.Function{
		"gather": &e.fns.gather, "mean_pool": &e.fns.pool, "bias_gelu": &e.fns.gelu, "bias_l2norm": &e.fns.norm,
	}); err != nil {
		return err
	}
	var err error
	for _, t := range []struct {
		dst *cu.DevicePtr
		src []float32
	}{{&e.w.emb, w.Embedding}, {&e.w.w1, w.W1}, {&e.w.b1, w.B1}, {&e.w.w2, w.W2}, {&e.w.b2, w.B2}} {
		if *t.dst, err = upload(t.src); err != nil {
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

func (e *Embedder) teardown() {
	for _, p := range []cu.DevicePtr{e.w.emb, e.w.w1, e.w.b1, e.w.w2, e.w.b2} {
		if p != 0 {
			_ = cu.MemFree(p)
		}
	}
	e.close()
}

// upload copies src to a new device buffer.
func upload[T int32 | float32](src []T) (cu.DevicePtr, error) {
	n := int64(len(src)) * int64(unsafe.Sizeof(src[0]))
	p, err := cu.MemAlloc(n)
	if err != nil {
		return 0, cudaErr(err)
	}
	if err := cu.MemcpyHtoD(p, unsafe.Pointer(&src[0]), n); err != nil {
		_ = cu.MemFree(p)
		return 0, err
	}
	return p, nil
}

// Name says the model and its shape, as refembed.Embedder's does: the two backends
// compute the same function, and a calibrated cost model names it.
func (e *Embedder) Name() string { return e.name }

// Product is the GPU's product name, e.g. "NVIDIA H100 80GB HBM3".
func (e *Embedder) Product() string { return e.product }

// gpu.Device names the GPU, e.g. "NVIDIA H100 80GB HBM3 (cuda:0)".
func (e *Embedder) Device() string { return e.devName }

// Config is the configuration the model was made with.
func (e *Embedder) Config() refembed.Config { return e.cfg }

// MaxTokens is the most tokens the model reads from an item
// (calibrate.Meter).
func (e *Embedder) MaxTokens() int { return e.cfg.MaxTokens }

// CountTokens is how many tokens the model reads from text, as Cost counts
// them (calibrate.Meter).
func (e *Embedder) CountTokens(text string) int { return e.cfg.CountTokens(text) }

// Weights is the device memory the loaded model holds: the weights, and
// when Open could measure it with NVML, the CUDA context and cuBLAS's
// workspace too, which no batch can use either.
func (e *Embedder) Weights() int64 { return max(e.resident, e.weights) }

// CostModel is the calibrated model SetCostModel gave, or else the
// allocation's own: the analytic model plus the per-batch padding.
func (e *Embedder) CostModel() gpu.CostModel {
	if m := e.calibrated.Load(); m != nil {
		return *m
	}
	return e.cost
}

// SetCostModel makes Cost apply m, a model calibrated on this GPU (subscriber
// --calibrate), which counts the driver's rounding too.
func (e *Embedder) SetCostModel(m gpu.CostModel) error {
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
func (e *Embedder) Cost(items []job.Item) int64 {
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
func (e *Embedder) Working() int64 { return e.working.Load() }

// MemGetInfo is the CUDA driver's view of the device's memory, the cross-check
// of NVML's.
func (e *Embedder) MemGetInfo() (free, total int64, err error) {
	if e.closed.Load() {
		return 0, 0, fmt.Errorf("%s: %w", e.name, gpu.ErrClosed)
	}
	if lost := e.lost.Load(); lost != nil {
		return 0, 0, *lost
	}
	if derr := e.do(func() {
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
func (e *Embedder) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	outs, _, err := e.run(ctx, items, false)
	return outs, err
}

// Measure runs items as one batch and returns the most device memory it held
// at once, as the driver counts free memory: the allocation with the
// driver's rounding, and anything cuBLAS took for it.
func (e *Embedder) Measure(ctx context.Context, items []job.Item) (int64, error) {
	_, peak, err := e.run(ctx, items, true)
	return peak, err
}

func (e *Embedder) run(ctx context.Context, items []job.Item, measure bool) (outs []job.Output, peak int64, err error) {
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
	if derr := e.do(func() {
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
func (e *Embedder) forward(items []job.Item, measure bool) ([]job.Output, int64, error) {
	tokens, offsets := e.cfg.Tokenize(items)
	n, total := len(items), len(tokens)
	dim, hidden, out := e.cfg.Dim, e.cfg.Hidden, e.cfg.Out

	// One allocation, carved into the buffers the cost model counts.
	var layout [6]int64
	var size int64
	for i, b := range []int64{4 * int64(total), 4 * int64(n+1), 4 * int64(total*dim), 4 * int64(n*dim), 4 * int64(n*hidden), 4 * int64(n*out)} {
		layout[i] = size
		size += (b + bufAlign - 1) / bufAlign * bufAlign
	}
	var before int64
	if measure {
		before, _, _ = cu.MemInfo()
	}
	base, err := cu.MemAlloc(size)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: batch of %d items, %d tokens, %s: %w", e.name, n, total, bytesize.Format(size), cudaErr(err))
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
	if err := launch(e.fns.gather, grid(int64(total*dim)), 256, &dTokens, &e.w.emb, &dRows, &nTok, &dimL); err != nil {
		return nil, 0, err
	}
	if err := launch(e.fns.pool, min(n, 65535), min(pow2(dim), 256), &dRows, &dOffsets, &dPooled, &nItems, &dimL); err != nil {
		return nil, 0, err
	}
	if err := e.blas.gemm(dHidden, dPooled, e.w.w1, n, dim, hidden); err != nil {
		return nil, 0, err
	}
	if err := launch(e.fns.gelu, grid(int64(n*hidden)), 256, &dHidden, &e.w.b1, &nItems, &hidL); err != nil {
		return nil, 0, err
	}
	if err := e.blas.gemm(dOut, dHidden, e.w.w2, n, hidden, out); err != nil {
		return nil, 0, err
	}
	if err := launch(e.fns.norm, min(n, 65535), min(pow2(out), 1024), &dOut, &e.w.b2, &nItems, &outL); err != nil {
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
		return nil, 0, fmt.Errorf("%s: batch of %d items: %w", e.name, n, cudaErr(err))
	}
	outputs := make([]job.Output, n)
	for i, it := range items {
		outputs[i] = job.Output{ID: it.ID, Embedding: res[i*out : (i+1)*out : (i+1)*out]}
	}
	return outputs, peak, nil
}

// launch starts fn on blocks blocks of threads threads, on the default
// stream. Every argument is 8 bytes, as cu passes them.
func launch(fn cu.Function, blocks, threads int, args ...any) error {
	params := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		switch p := a.(type) {
		case *cu.DevicePtr:
			params[i] = unsafe.Pointer(p)
		case *int64:
			params[i] = unsafe.Pointer(p)
		case *float64:
			params[i] = unsafe.Pointer(p)
		default:
			panic(fmt.Sprintf("launch: argument %d is %T, want *cu.DevicePtr, *int64 or *float64", i, a))
		}
	}
	return fn.Launch(blocks, 1, 1, threads, 1, 1, 0, cu.Stream{}, params)
}

// grid is how many blocks of 256 threads cover n elements, capped: the
// element-wise kernels loop over whatever a smaller grid leaves.
func grid(n int64) int { return int(min((n+255)/256, 65535)) }

// pow2 is the least power of two ≥ n, for kernels that reduce by halving.
func pow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// cudaErr maps the driver's out-of-memory to gpu.ErrOutOfMemory, so callers never
// import cu to recognise it.
func cudaErr(err error) error {
	if errors.Is(err, cu.OutOfMemory) {
		return fmt.Errorf("%w: %w", gpu.ErrOutOfMemory, err)
	}
	return err
}

// stickyErrors are the CUDA errors after which the context is unusable:
// every later call in it fails the same way (the driver API's documentation
// of each says so), and only a new process can use the GPU again.
var stickyErrors = []error{cu.IllegalAddress, cu.LaunchFailed, cu.MisalignedAddress, cu.IllegalInstruction,
	cu.HardwareStackError, cu.InvalidAddressSpace, cu.InvalidPc, cu.Assert, cu.LaunchTimeout, cu.EccUncorrectable}

// classify turns err, from a call on the context's goroutine, into
// gpu.ErrDeviceLost when the context is broken, and remembers it: later calls
// fail at once. Whichever call reports a sticky error (a kernel's fault shows
// at the next synchronizing call, a cuBLAS call reports only its own status),
// the context itself answers with it, so it is asked.
func (e *Embedder) classify(err error) error {
	return classifyCUDA(err, e.name+" on "+e.devName, &e.lost)
}

// classifyCUDA is classify for any model owning a context: what names the
// model and device, lost keeps the first gpu.ErrDeviceLost.
func classifyCUDA(err error, what string, lost *atomic.Pointer[error]) error {
	cause := err
	if !isSticky(err) {
		serr := cu.Synchronize()
		if !isSticky(serr) {
			return err
		}
		cause = fmt.Errorf("%w (the context reports %w)", err, serr)
	}
	l := fmt.Errorf("%w: %s: %w", gpu.ErrDeviceLost, what, cause)
	lost.CompareAndSwap(nil, &l)
	return *lost.Load()
}

func isSticky(err error) bool {
	for _, s := range stickyErrors {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// Close frees the weights, cuBLAS's handle and the context. Run fails with
// gpu.ErrClosed afterwards; a batch already running finishes first. Later calls
// do nothing.
func (e *Embedder) Close() error {
	e.closing.Do(func() {
		e.closed.Store(true)
		close(e.quit)
	})
	<-e.stopped
	return nil
}
