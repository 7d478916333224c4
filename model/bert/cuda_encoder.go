//go:build cuda

package bert

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/cuda"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/job/fault"

	"gorgonia.org/cu"
)

// The kernels of the BERT encoder, compiled from kernels/bert.cu by `make
// ptx` and committed.
//
//go:embed kernels/bert.ptx
var bertPTX string

// CUDAEncoder is a BERT sentence encoder (model/bert's, same weights and
// arithmetic) on an NVIDIA GPU: cuBLAS GEMMs for the projections and,
// strided-batched, for the two attention products (or one kernel, with
// GPUAttentionFused); the kernels of kernels/bert.cu for everything
// between. The weights are uploaded once, as float32, or with a half
// GPUConfig.Precision the GEMMs' weight matrices as binary16 or bfloat16
// (see GPUFloat16). Each batch allocates exactly CUDAWorkingBytes on the
// device as one allocation, and frees it before Embed returns, whatever
// happened: an estimate that is too small fails as gpu.ErrOutOfMemory, and
// so does any out-of-memory of the driver or cuBLAS, so a caller halving
// the batch recovers. A sticky CUDA error makes this and every later call fail with
// gpu.ErrDeviceLost.
//
// As for refembed.CUDAEmbedder, a cuda.Owner (one goroutine locked to its
// OS thread) owns the context and makes every CUDA call; batches run one at
// a time. A CUDAEncoder is safe for concurrent use.
type CUDAEncoder struct {
	cfg     GPUConfig
	name    string
	weights int64

	closed  atomic.Bool
	working atomic.Int64
	lost    atomic.Pointer[error]
	// rowAttention makes fused attention run bert_attention whatever the
	// head width: set only by tests, to time and check one kernel against
	// the other.
	rowAttention atomic.Bool

	// Owned by the context's goroutine.
	w   []cu.DevicePtr // in GPUWeights.tensors' order; the GEMMs' in half precision if cfg.Precision says so
	fns struct {
		embed, addLN, split, merge, softmax, gelu, pool, norm, erf, toHalf, attention, tiled cu.Function
	}
	own *cuda.Owner
}

// NewCUDAEncoder creates a CUDA context on GPU index, loads the kernels and
// cuBLAS and uploads w, shaped by cfg; name identifies the model in errors.
// It fails with an error wrapping gpu.ErrOutOfMemory when the weights do not
// fit.
func NewCUDAEncoder(index int, name string, w *GPUWeights, cfg GPUConfig) (*CUDAEncoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cuda bert: %w", err)
	}
	if w == nil {
		return nil, errors.New("cuda bert: nil weights")
	}
	if err := w.CheckShape(cfg); err != nil {
		return nil, err
	}
	if err := cuda.CheckDevice(index); err != nil {
		return nil, err
	}
	m := &CUDAEncoder{
		cfg:     cfg,
		name:    name,
		weights: w.BytesAt(cfg.Precision),
	}
	m.own = cuda.NewOwner(name)
	m.own.DeviceName = fmt.Sprintf("cuda:%d", index) // until open names the GPU
	if err := m.own.Start(func() error { return m.setup(index, w) }, m.teardown); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *CUDAEncoder) setup(index int, w *GPUWeights) error {
	if err := m.own.Open(index, bertPTX, map[string]*cu.Function{
		"bert_embed": &m.fns.embed, "bert_add_layernorm": &m.fns.addLN, "bert_split_heads": &m.fns.split,
		"bert_merge_heads": &m.fns.merge, "bert_softmax": &m.fns.softmax, "bert_bias_gelu": &m.fns.gelu,
		"bert_pool": &m.fns.pool, "bert_l2norm": &m.fns.norm, "bert_erf": &m.fns.erf, "bert_to_half": &m.fns.toHalf,
		"bert_attention": &m.fns.attention, "bert_attention_tiled": &m.fns.tiled,
	}); err != nil {
		return err
	}
	if err := m.checkPrecision(index); err != nil {
		return err
	}
	for i, t := range w.tensors() {
		var p cu.DevicePtr
		var err error
		if halfWidth(m.cfg.Precision, i) == 2 {
			p, err = cuda.Upload(m.halves(t))
		} else {
			p, err = cuda.Upload(t)
		}
		if err != nil {
			return fmt.Errorf("%s: load weights: %w", m.name, cuda.MapError(err))
		}
		m.w = append(m.w, p)
	}
	return nil
}

