package bert

import (
	"math"
	"runtime"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// activations are one batch's buffers: rows = batch × seqLen token rows,
// every item padded to seqLen. They are allocated once per batch and reused
// by every layer; WorkingBytes counts exactly these.
type activations struct {
	batch, seqLen int
	x             []float32 // [rows, h]: the hidden state
	qkv           []float32 // [rows, 3h]: queries, keys, values side by side
	scores        []float32 // [batch·heads, seqLen, seqLen]
	heads         []float32 // [batch·heads, 3, seqLen·headDim]: fma copies each head's Kᵀ into the first third of its block; sized as the CUDA encoder's split Q, K, V, which seqBytes bounds with these same floats
	ctx           []float32 // [rows, h]: attention output before its projection
	proj          []float32 // [rows, h]: a projection's output before the residual
	inter         []float32 // [rows, i]: the feed-forward layer's inner activations
	mask          []float32 // [batch, seqLen]: 0 for a token, -MaxFloat32 for padding
}

// activationFloats is how many float32 values activations hold for a
// batch of the given padded shape.
func (c Config) activationFloats(batch, seqLen int) int64 {
	b, l := int64(batch), int64(seqLen)
	rows := b * l
	h, in, heads := int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.NumHeads)
	return rows*h + rows*3*h + b*heads*l*l + rows*3*h + rows*h + rows*h + rows*in + rows
}

func newActivations(c Config, batch, seqLen int) *activations {
	rows := batch * seqLen
	h := c.HiddenSize
	// One allocation, carved up, so that what Embed asks of the allocator
	// is exactly what activationFloats counts.
	buf := make([]float32, c.activationFloats(batch, seqLen))
	take := func(n int) []float32 {
		s := buf[:n:n]
		buf = buf[n:]
		return s
	}
	return &activations{
		batch:  batch,
		seqLen: seqLen,
		x:      take(rows * h),
		qkv:    take(rows * 3 * h),
		scores: take(batch * c.NumHeads * seqLen * seqLen),
		heads:  take(rows * 3 * h),
		ctx:    take(rows * h),
		proj:   take(rows * h),
		inter:  take(rows * c.IntermediateSize),
		mask:   take(rows),
	}
}

// encode runs the encoder over ids (each item at most a.seqLen long,
// padded with token 0 past its end) and leaves the last hidden state in a.x.
func (m *Model) encode(a *activations, ids [][]int32) {
	c := m.cfg
	h := c.HiddenSize
	w := m.w

	// Embeddings: word + position + token type 0, then LayerNorm.
	for b, item := range ids {
		for p := range a.seqLen {
			row := a.x[(b*a.seqLen+p)*h:][:h]
			var id int32
			a.mask[b*a.seqLen+p] = -math.MaxFloat32
			if p < len(item) {
				id = item[p]
				a.mask[b*a.seqLen+p] = 0
			}
			word := w.word[int(id)*h:][:h]
			pos := w.pos[p*h:][:h]
			for j := range row {
				row[j] = word[j] + pos[j] + w.tokenType0[j]
			}
		}
	}
	rows := a.batch * a.seqLen
	layerNormRows(a.x, h, w.embLN, c.LayerNormEps)

	for _, lw := range w.layers {
		linear(a.qkv, a.x, lw.qkvW, lw.qkvB, rows, h, 3*h)
		m.attention(a)
		linear(a.proj, a.ctx, lw.attnOutW, lw.attnOutB, rows, h, h)
		addInto(a.x, a.proj)
		layerNormRows(a.x, h, lw.attnLN, c.LayerNormEps)

		linear(a.inter, a.x, lw.interW, lw.interB, rows, h, c.IntermediateSize)
		geluRows(a.inter, rows, c.IntermediateSize)
		linear(a.proj, a.inter, lw.outW, lw.outB, rows, c.IntermediateSize, h)
		addInto(a.x, a.proj)
		layerNormRows(a.x, h, lw.outLN, c.LayerNormEps)
	}
}

// attention computes, for each item and head, softmax(Q·Kᵀ/√d + mask)·V
// from a.qkv into a.ctx. With gonum, Q, K and V of a head are column
// blocks of a.qkv, read in place through the GEMM's leading dimension.
func (m *Model) attention(a *activations) {
	if backend == fmaGEMM {
		m.attentionFMA(a)
		return
	}
	c := m.cfg
	h, d, l := c.HiddenSize, c.HeadDim(), a.seqLen
	scale := float32(1 / math.Sqrt(float64(d)))
	// Each (item, head) has its own scores and writes its own columns of
	// ctx, so they run in parallel.
	parallelFor(a.batch*c.NumHeads, func(job int) {
		b, hd := job/c.NumHeads, job%c.NumHeads
		base := b * l * 3 * h
		mask := a.mask[b*l:][:l]
		s := a.scores[job*l*l:][: l*l : l*l]
		q := a.qkv[base+hd*d:]
		k := a.qkv[base+h+hd*d:]
		v := a.qkv[base+2*h+hd*d:]
		gemm(blas.NoTrans, blas.Trans, l, l, d, scale, q, 3*h, k, 3*h, 0, s, l)
		for i := range l {
			row := s[i*l:][:l]
			for j := range row {
				row[j] += mask[j]
			}
			softmax(row)
		}
		gemm(blas.NoTrans, blas.NoTrans, l, d, l, 1, s, l, v, 3*h, 0, a.ctx[b*l*h+hd*d:], h)
	})
}

