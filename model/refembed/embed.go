package refembed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// Config shapes the reference embedding model. Its zero value is not
// usable; start from DefaultConfig.
type Config struct {
	// Vocab is the number of token ids: id 0 for an item without words,
	// 1..Vocab-1 for hashed words.
	Vocab int
	// Dim is the width of a token embedding and of the pooled vector.
	Dim int
	// Hidden is the width of the MLP's hidden layer.
	Hidden int
	// Out is the width of the output embedding.
	Out int
	// MaxTokens is the most tokens read from one item; the rest of a
	// longer text is dropped, as a real model's context ends.
	MaxTokens int
	// Seed picks the weights GenerateWeights makes.
	Seed uint64
}

// DefaultConfig is a model small enough to generate in milliseconds and
// run on a CPU, and big enough that its working memory, not its weights,
// decides how many items fit: Vocab 16384, Dim 256, Hidden 1024, Out 256,
// MaxTokens 512, Seed 1. Its weights take 18,879,488 bytes (18.0MiB).
func DefaultConfig() Config {
	return Config{Vocab: 16384, Dim: 256, Hidden: 1024, Out: 256, MaxTokens: 512, Seed: 1}
}

// Validate reports every field out of range.
func (c Config) Validate() error {
	// The caps keep token ids within int32 and tensor sizes within int.
	const maxWidth, maxTokens = 1 << 24, 1 << 20
	var errs []error
	check := func(name string, v, lo, hi int) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Errorf("embed config: %s is %d, want %d to %d", name, v, lo, hi))
		}
	}
	check("Vocab", c.Vocab, 2, maxWidth)
	check("Dim", c.Dim, 1, maxWidth)
	check("Hidden", c.Hidden, 1, maxWidth)
	check("Out", c.Out, 1, maxWidth)
	check("MaxTokens", c.MaxTokens, 1, maxTokens)
	return errors.Join(errs...)
}

// CostModel is the cost model of this configuration, derived from the
// buffers of the forward pass. It assumes they are allocated exactly, as
// Embedder does; a GPU allocator rounds sizes up, which a cost model
// calibrated on the device accounts for (package calibrate).
func (c Config) CostModel() gpu.CostModel {
	const f32, i32 = 4, 4
	return gpu.CostModel{
		PerToken: i32 + f32*int64(c.Dim),
		PerItem:  i32 + f32*int64(c.Dim+c.Hidden+c.Out),
	}
}

// Embedder is the reference model: a real text embedding computed in pure
// Go. Each item's text is tokenized (see appendTokens), its token embeddings
// are mean-pooled, passed through a one-hidden-layer MLP with a GELU, and the
// result is L2-normalised:
//
//	x = mean(Embedding[tokens])
//	y = GELU(x·W1 + b1)·W2 + b2
//	out = y / ‖y‖
//
// GELU is the tanh approximation, 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))),
// which is what GPU kernels commonly compute. Binary Data is ignored; an item
// without text gets the embedding of the empty token.
//
// The weights and every working buffer are taken from a gpu.Allocator, so a gpu.Sim
// runs out of memory where a device of its size would. An Embedder is safe
// for concurrent use; Run does not spread one batch over several cores, since
// the subscriber runs several batches at once.
type Embedder struct {
	cfg         Config
	w           *Weights
	cost        gpu.CostModel                 // analytic: exactly what Run allocates
	calibrated  atomic.Pointer[gpu.CostModel] // set by SetCostModel; replaces cost in Cost
	name        string
	mem         gpu.Allocator
	freeWeights func()
	closed      atomic.Bool
	working     atomic.Int64 // bytes of workspace allocated now, across Runs
}

var (
	_ gpu.Model      = (*Embedder)(nil)
	_ gpu.WorkingSet = (*Embedder)(nil)
)

// NewEmbedder loads w, shaped by cfg, onto mem: it allocates the weights'
// bytes there, failing with an error wrapping gpu.ErrOutOfMemory when they do
// not fit, and keeps them until Close. A nil mem accounts nothing. w must
// not change while the Embedder is in use.
func NewEmbedder(w *Weights, cfg Config, mem gpu.Allocator) (*Embedder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if w == nil {
		return nil, errors.New("embed: nil weights")
	}
	if err := w.CheckShape(cfg); err != nil {
		return nil, err
	}
	e := &Embedder{
		cfg:         cfg,
		w:           w,
		cost:        cfg.CostModel(),
		name:        fmt.Sprintf("ref-embed-v1-v%d-d%d-h%d-o%d-t%d", cfg.Vocab, cfg.Dim, cfg.Hidden, cfg.Out, cfg.MaxTokens),
		mem:         mem,
		freeWeights: func() {},
	}
	if mem != nil {
		free, err := mem.Alloc(w.Bytes())
		if err != nil {
			return nil, fmt.Errorf("%s: load weights: %w", e.name, err)
		}
		e.freeWeights = free
	}
	return e, nil
}