// checkPrecision refuses a half precision the GPU or cuBLAS cannot run:
// bfloat16 needs compute capability 8.0 (Ampere) and up, both need
// cublasGemmEx.
func (m *CUDAEncoder) checkPrecision(index int) error {
	p := m.cfg.Precision
	if p == GPUFloat32 {
		return nil
	}
	if !m.own.Blas.HasGemmEx() {
		return fmt.Errorf("%s: %v: %s has no cublasGemmEx", m.name, p, m.own.Blas.Path)
	}
	if p == GPUBFloat16 {
		major, err := cu.Device(index).Attribute(cu.ComputeCapabilityMajor)
		if err != nil {
			return fmt.Errorf("%s: %v: compute capability: %w", m.name, p, err)
		}
		if major < 8 {
			return fmt.Errorf("%s: %v needs compute capability 8.0 or later; %s has %d.x", m.name, p, m.own.DeviceName, major)
		}
	}
	return nil
}

// halves is t rounded to the encoder's half precision, as the GPU rounds.
func (m *CUDAEncoder) halves(t []float32) []uint16 {
	conv := cuda.HalfBits
	if m.cfg.Precision == GPUBFloat16 {
		conv = cuda.BFloat16Bits
	}
	out := make([]uint16, len(t))
	for i, v := range t {
		out[i] = conv(v)
	}
	return out
}

// halfType is the cuBLAS type of the encoder's half-precision operands.
func (m *CUDAEncoder) halfType() cuda.DataType {
	if m.cfg.Precision == GPUBFloat16 {
		return cuda.BFloat16
	}
	return cuda.Float16
}

func (m *CUDAEncoder) teardown() {
	for _, p := range m.w {
		_ = cu.MemFree(p)
	}
	m.own.Release()
}

// Config is the shape the model was made with.
func (m *CUDAEncoder) Config() GPUConfig { return m.cfg }

// gpu.Device names the GPU, e.g. "NVIDIA H100 80GB HBM3 (cuda:0)".
func (m *CUDAEncoder) Device() string { return m.own.DeviceName }

// Product is the GPU's product name, e.g. "NVIDIA H100 80GB HBM3".
func (m *CUDAEncoder) Product() string { return m.own.Product }

// Weights is the device memory the weights hold.
func (m *CUDAEncoder) Weights() int64 { return m.weights }

// MemGetInfo is the CUDA driver's view of the device's memory.
func (m *CUDAEncoder) MemGetInfo() (free, total int64, err error) {
	if m.closed.Load() {
		return 0, 0, fmt.Errorf("%s: %w", m.name, gpu.ErrClosed)
	}
	if lost := m.lost.Load(); lost != nil {
		return 0, 0, *lost
	}
	if derr := m.own.Do(func() {
		if free, total, err = cu.MemInfo(); err != nil {
			err = cuda.Classify(err, m.name+" on "+m.own.DeviceName, &m.lost)
		}
	}); derr != nil {
		return 0, 0, derr
	}
	return free, total, err
}

// HalfSeqBytes is what one sequence of at most seqLen tokens adds to a
// batch's half-precision operands (GPUConfig.HalfSeqBytes): 0 in float32.
// Embedder.Cost adds it per item.
func (m *CUDAEncoder) HalfSeqBytes(seqLen int) int64 { return m.cfg.HalfSeqBytes(seqLen) }

// Working is the device memory batches hold now.
func (m *CUDAEncoder) Working() int64 { return m.working.Load() }