// attentionFMA is attention with matMulAdd, which reads Q and V in place
// and writes each head's output into its columns of a.ctx through leading
// dimensions; only Kᵀ is copied out (into the head's block of a.heads).
func (m *Model) attentionFMA(a *activations) {
	c := m.cfg
	h, d, l := c.HiddenSize, c.HeadDim(), a.seqLen
	scale := float32(1 / math.Sqrt(float64(d)))
	parallelFor(a.batch*c.NumHeads, func(job int) {
		b, hd := job/c.NumHeads, job%c.NumHeads
		base := b * l * 3 * h
		kt := a.heads[job*3*l*d:][: l*d : l*d]
		for i := range l {
			for j, x := range a.qkv[base+i*3*h+h+hd*d:][:d] {
				kt[j*l+i] = x
			}
		}
		s := a.scores[job*l*l:][: l*l : l*l]
		clear(s)
		matMulAdd(s, l, a.qkv[base+hd*d:], 3*h, kt, l, l, l, d)
		maskedSoftmax(s, a.mask[b*l:][:l], scale)
		ctx := a.ctx[b*l*h+hd*d:]
		for i := range l {
			clear(ctx[i*h:][:d])
		}
		matMulAdd(ctx, h, s, l, a.qkv[base+2*h+hd*d:], 3*h, l, d, l)
	})
}

// parallelFor runs f(0) … f(n-1) on up to GOMAXPROCS goroutines, each
// taking a contiguous range of jobs, and returns when all are done.
func parallelFor(n int, f func(job int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for j := range n {
			f(j)
		}
		return
	}
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*n/workers, (w+1)*n/workers
		wg.Go(func() {
			for j := lo; j < hi; j++ {
				f(j)
			}
		})
	}
	wg.Wait()
}

// gemmBackend is what computes the matrix products.
type gemmBackend int

const (
	// gonumGEMM is gonum's Sgemm, in pure Go: the fallback everywhere.
	gonumGEMM gemmBackend = iota
	// fmaGEMM is matMulAdd's register-tiled AVX2+FMA kernel (gemm.go).
	fmaGEMM
)

// available says whether this machine can run g: the FMA kernel needs
// AVX2 and FMA.
func (g gemmBackend) available() bool {
	if g == fmaGEMM {
		return hasFMAKernel
	}
	return true
}

// backend is the fastest backend this machine has. Tests and benchmarks
// set it to run each.
var backend = func() gemmBackend {
	if fmaGEMM.available() {
		return fmaGEMM
	}
	return gonumGEMM
}()

// linear sets dst[rows, out] = x[rows, in] · w + bias, w being [in, out]
// (PyTorch's nn.Linear weight transposed).
func linear(dst, x, w, bias []float32, rows, in, out int) {
	dst = dst[: rows*out : rows*out]
	for r := range rows {
		copy(dst[r*out:][:out], bias)
	}
	if backend == fmaGEMM {
		matMulAddParallel(dst, out, x, in, w, out, rows, out, in)
		return
	}
	gemm(blas.NoTrans, blas.NoTrans, rows, out, in, 1, x, in, w, out, 1, dst, out)
}

// gemm is C = alpha·op(A)·op(B) + beta·C on row-major matrices whose
// slices may run past the last row (a head's columns inside a wider
// matrix): each is cut to the extent the leading dimension and shape need,
// which is what blas32's General descriptors would check.
func gemm(tA, tB blas.Transpose, m, n, k int, alpha float32,
	a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ar, ac := m, k
	if tA == blas.Trans {
		ar, ac = k, m
	}
	br, bc := k, n
	if tB == blas.Trans {
		br, bc = n, k
	}
	blas32.Implementation().Sgemm(tA, tB, m, n, k, alpha,
		a[:(ar-1)*lda+ac], lda, b[:(br-1)*ldb+bc], ldb, beta, c[:(m-1)*ldc+n], ldc)
}

func addInto(dst, src []float32) {
	for i, v := range src {
		dst[i] += v
	}
}

