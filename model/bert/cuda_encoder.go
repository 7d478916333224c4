//go:build cuda

package bert

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
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

// profileFromEnv says whether VRAMQ_BERT_PROFILE=1 asks every CUDA encoder
// to profile its steps. Read once: the setting is the process's, and
// forward runs on every batch.
var profileFromEnv = sync.OnceValue(func() bool { return os.Getenv("VRAMQ_BERT_PROFILE") == "1" })

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
	// profile times forward's steps (VRAMQ_BERT_PROFILE=1).
	profile stepProfile

	// Owned by the context's goroutine.
	w   []cu.DevicePtr // in GPUWeights.tensors' order; the GEMMs' in half precision if cfg.Precision says so
	fns struct {
		embed, addLN, split, merge, softmax, gelu, pool, norm, erf, attention, tiled cu.Function
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
	m.profile.reset(profileFromEnv())
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
		"bert_pool": &m.fns.pool, "bert_l2norm": &m.fns.norm, "bert_erf": &m.fns.erf,
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

// HalfSeqBytes bounds what one sequence of at most seqLen tokens adds to a
// batch in half precision over float32 (GPUConfig.HalfSeqBytes): 0 in
// float32, and where half precision holds less.
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
	var offs [nBuffers]int64
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
	// buf is buffer i; one this configuration does not allocate is the
	// hidden state's place, so that a kernel's unused pointer argument is
	// still device memory.
	buf := func(i int) cu.DevicePtr {
		if sizes[i] == 0 {
			i = bufX
		}
		return base + cu.DevicePtr(offs[i])
	}
	dIDs, dLens, dX, dQKV, dHeads, dScores, dCtx, dProj, dInter, dOut :=
		buf(bufIDs), buf(bufLens), buf(bufX), buf(bufQKV), buf(bufHeads), buf(bufScores), buf(bufCtx), buf(bufProj), buf(bufInter), buf(bufOut)
	dX16, dQKV16, dHeads16, dP16, dCtx16, dInter16 :=
		buf(bufX16), buf(bufQKV16), buf(bufHeads16), buf(bufP16), buf(bufCtx16), buf(bufInter16)
	half, fused := c.Precision != GPUFloat32, c.Attention == GPUAttentionFused
	tiled := c.tiledAttention()
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
	abt := m.halfType()
	// prec is how the kernels take a buffer's number format: 0 float32,
	// 1 binary16, 2 bfloat16. In half precision every GEMM's activation
	// operand is written so by the kernel before it (bertBuffers says which
	// buffers are half).
	var prec int64
	if half {
		prec = 1
		if c.Precision == GPUBFloat16 {
			prec = 2
		}
	}
	// The GEMMs' activation operands (xIn, ctx, inter; inter is also the
	// intermediate GEMM's output, which GELU rewrites in place) and the
	// Q/K/V projection's output; actType is the type of both GEMM outputs.
	xIn, ctx, inter, qkv := dX, dCtx, dInter, dQKV
	actType, splitIn := cuda.Float32, int64(0)
	if half {
		xIn, ctx, inter, qkv = dX16, dCtx16, dInter16, dQKV16
		actType, splitIn = abt, prec
	}
	// bert_split_heads writes Q, K and V in half precision where the
	// attention reads them only so: the GEMMs' and the tiled kernel's, not
	// the per-row kernel's.
	splitPrec := int64(0)
	if half && (!fused || tiled) {
		splitPrec = prec
	}
	// Where the attention leaves its output, which bert_merge_heads reads:
	// the fused kernels in float32 at the head of bufHeads, P·V in the
	// products' precision into Q's place.
	attnOut, attnPrec := dHeads, int64(0)
	if !fused && half {
		attnOut, attnPrec = dHeads16, prec
	}
	// gemm is dst = act·w (row-major rows×k times k×out): cublasSgemm in
	// float32, else cublasGemmEx on act's half-precision copy, into dst of
	// type ct.
	gemm := func(dst cu.DevicePtr, ct cuda.DataType, act, w cu.DevicePtr, k, out int) error {
		if !half {
			return m.own.Blas.Gemm(dst, act, w, rows, k, out)
		}
		return m.own.Blas.GemmEx(dst, ct, act, w, abt, rows, k, out)
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
		// bert_embed, bert_add_layernorm, bert_softmax and bert_l2norm
		// take a warp a row: four rows to a block, grid-stride past the
		// 65,535 blocks.
		warpRowThreads      = 128
		warpRowBlocks       = func(rows int) int { return min((rows*32+warpRowThreads-1)/warpRowThreads, 65535) }
		lnBlocks            = warpRowBlocks(rows)
		sd, ss              = int64(seqLen * d), int64(seqLen * seqLen)
		nb                  = items * heads
		dQ, dK, dV          = dHeads, dHeads + cu.DevicePtr(4*rows*h), dHeads + cu.DevicePtr(8*rows*h)
		dQ16, dK16, dV16    = dHeads16, dHeads16 + cu.DevicePtr(2*rows*h), dHeads16 + cu.DevicePtr(4*rows*h)
		wEmb                = m.w[:5]
		dWord, dPos, dType0 = wEmb[0], wEmb[1], wEmb[2]
		dEmbGamma, dEmbBeta = wEmb[3], wEmb[4]
	)
	steps := []step{{stepEmbed, func() error {
		return cuda.Launch(m.fns.embed, lnBlocks, warpRowThreads,
			&dIDs, &dWord, &dPos, &dType0, &dEmbGamma, &dEmbBeta, &dX, &nRows, &seqL, &hL, &eps, &dX16, &prec)
	}}}
	for l := range c.Layers {
		lw := m.w[5+12*l : 5+12*(l+1)]
		qkvW, qkvB, aoW, aoB, aG, aB, iW, iB, oW, oB, oG, oBeta :=
			lw[0], lw[1], lw[2], lw[3], lw[4], lw[5], lw[6], lw[7], lw[8], lw[9], lw[10], lw[11]
		steps = append(steps,
			step{stepQKVGemm, func() error { return gemm(qkv, actType, xIn, qkvW, h, 3*h) }},
			step{stepSplit, func() error {
				return cuda.Launch(m.fns.split, rowBlocks, rowThreads, &qkv, &qkvB, &dHeads, &dHeads16, &nItems, &seqL, &headsL, &dL,
					&splitPrec, &splitIn)
			}})
		switch {
		case fused && !tiled:
			// softmax(QKᵀ/√d)·V in one kernel, into Q's place.
			steps = append(steps, step{stepAttention, func() error {
				return cuda.Launch(m.fns.attention, min(int(nScoreRows), 65535), attnThreads,
					&dQ, &dK, &dV, &dLens, &nScoreRows, &seqL, &headsL, &dL, &scale)
			}})
		case fused:
			// In half precision bufHeads holds only the outputs: the
			// padded rows keep whatever was there (NaN on the emulated
			// GPU), which nothing reads.
			q, k, v := dQ, dK, dV
			if half {
				q, k, v = dQ16, dK16, dV16
			}
			steps = append(steps, step{stepAttention, func() error {
				return cuda.Launch(m.fns.tiled, min(queryTiles, 65535), tileQueries,
					&q, &k, &v, &dHeads, &dLens, &nHeads, &seqL, &headsL, &dL, &scale, &prec)
			}})
		default:
			steps = append(steps,
				// Scores of each (item, head): S = Q·Kᵀ, row-major L×L,
				// float32 (softmax reads it so). Read column-major, that is
				// Sᵀ = K·Qᵀ: A = K (d×L column-major, transposed), B = Q
				// (d×L, as is).
				step{stepScores, func() error {
					if !half {
						return m.own.Blas.GemmBatched(true, false, seqLen, seqLen, d, dK, d, sd, dQ, d, sd, dScores, seqLen, ss, nb)
					}
					return m.own.Blas.GemmBatchedEx(true, false, seqLen, seqLen, d, dK16, d, sd, dQ16, d, sd, abt,
						dScores, seqLen, ss, cuda.Float32, nb)
				}},
				step{stepSoftmax, func() error {
					return cuda.Launch(m.fns.softmax, warpRowBlocks(int(nScoreRows)), warpRowThreads,
						&dScores, &dLens, &nScoreRows, &seqL, &headsL, &scale, &dP16, &prec)
				}},
				// Output of each head, O = P·V (L×d row-major): column-major
				// Oᵀ = Vᵀ·Pᵀ, with A = V (d×L) and B = P (L×L), into Q's
				// place (Q is spent).
				step{stepPV, func() error {
					if !half {
						return m.own.Blas.GemmBatched(false, false, d, seqLen, seqLen, dV, d, sd, dScores, seqLen, ss, dQ, d, sd, nb)
					}
					return m.own.Blas.GemmBatchedEx(false, false, d, seqLen, seqLen, dV16, d, sd, dP16, seqLen, ss, abt,
						dQ16, d, sd, abt, nb)
				}})
		}
		steps = append(steps,
			step{stepMerge, func() error {
				return cuda.Launch(m.fns.merge, rowBlocks, rowThreads, &attnOut, &ctx, &nItems, &seqL, &headsL, &dL, &attnPrec, &prec)
			}},
			step{stepOutProjGemm, func() error { return gemm(dProj, cuda.Float32, ctx, aoW, h, h) }},
			step{stepAddLN, func() error {
				return cuda.Launch(m.fns.addLN, lnBlocks, warpRowThreads, &dX, &dProj, &aoB, &aG, &aB, &nRows, &hL, &eps, &dX16, &prec)
			}},
			step{stepInterGemm, func() error { return gemm(inter, actType, xIn, iW, h, in) }},
			step{stepGELU, func() error {
				return cuda.Launch(m.fns.gelu, rowBlocks, 256, &inter, &iB, &nRows, &inL, &prec)
			}},
			step{stepOutGemm, func() error { return gemm(dProj, cuda.Float32, inter, oW, in, h) }},
			step{stepAddLN, func() error {
				return cuda.Launch(m.fns.addLN, lnBlocks, warpRowThreads, &dX, &dProj, &oB, &oG, &oBeta, &nRows, &hL, &eps, &dX16, &prec)
			}},
		)
	}
	steps = append(steps, step{stepPool, func() error {
		return cuda.Launch(m.fns.pool, min(items, 65535), rowThreads, &dX, &dLens, &dOut, &nItems, &seqL, &hL, &mode)
	}})
	if c.Normalize {
		steps = append(steps, step{stepPool, func() error {
			return cuda.Launch(m.fns.norm, warpRowBlocks(items), warpRowThreads, &dOut, &nItems, &hL)
		}})
	}
	if err := m.profile.run(steps, cu.Synchronize); err != nil {
		return nil, 0, fmt.Errorf("%s: batch of %d items × %d tokens: %w", m.name, items, seqLen, err)
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
// with gpu.ErrClosed afterwards. Later calls do nothing. With
// VRAMQ_BERT_PROFILE=1 the first call logs the time the batches spent in
// each kind of step.
func (m *CUDAEncoder) Close() error {
	if !m.closed.Swap(true) && len(m.profile.counts()) > 0 {
		slog.Info("cuda bert: time by step, each waited for (VRAMQ_BERT_PROFILE=1)", "model", m.name, "steps", m.profile.String())
	}
	m.own.Stop()
	return nil
}