// WorkingBytes is the device memory Embed allocates for items items padded
// to seqLen tokens (GPUConfig.CUDAWorkingBytes).
func (m *CUDAEncoder) WorkingBytes(items, seqLen int) int64 {
	return m.cfg.CUDAWorkingBytes(items, seqLen)
}

// Embed returns one vector per item of token ids ([CLS] … [SEP]), as one
// batch padded to the longest item. An item that is empty, longer than
// MaxSeqLength or holds an id outside the vocabulary is an error wrapping
// fault.ErrInvalidInput, and nothing runs. Once the batch is on the GPU, Embed
// waits for it even if ctx ends, so that its memory is free on return.
func (m *CUDAEncoder) Embed(ctx context.Context, ids [][]int32) ([][]float32, error) {
	out, _, err := m.run(ctx, ids, false)
	return out, err
}

// Measure runs ids as one batch and returns the most device memory the
// device lost while it ran, as the driver counts free memory (the
// allocation with the driver's rounding, and anything cuBLAS took).
func (m *CUDAEncoder) Measure(ctx context.Context, ids [][]int32) (int64, error) {
	_, peak, err := m.run(ctx, ids, true)
	return peak, err
}

func (m *CUDAEncoder) run(ctx context.Context, ids [][]int32, measure bool) (out [][]float32, peak int64, err error) {
	if m.closed.Load() {
		return nil, 0, fmt.Errorf("%s: %w", m.name, gpu.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if lost := m.lost.Load(); lost != nil {
		return nil, 0, *lost
	}
	for i, item := range ids {
		if err := m.checkItem(item); err != nil {
			return nil, 0, fmt.Errorf("%s: item %d: %w", m.name, i, err)
		}
	}
	if len(ids) == 0 {
		return nil, 0, nil
	}
	if derr := m.own.Do(func() {
		if err = ctx.Err(); err == nil {
			if out, peak, err = m.forward(ids, measure); err != nil {
				err = cuda.Classify(err, m.name+" on "+m.own.DeviceName, &m.lost)
			}
		}
	}); derr != nil {
		return nil, 0, derr
	}
	return out, peak, err
}

func (m *CUDAEncoder) checkItem(item []int32) error {
	if len(item) == 0 {
		return fmt.Errorf("%w: no tokens (a tokenized text has at least [CLS] and [SEP])", fault.ErrInvalidInput)
	}
	if len(item) > m.cfg.MaxSeqLength {
		return fmt.Errorf("%w: %d tokens, over the model's limit of %d", fault.ErrInvalidInput, len(item), m.cfg.MaxSeqLength)
	}
	for p, id := range item {
		if id < 0 || int(id) >= m.cfg.Vocab {
			return fmt.Errorf("%w: token %d is id %d, outside the vocabulary [0, %d)", fault.ErrInvalidInput, p, id, m.cfg.Vocab)
		}
	}
	return nil
}

// forward is one batch, on the context's goroutine.
func (m *CUDAEncoder) forward(ids [][]int32, measure bool) ([][]float32, int64, error) {
	c := m.cfg
	items := len(ids)
	seqLen := 0
	for _, it := range ids {
		seqLen = max(seqLen, len(it))
	}
	rows := items * seqLen
	h, in, heads, d := c.Hidden, c.Intermediate, c.Heads, c.Hidden/c.Heads
	tokens := make([]int32, rows) // padding is token 0, as on the CPU: masked
	lens := make([]int32, items)
	for b, it := range ids {
		copy(tokens[b*seqLen:], it)
		lens[b] = int32(len(it))
	}

	sizes := c.bertBuffers(items, seqLen)
	var offs [len(sizes)]int64
	var size int64
	for i, b := range sizes {
		offs[i] = size
		size += (b + gpuAlign - 1) / gpuAlign * gpuAlign
	}
	var before int64
	if measure {
		before, _, _ = cu.MemInfo()
	}
	base, err := cu.MemAlloc(size)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: batch of %d items × %d tokens, %s: %w", m.name, items, seqLen, bytesize.Format(size), cuda.MapError(err))
	}
	m.working.Add(size)
	defer func() {
		m.working.Add(-size)
		_ = cu.MemFree(base)
	}()
	buf := func(i int) cu.DevicePtr { return base + cu.DevicePtr(offs[i]) }
	dIDs, dLens, dX, dQKV, dHeads, dScores, dCtx, dProj, dInter, dOut :=
		buf(0), buf(1), buf(2), buf(3), buf(4), buf(5), buf(6), buf(7), buf(8), buf(9)
	// In half precision: Q, K and V by head, then one other operand (see
	// GPUConfig.halfOperands).
	half, fused := c.Precision != GPUFloat32, c.Attention == GPUAttentionFused
	tiled := c.tiledAttention() && !m.rowAttention.Load()
	// bert_attention: a tile of keys per thread, at least one thread per
	// component of a head (its accumulators), at least two warps.
	attnThreads := max(cuda.Pow2(c.Hidden/c.Heads), 64)
	// bert_attention_tiled: a query per thread, 64 to a block (K and V
	// read from global memory once per 64 queries); a whole block for a
	// batch of up to 32 tokens, which would leave half of 64 idle.
	tileQueries := 64
	if seqLen <= 32 {
		tileQueries = 32
	}
	qkvHalves, _ := c.halfOperands(items, seqLen)
	dQKV16 := buf(10)
	dOther16 := dQKV16 + cu.DevicePtr((2*qkvHalves+gpuAlign-1)/gpuAlign*gpuAlign)
	abt := m.halfType()
	var bf16, prec int64 // prec as bert_split_heads and bert_attention_tiled take it: 0 float32, 1 binary16, 2 bfloat16
	if c.Precision == GPUBFloat16 {
		bf16 = 1
	}
	if half {
		prec = 1 + bf16
	}
	// bert_split_heads writes Q, K and V in half precision where the
	// attention reads them only so: the GEMMs' and the tiled kernel's
	// (halfOperands charges them), not the per-row kernel's. Its out16
	// must be device memory even when unused.
	splitPrec, split16 := int64(0), dHeads
	if half && (!fused || tiled) {
		splitPrec, split16 = prec, dQKV16
	}
	toHalf := func(src, dst cu.DevicePtr, n int64) error {
		return cuda.Launch(m.fns.toHalf, cuda.Grid(n), 256, &src, &dst, &n, &bf16)
	}
	// gemm is Blas.Gemm (dst = act·w, row-major rows×k times k×out), in half
	// precision through the other operand's place.
	gemm := func(dst, act, w cu.DevicePtr, k, out int) error {
		if !half {
			return m.own.Blas.Gemm(dst, act, w, rows, k, out)
		}
		if err := toHalf(act, dOther16, int64(rows*k)); err != nil {
			return err
		}
		return m.own.Blas.GemmEx(dst, cuda.Float32, dOther16, w, abt, rows, k, out)
	}

	if err := cu.MemcpyHtoD(dIDs, unsafe.Pointer(&tokens[0]), 4*int64(rows)); err != nil {
		return nil, 0, err
	}
	if err := cu.MemcpyHtoD(dLens, unsafe.Pointer(&lens[0]), 4*int64(items)); err != nil {
		return nil, 0, err
	}
	var (
		nRows, nItems, seqL = int64(rows), int64(items), int64(seqLen)
		hL, inL, headsL, dL = int64(h), int64(in), int64(heads), int64(d)
		eps                 = c.LayerNormEps
		scale               = 1 / math.Sqrt(float64(d))
		nScoreRows          = int64(items * heads * seqLen)
		nHeads              = int64(items * heads)
		queryTiles          = items * heads * ((seqLen + tileQueries - 1) / tileQueries)
		mode                = int64(c.Pooling)
		rowThreads          = min(cuda.Pow2(h), 256)
		rowBlocks           = min(rows, 65535)
		sd, ss              = int64(seqLen * d), int64(seqLen * seqLen)
		nb                  = items * heads
		dQ, dK, dV          = dHeads, dHeads + cu.DevicePtr(4*rows*h), dHeads + cu.DevicePtr(8*rows*h)
		dQ16, dK16, dV16    = dQKV16, dQKV16 + cu.DevicePtr(2*rows*h), dQKV16 + cu.DevicePtr(4*rows*h)
		wEmb                = m.w[:5]
		dWord, dPos, dType0 = wEmb[0], wEmb[1], wEmb[2]
		dEmbGamma, dEmbBeta = wEmb[3], wEmb[4]
	)
	steps := []func() error{
		func() error {
			return cuda.Launch(m.fns.embed, rowBlocks, rowThreads,
				&dIDs, &dWord, &dPos, &dType0, &dEmbGamma, &dEmbBeta, &dX, &nRows, &seqL, &hL, &eps)
		},
	}
	for l := range c.Layers {
		lw := m.w[5+12*l : 5+12*(l+1)]
		qkvW, qkvB, aoW, aoB, aG, aB, iW, iB, oW, oB, oG, oBeta :=
			lw[0], lw[1], lw[2], lw[3], lw[4], lw[5], lw[6], lw[7], lw[8], lw[9], lw[10], lw[11]
		steps = append(steps,
			func() error { return gemm(dQKV, dX, qkvW, h, 3*h) },
			func() error {
				return cuda.Launch(m.fns.split, cuda.Grid(int64(rows*3*h)), 256, &dQKV, &qkvB, &dHeads, &split16, &nItems, &seqL, &headsL, &dL, &splitPrec)
			},
			// Scores of each (item, head): S = Q·Kᵀ, row-major L×L. Read
			// column-major, that is Sᵀ = K·Qᵀ: A = K (d×L column-major,
			// transposed), B = Q (d×L, as is).
			func() error {
				if fused {
					// softmax(QKᵀ/√d)·V in one kernel, into Q's place;
					// the two steps after are then nothing.
					if !tiled {
						return cuda.Launch(m.fns.attention, min(int(nScoreRows), 65535), attnThreads,
							&dQ, &dK, &dV, &dLens, &nScoreRows, &seqL, &headsL, &dL, &scale)
					}
					// In half precision Q's float32 place holds only
					// outputs: its padded rows keep whatever was there
					// (NaN on the emulated GPU), which nothing reads.
					q, k, v := dQ, dK, dV
					if half {
						q, k, v = dQ16, dK16, dV16
					}
					return cuda.Launch(m.fns.tiled, min(queryTiles, 65535), tileQueries,
						&q, &k, &v, &dQ, &dLens, &nHeads, &seqL, &headsL, &dL, &scale, &prec)
				}
				if !half {
					return m.own.Blas.GemmBatched(true, false, seqLen, seqLen, d, dK, d, sd, dQ, d, sd, dScores, seqLen, ss, nb)
				}
				return m.own.Blas.GemmBatchedEx(true, false, seqLen, seqLen, d, dK16, d, sd, dQ16, d, sd, abt,
					dScores, seqLen, ss, cuda.Float32, nb)
			},
			func() error {
				if fused {
					return nil
				}
				return cuda.Launch(m.fns.softmax, min(int(nScoreRows), 65535), min(cuda.Pow2(seqLen), 256),
					&dScores, &dLens, &nScoreRows, &seqL, &headsL, &scale)
			},
			// Output of each head, O = P·V (L×d row-major): column-major
			// Oᵀ = Vᵀ·Pᵀ, with A = V (d×L) and B = P (L×L), into Q's
			// place (Q is spent).
			func() error {
				if fused {
					return nil
				}
				if !half {
					return m.own.Blas.GemmBatched(false, false, d, seqLen, seqLen, dV, d, sd, dScores, seqLen, ss, dQ, d, sd, nb)
				}
				if err := toHalf(dScores, dOther16, nScoreRows*seqL); err != nil {
					return err
				}
				return m.own.Blas.GemmBatchedEx(false, false, d, seqLen, seqLen, dV16, d, sd, dOther16, seqLen, ss, abt,
					dQ, d, sd, cuda.Float32, nb)
			},
			func() error {
				return cuda.Launch(m.fns.merge, cuda.Grid(int64(rows*h)), 256, &dQ, &dCtx, &nItems, &seqL, &headsL, &dL)
			},
			func() error { return gemm(dProj, dCtx, aoW, h, h) },
			func() error {
				return cuda.Launch(m.fns.addLN, rowBlocks, rowThreads, &dX, &dProj, &aoB, &aG, &aB, &nRows, &hL, &eps)
			},
			func() error { return gemm(dInter, dX, iW, h, in) },
			func() error {
				return cuda.Launch(m.fns.gelu, cuda.Grid(int64(rows*in)), 256, &dInter, &iB, &nRows, &inL)
			},
			func() error { return gemm(dProj, dInter, oW, in, h) },
			func() error {
				return cuda.Launch(m.fns.addLN, rowBlocks, rowThreads, &dX, &dProj, &oB, &oG, &oBeta, &nRows, &hL, &eps)
			},
		)
	}
	steps = append(steps, func() error {
		return cuda.Launch(m.fns.pool, min(items, 65535), rowThreads, &dX, &dLens, &dOut, &nItems, &seqL, &hL, &mode)
	})
	if c.Normalize {
		steps = append(steps, func() error { return cuda.Launch(m.fns.norm, min(items, 65535), rowThreads, &dOut, &nItems, &hL) })
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, 0, fmt.Errorf("%s: batch of %d items × %d tokens: %w", m.name, items, seqLen, err)
		}
	}
	var peak int64
	if measure {
		after, _, _ := cu.MemInfo()
		peak = before - after
	}
	res := make([]float32, items*h)
	// Synchronous on the default stream: waits for the kernels and reports
	// any fault they hit.
	if err := cu.MemcpyDtoH(unsafe.Pointer(&res[0]), dOut, 4*int64(items*h)); err != nil {
		return nil, 0, fmt.Errorf("%s: batch of %d items × %d tokens: %w", m.name, items, seqLen, cuda.MapError(err))
	}
	out := make([][]float32, items)
	for b := range out {
		out[b] = res[b*h : (b+1)*h : (b+1)*h]
	}
	return out, peak, nil
}

// Erf runs the encoder's erf (the one its GELU uses) on the GPU over xs,
// for tests against math.Erf.
func (m *CUDAEncoder) Erf(xs []float32) ([]float32, error) {
	if len(xs) == 0 {
		return nil, nil
	}
	out := make([]float32, len(xs))
	var err error
	if derr := m.own.Do(func() {
		err = func() error {
			n := int64(len(xs))
			dx, err := cuda.Upload(xs)
			if err != nil {
				return cuda.MapError(err)
			}
			defer cu.MemFree(dx)
			dy, err := cu.MemAlloc(4 * n)
			if err != nil {
				return cuda.MapError(err)
			}
			defer cu.MemFree(dy)
			if err := cuda.Launch(m.fns.erf, cuda.Grid(n), 256, &dx, &dy, &n); err != nil {
				return err
			}
			return cu.MemcpyDtoH(unsafe.Pointer(&out[0]), dy, 4*n)
		}()
	}); derr != nil {
		return nil, derr
	}
	return out, err
}

// Close frees the weights, cuBLAS's handle and the context. Embed fails
// with gpu.ErrClosed afterwards. Later calls do nothing.
func (m *CUDAEncoder) Close() error {
	m.closed.Store(true)
	m.own.Stop()
	return nil
}