// Name says the model and its shape, e.g. "ref-embed-v1-v16384-d256-h1024-o256-t512".
// It does not say which weights: embedders with different seeds share it.
func (e *Embedder) Name() string { return e.name }

// Config is the configuration the Embedder was made with.
func (e *Embedder) Config() Config { return e.cfg }

// MaxTokens is the most tokens the model reads from an item
// (calibrate.Meter).
func (e *Embedder) MaxTokens() int { return e.cfg.MaxTokens }

// CountTokens is how many tokens the model reads from text, as Cost counts
// them (calibrate.Meter).
func (e *Embedder) CountTokens(text string) int { return e.cfg.CountTokens(text) }

// Weights is the memory the weights hold, allocated by NewEmbedder.
func (e *Embedder) Weights() int64 { return e.w.Bytes() }

// CostModel is the model Cost applies: the one SetCostModel gave, or else
// the analytic one of the configuration.
func (e *Embedder) CostModel() gpu.CostModel {
	if m := e.calibrated.Load(); m != nil {
		return *m
	}
	return e.cost
}

// Cost is the working memory Run needs for items under CostModel: exactly
// what Run allocates, unless a calibrated model says more. It reads each
// text once, without allocating.
func (e *Embedder) Cost(items []job.Item) int64 { return e.cfg.Cost(e.CostModel(), items) }

// Cost is m applied to items' tokens under c's tokenizer: what an
// Embedder of c that applies m estimates (bench/timed's stand-in uses it).
func (c Config) Cost(m gpu.CostModel, items []job.Item) int64 {
	var tokens int64
	for _, it := range items {
		tokens += int64(c.CountTokens(it.Text))
	}
	return m.Bytes(tokens, int64(len(items)))
}

// WeightBytes is the memory weights of this configuration take: the
// embedding table, W1, b1, W2 and b2, in float32.
func (c Config) WeightBytes() int64 {
	v, d, h, o := int64(c.Vocab), int64(c.Dim), int64(c.Hidden), int64(c.Out)
	return 4 * (v*d + d*h + h + h*o + o)
}

// Working is the workspace memory the Runs in progress hold now, allocated
// from the Allocator; 0 without one.
func (e *Embedder) Working() int64 { return e.working.Load() }

// Close frees the weights' memory. Run fails with gpu.ErrClosed afterwards.
// Later calls do nothing.
func (e *Embedder) Close() error {
	if !e.closed.Swap(true) {
		e.freeWeights()
	}
	return nil
}

// rowBlock is how many items Run computes between checks of its context.
const rowBlock = 64

// Run embeds items as one batch. It allocates all its working memory, Cost
// bytes under the analytic cost model (a calibrated one may reserve more),
// before computing anything, so a batch that does not fit fails at
// once with an error wrapping gpu.ErrOutOfMemory, having allocated nothing that
// it keeps. The outputs are the same bit for bit however items are batched.
func (e *Embedder) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	return e.run(ctx, items, e.mem)
}