// layerNormRows normalizes each width-wide row of x in place. Mean and
// variance are accumulated in float64, which is at least as accurate as
// PyTorch's float32 kernels and keeps the result independent of width.
func layerNormRows(x []float32, width int, ln layerNorm, eps float64) {
	for r := 0; r < len(x); r += width {
		row := x[r : r+width]
		var sum float64
		for _, v := range row {
			sum += float64(v)
		}
		mean := sum / float64(width)
		var ss float64
		for _, v := range row {
			dv := float64(v) - mean
			ss += dv * dv
		}
		inv := 1 / math.Sqrt(ss/float64(width)+eps)
		for j, v := range row {
			row[j] = float32((float64(v)-mean)*inv)*ln.gamma[j] + ln.beta[j]
		}
	}
}

// geluRows applies gelu to the rows of x in parallel: with math.Erf it is
// the costliest step after the matrix products.
func geluRows(x []float32, rows, width int) {
	const chunk = 16 // rows per job
	parallelFor((rows+chunk-1)/chunk, func(job int) {
		lo, hi := job*chunk*width, min((job+1)*chunk, rows)*width
		gelu(x[lo:hi])
	})
}

// gelu applies GELU in its exact form, x·Φ(x) = x/2·(1 + erf(x/√2)), which
// is what Hugging Face's "gelu" is; the tanh approximation differs by up to
// about 1e-3 and is a different activation ("gelu_new"). Φ is float32's
// phif (mathf.go), eight lanes at a time where the CPU has AVX2 and FMA:
// math.Erf in float64 cost 18% of the encoder's time.
func gelu(xs []float32) {
	n := 0
	if hasVectorMath {
		n = geluVector(xs)
	}
	for i, x := range xs[n:] {
		xs[n+i] = x * phif(x)
	}
}

// maskedSoftmax turns each row of the scores s (rows of len(mask)) into
// attention weights: scaled by scale (1/√d), the additive mask added, then
// softmax.
func maskedSoftmax(s, mask []float32, scale float32) {
	l := len(mask)
	for i := 0; i+l <= len(s); i += l {
		row := s[i:][:l]
		for j := range row {
			row[j] = row[j]*scale + mask[j]
		}
		softmax(row)
	}
}

// softmax replaces row by its softmax. A masked entry (-MaxFloat32 added)
// becomes exactly 0, as long as one entry is not masked: every item has at
// least one token. The sum is kept in float64, so that its rounding does
// not grow with the row's length.
func softmax(row []float32) {
	mx := row[0]
	for _, v := range row[1:] {
		mx = max(mx, v)
	}
	n, sum := 0, 0.0
	if hasVectorMath {
		n, sum = expSubVector(row, row, mx)
	}
	for j, v := range row[n:] {
		e := expf(v - mx)
		row[n+j] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for j := range row {
		row[j] *= inv
	}
}

// What a matrix product allocates beyond its output, bounded generously
// (the figures measured are far smaller, see
// TestWorkingBytesBoundsAllocation). gonum's Sgemm splits a product into
// 64×64 blocks of the output and, from 4 blocks up, runs each in a
// goroutine; the FMA kernel's products run inside parallelFor calls. Each
// goroutine costs a closure and, when no finished one can be reused, the
// runtime's goroutine record; each call a WaitGroup and (gonum) a channel.
const (
	gemmBlock          = 64
	bytesPerGoroutine  = 1024
	bytesPerParallelOp = 1024
)

// gonumCallBytes bounds what one gonum Sgemm of an m×n output allocates.
func gonumCallBytes(m, n int) int64 {
	blocks := int64((m+gemmBlock-1)/gemmBlock) * int64((n+gemmBlock-1)/gemmBlock)
	if blocks < 4 {
		return 0
	}
	return bytesPerParallelOp + blocks*bytesPerGoroutine
}

// linearCallBytes bounds what one linear layer's product allocates, for
// either backend (matMulAddParallel's is one parallelFor).
func linearCallBytes(rows, in, out int) int64 {
	return max(gonumCallBytes(rows, out), parallelForBytes())
}

// attentionBytes bounds what one head's two products allocate, for either
// backend: gonum's Sgemm calls; the FMA kernel's matMulAdd allocates
// nothing (its parallelFor is counted once per layer).
func attentionBytes(seqLen, d int) int64 {
	return gonumCallBytes(seqLen, seqLen) + gonumCallBytes(seqLen, d)
}

// parallelForBytes bounds what one parallelFor call allocates.
func parallelForBytes() int64 {
	return bytesPerParallelOp + int64(max(runtime.NumCPU(), runtime.GOMAXPROCS(0)))*bytesPerGoroutine
}

// gemmOverhead bounds what the matrix products and parallel loops of one
// Embed call allocate.
func (c Config) gemmOverhead(batch, seqLen int) int64 {
	rows := batch * seqLen
	h, in := c.HiddenSize, c.IntermediateSize
	perLayer := linearCallBytes(rows, h, 3*h) + linearCallBytes(rows, h, h) +
		linearCallBytes(rows, h, in) + linearCallBytes(rows, in, h) +
		int64(batch*c.NumHeads)*attentionBytes(seqLen, c.HeadDim()) +
		2*parallelForBytes() // attention, GELU
	return int64(c.NumLayers) * perLayer
}