// run is Run taking its working memory from mem (nil: account nothing),
// which Measure wraps to count it.
func (e *Embedder) run(ctx context.Context, items []job.Item, mem gpu.Allocator) ([]job.Output, error) {
	if e.closed.Load() {
		return nil, fmt.Errorf("%s: %w", e.name, gpu.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n := len(items)
	if n == 0 {
		return []job.Output{}, nil
	}
	counts := make([]int, n)
	total := 0
	for i, it := range items {
		counts[i] = e.cfg.CountTokens(it.Text)
		total += counts[i]
	}

	// The buffers a GPU forward pass needs, allocated as it would allocate
	// them, so that Cost is checked against real allocations.
	dim, hidden, out := e.cfg.Dim, e.cfg.Hidden, e.cfg.Out
	buf := workspace{mem: mem, working: &e.working}
	defer buf.free()
	tokens := alloc[int32](&buf, total)
	offsets := alloc[int32](&buf, n)
	gathered := alloc[float32](&buf, total*dim)
	pooled := alloc[float32](&buf, n*dim)
	hid := alloc[float32](&buf, n*hidden)
	res := alloc[float32](&buf, n*out)
	if buf.err != nil {
		return nil, fmt.Errorf("%s: batch of %d items, %d tokens: %w", e.name, n, total, buf.err)
	}

	tokens = tokens[:0]
	for i, it := range items {
		offsets[i] = int32(len(tokens))
		tokens = e.cfg.appendTokens(tokens, it.Text)
	}
	emb := e.w.Embedding
	for t, id := range tokens {
		copy(gathered[t*dim:(t+1)*dim], emb[int(id)*dim:(int(id)+1)*dim])
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	for i := range n {
		meanPool(pooled[i*dim:(i+1)*dim], gathered[int(offsets[i])*dim:], counts[i])
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	for lo := 0; lo < n; lo += rowBlock {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hi := min(lo+rowBlock, n)
		h := hid[lo*hidden : hi*hidden]
		matMulBias(h, pooled[lo*dim:hi*dim], e.w.W1, e.w.B1, hi-lo, dim, hidden)
		gelu(h)
	}
	for lo := 0; lo < n; lo += rowBlock {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hi := min(lo+rowBlock, n)
		matMulBias(res[lo*out:hi*out], hid[lo*hidden:hi*hidden], e.w.W2, e.w.B2, hi-lo, hidden, out)
	}

	outputs := make([]job.Output, n)
	for i, it := range items {
		// Capped so that appending to one embedding cannot overwrite the next.
		y := res[i*out : (i+1)*out : (i+1)*out]
		normalize(y)
		outputs[i] = job.Output{ID: it.ID, Embedding: y}
	}
	return outputs, nil
}

// workspace is a Run's device buffers. Its error is sticky, as in
// bufio.Scanner: after the first failed allocation the rest are skipped, so a
// batch too big for the device costs no host memory either, and Run checks
// once.
type workspace struct {
	mem     gpu.Allocator // nil: account nothing
	working *atomic.Int64
	frees   []func()
	err     error
}

// alloc makes a buffer of n values, taking its bytes from w.mem.
func alloc[T int32 | float32](w *workspace, n int) []T {
	if w.err != nil {
		return nil
	}
	if w.mem != nil {
		var zero T
		size := int64(n) * int64(unsafe.Sizeof(zero))
		free, err := w.mem.Alloc(size)
		if err != nil {
			w.err = err
			return nil
		}
		// Counted only while really allocated, so that Working is never
		// above it (see gpu.WorkingSet).
		w.working.Add(size)
		w.frees = append(w.frees, func() { w.working.Add(-size); free() })
	}
	return make([]T, n)
}

func (w *workspace) free() {
	for _, f := range w.frees {
		f()
	}
}

// meanPool sets dst to the mean of the first count rows of rows.
func meanPool(dst, rows []float32, count int) {
	dim := len(dst)
	clear(dst)
	for t := range count {
		for j, v := range rows[t*dim : (t+1)*dim] {
			dst[j] += v
		}
	}
	scale := 1 / float32(count)
	for j := range dst {
		dst[j] *= scale
	}
}

// matMulBias sets dst (rows×m) to a (rows×k) times b (k×m) plus bias (m), all
// row-major. It walks b by rows, the order it lies in memory, and uses each
// row of b for four rows of a at once, reading b a quarter as often. What
// that bought, and the orders that bought nothing, are recorded in
// bench/README.md ("The reference model's matrix product"); the speed that
// matters comes from the GPU backend.
//
// Every element is bias + Σ a[i][p]·b[p][j] summed in order p = 0..k-1 with
// each product rounded to float32 (the explicit conversion stops the compiler
// from fusing it into an FMA, which it may do on some targets): so a row's
// result does not depend on which rows it is computed with, and batching
// leaves outputs unchanged.
func matMulBias(dst, a, b, bias []float32, rows, k, m int) {
	i := 0
	for ; i+4 <= rows; i += 4 {
		d0 := dst[(i+0)*m : (i+1)*m]
		d1 := dst[(i+1)*m : (i+2)*m]
		d2 := dst[(i+2)*m : (i+3)*m]
		d3 := dst[(i+3)*m : (i+4)*m]
		copy(d0, bias)
		copy(d1, bias)
		copy(d2, bias)
		copy(d3, bias)
		for p := range k {
			x0, x1, x2, x3 := a[(i+0)*k+p], a[(i+1)*k+p], a[(i+2)*k+p], a[(i+3)*k+p]
			row := b[p*m : (p+1)*m]
			d0, d1, d2, d3 := d0[:len(row)], d1[:len(row)], d2[:len(row)], d3[:len(row)]
			for j, w := range row {
				d0[j] += float32(x0 * w)
				d1[j] += float32(x1 * w)
				d2[j] += float32(x2 * w)
				d3[j] += float32(x3 * w)
			}
		}
	}
	for ; i < rows; i++ {
		d := dst[i*m : (i+1)*m]
		copy(d, bias)
		for p := range k {
			x := a[i*k+p]
			row := b[p*m : (p+1)*m]
			d := d[:len(row)]
			for j, w := range row {
				d[j] += float32(x * w)
			}
		}
	}
}

// gelu applies the tanh approximation of GELU in place.
func gelu(xs []float32) {
	const c = 0.7978845608028654 // √(2/π)
	for i, v := range xs {
		x := float64(v)
		xs[i] = float32(0.5 * x * (1 + math.Tanh(c*(x+0.044715*x*x*x))))
	}
}

// normalize scales y to unit length. The sum is taken in float64 so that
// the norm is right to float32 precision whatever the width.
func normalize(y []float32) {
	var ss float64
	for _, v := range y {
		ss += float64(v) * float64(v)
	}
	if ss == 0 {
		return // no direction to keep; cannot happen with biases drawn at random
	}
	scale := float32(1 / math.Sqrt(ss))
	for j := range y {
		y[j] *= scale
	}
}
