package bert

import (
	"errors"
	"fmt"
	"strings"
)

// GPUPooling is how the CUDA BERT encoder turns token vectors into one
// vector per text (sentence-transformers' Pooling module). Its values are
// the ones bert_pool in kernels/bert.cu takes.
type GPUPooling int

const (
	GPUPoolMean GPUPooling = iota // the mean over the attended tokens
	GPUPoolCLS                    // the first token's vector
	GPUPoolMax                    // each dimension's maximum over the attended tokens
)

// GPUPrecision is the number format of the CUDA encoder's matrix products.
type GPUPrecision int

const (
	// GPUFloat32 multiplies in float32 (cublasSgemm): outputs agree with
	// the CPU encoder's to float32 rounding. The default.
	GPUFloat32 GPUPrecision = iota
	// GPUFloat16 stores the four weight matrices of each layer once in IEEE
	// 754 binary16 and multiplies through cublasGemmEx on the tensor cores
	// with float32 accumulation. Each product's other operand (the hidden
	// state, Q, K, V, the attention probabilities and output, the inner
	// activations) is written in binary16 by the kernel that computes it,
	// and a product whose consumer needs no more writes binary16 too (see
	// bertBuffers). The hidden state between layers (beside its binary16
	// copy), the scores and the sums before LayerNorm stay float32, and so
	// does the arithmetic of the embeddings, biases, LayerNorm, softmax,
	// GELU and pooling, as PyTorch's autocast keeps it.
	GPUFloat16
	// GPUBFloat16 is GPUFloat16 with bfloat16 (compute capability 8.0 and
	// up): float32's range, 8 bits of precision instead of 11.
	GPUBFloat16
)

// PrecisionOfWeights is the half precision a checkpoint stored in dtype
// (Model.WeightDType: "F16", "BF16", or several joined with "+") asks for:
// its own when every tensor has it, float32 otherwise. A model published
// in float16 was trained or exported for it; one in float32 keeps outputs
// that match the CPU encoder.
func PrecisionOfWeights(dtype string) GPUPrecision {
	switch dtype {
	case "F16":
		return GPUFloat16
	case "BF16":
		return GPUBFloat16
	}
	return GPUFloat32
}

// variantName is name with the encoder's choices that are not the
// defaults after an "@": "bert:m@float16", "bert:m@fused-attention",
// "bert:m@bfloat16+fused-attention"; name itself for float32 with GEMM
// attention.
func variantName(name string, c GPUConfig) string {
	var parts []string
	if c.Precision != GPUFloat32 {
		parts = append(parts, c.Precision.String())
	}
	if c.Attention == GPUAttentionFused {
		parts = append(parts, "fused-attention")
	}
	if len(parts) == 0 {
		return name
	}
	return name + "@" + strings.Join(parts, "+")
}

func (p GPUPrecision) String() string {
	switch p {
	case GPUFloat32:
		return "float32"
	case GPUFloat16:
		return "float16"
	case GPUBFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("precision %d", int(p))
}

// GPUAttention is how the CUDA encoder computes attention.
type GPUAttention int

const (
	// GPUAttentionGEMM is two strided-batched GEMMs around a softmax
	// kernel, through a buffer of items·heads·seqLen² scores. The default.
	GPUAttentionGEMM GPUAttention = iota
	// GPUAttentionFused is one kernel with an online softmax over tiles of
	// keys: no scores buffer, so a batch's memory grows with seqLen, not
	// its square (CUDAWorkingBytes says so). Heads of up to
	// tiledAttentionMaxHead components run bert_attention_tiled (queries
	// tiled too; Q, K and V read in the products' precision, the softmax
	// and the sums in float32), wider ones bert_attention (one block per
	// query, float32).
	GPUAttentionFused
)

// GPUConfig is the shape of a BERT encoder and how its output is pooled,
// as the CUDA backend needs it (model/bert reads it from a model directory).
type GPUConfig struct {
	Vocab, Hidden, Layers, Heads, Intermediate, MaxPositions int
	LayerNormEps                                             float64
	Pooling                                                  GPUPooling
	Normalize                                                bool
	// MaxSeqLength is the longest item in tokens, [CLS] and [SEP] included.
	MaxSeqLength int
	// Precision is the matrix products' number format; the zero value is
	// float32.
	Precision GPUPrecision
	// Attention is how attention is computed; the zero value is GEMMs.
	Attention GPUAttention

	// rowAttention holds fused attention to the per-row kernel whatever the
	// head width (tests only: they check and time the tiled kernel against
	// it), so that the buffers follow the kernel that runs.
	rowAttention bool
}

// GPULayerWeights are one encoder layer's parameters in float32. Linear
// weights are [in, out] row-major (PyTorch's [out, in] transposed); the
// query, key and value projections are side by side in one [h, 3h] matrix.
type GPULayerWeights struct {
	QKVW, QKVB                 []float32
	AttnOutW, AttnOutB         []float32
	AttnLNGamma, AttnLNBeta    []float32
	InterW, InterB, OutW, OutB []float32
	OutLNGamma, OutLNBeta      []float32
}

// GPUWeights are a BERT encoder's parameters in float32 (half-precision
// checkpoints widened on load). TokenType0 is row 0 of the token-type
// table, the only one a sentence encoder uses.
type GPUWeights struct {
	Word, Pos, TokenType0 []float32
	EmbLNGamma, EmbLNBeta []float32
	Layers                []GPULayerWeights
}

// Validate checks that the shape is one the CUDA encoder runs: the kernels'
// block reductions need the hidden width to fit one block's reduction.
func (c GPUConfig) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"vocab", c.Vocab}, {"hidden", c.Hidden}, {"layers", c.Layers}, {"heads", c.Heads},
		{"intermediate", c.Intermediate}, {"max positions", c.MaxPositions}, {"max sequence length", c.MaxSeqLength}} {
		if f.v < 1 || f.v > 1<<20 {
			errs = append(errs, fmt.Errorf("%s: %d, want 1 to %d", f.name, f.v, 1<<20))
		}
	}
	if c.Heads > 0 && c.Hidden%c.Heads != 0 {
		errs = append(errs, fmt.Errorf("hidden %d is not a multiple of heads %d", c.Hidden, c.Heads))
	}
	if c.MaxSeqLength > c.MaxPositions {
		errs = append(errs, fmt.Errorf("max sequence length %d exceeds the %d position embeddings", c.MaxSeqLength, c.MaxPositions))
	}
	if !(c.LayerNormEps > 0 && c.LayerNormEps < 1) {
		errs = append(errs, fmt.Errorf("layer norm eps %g, want in (0, 1)", c.LayerNormEps))
	}
	if c.Pooling < GPUPoolMean || c.Pooling > GPUPoolMax {
		errs = append(errs, fmt.Errorf("pooling %d unknown", c.Pooling))
	}
	if c.Precision < GPUFloat32 || c.Precision > GPUBFloat16 {
		errs = append(errs, fmt.Errorf("%v unknown", c.Precision))
	}
	if c.Attention < GPUAttentionGEMM || c.Attention > GPUAttentionFused {
		errs = append(errs, fmt.Errorf("attention %d unknown", c.Attention))
	}
	if c.Attention == GPUAttentionFused && c.Heads > 0 && c.Hidden/c.Heads > 1024 {
		errs = append(errs, fmt.Errorf("fused attention: head width %d over 1024 (one thread per component)", c.Hidden/c.Heads))
	}
	return errors.Join(errs...)
}

// CheckShape reports the first tensor whose length differs from what c
// says, or nil.
func (w *GPUWeights) CheckShape(c GPUConfig) error {
	h, in := c.Hidden, c.Intermediate
	if len(w.Layers) != c.Layers {
		return fmt.Errorf("bert weights: %d layers, config says %d", len(w.Layers), c.Layers)
	}
	type t struct {
		name string
		v    []float32
		n    int
	}
	all := []t{{"word", w.Word, c.Vocab * h}, {"pos", w.Pos, c.MaxPositions * h}, {"token type 0", w.TokenType0, h},
		{"embedding LayerNorm gamma", w.EmbLNGamma, h}, {"embedding LayerNorm beta", w.EmbLNBeta, h}}
	for i, l := range w.Layers {
		p := fmt.Sprintf("layer %d ", i)
		all = append(all, t{p + "qkv weight", l.QKVW, h * 3 * h}, t{p + "qkv bias", l.QKVB, 3 * h},
			t{p + "attention output weight", l.AttnOutW, h * h}, t{p + "attention output bias", l.AttnOutB, h},
			t{p + "attention LayerNorm gamma", l.AttnLNGamma, h}, t{p + "attention LayerNorm beta", l.AttnLNBeta, h},
			t{p + "intermediate weight", l.InterW, h * in}, t{p + "intermediate bias", l.InterB, in},
			t{p + "output weight", l.OutW, in * h}, t{p + "output bias", l.OutB, h},
			t{p + "output LayerNorm gamma", l.OutLNGamma, h}, t{p + "output LayerNorm beta", l.OutLNBeta, h})
	}
	for _, x := range all {
		if len(x.v) != x.n {
			return fmt.Errorf("bert weights: %s has %d values, want %d", x.name, len(x.v), x.n)
		}
	}
	return nil
}

// tensors lists every weight slice in upload order.
func (w *GPUWeights) tensors() [][]float32 {
	all := [][]float32{w.Word, w.Pos, w.TokenType0, w.EmbLNGamma, w.EmbLNBeta}
	for _, l := range w.Layers {
		all = append(all, l.QKVW, l.QKVB, l.AttnOutW, l.AttnOutB, l.AttnLNGamma, l.AttnLNBeta,
			l.InterW, l.InterB, l.OutW, l.OutB, l.OutLNGamma, l.OutLNBeta)
	}
	return all
}

// Bytes is the device memory the weights take as float32.
func (w *GPUWeights) Bytes() int64 { return w.BytesAt(GPUFloat32) }

// BytesAt is the device memory the weights take at precision p: in half
// precision the layers' four weight matrices take 2 bytes a value, the
// rest 4.
func (w *GPUWeights) BytesAt(p GPUPrecision) int64 {
	var n int64
	for i, t := range w.tensors() {
		n += halfWidth(p, i) * int64(len(t))
	}
	return n
}

// halfWidth is the bytes a value of tensor i (in tensors' order) takes at
// precision p.
func halfWidth(p GPUPrecision, i int) int64 {
	if p != GPUFloat32 && isGemmWeight(i) {
		return 2
	}
	return 4
}

// isGemmWeight says whether tensor i (in tensors' order: five embedding
// tensors, then twelve per layer) is a matrix a GEMM reads: the Q/K/V,
// attention output, intermediate and output weights.
func isGemmWeight(i int) bool {
	if i < 5 {
		return false
	}
	switch (i - 5) % 12 {
	case 0, 2, 6, 8:
		return true
	}
	return false
}

// gpuAlign is the alignment of each buffer inside a batch's one
// allocation: cuMemAlloc's own, so every buffer is as aligned as if
// allocated alone.
const gpuAlign = 256

// The buffers of one batch, in the order the CUDA encoder carves its one
// allocation (bertBuffers gives their sizes; a buffer a configuration does
// not use is 0 bytes).
const (
	bufIDs     = iota // token ids
	bufLens           // item lengths
	bufX              // the hidden state, float32: the residual sums and LayerNorm read it
	bufQKV            // the fused Q/K/V projection, float32
	bufHeads          // Q, K and V by head in float32, or the attention's float32 output
	bufScores         // the attention scores, items·heads·seqLen² (GEMM attention)
	bufCtx            // the attention output by token, float32
	bufProj           // a projection's output before the residual sum, float32
	bufInter          // the feed-forward layer's inner activations, float32
	bufOut            // the pooled vectors
	bufX16            // the hidden state in half precision: the QKV and intermediate GEMMs' operand
	bufQKV16          // the fused Q/K/V projection as its half-precision GEMM leaves it
	bufHeads16        // Q, K and V by head in half precision (the scores' and the tiled kernel's operands)
	bufP16            // the attention probabilities in half precision (P·V's operand)
	bufCtx16          // the attention output by token in half precision (the output projection's operand)
	bufInter16        // the inner activations in half precision, GELU applied in place (the last GEMM's operand)
	nBuffers
)

// bertBuffers are the byte sizes of one batch's device buffers, indexed
// by the buf constants.
//
// In float32 every activation is float32. In half precision each GEMM reads
// its activation operand in half precision, written so by the kernel that
// produces it, and writes half precision where its consumer needs no more:
// the Q/K/V projection (split adds its bias in float32), P·V (into Q's
// half-precision place, Q being spent) and the intermediate GEMM (GELU works
// in place). What stays float32: the hidden state (bufX; its half copy
// bufX16 beside it) for the residual sums and LayerNorm; the scores, which
// softmax reads; the projections before a residual sum (bufProj); and the
// fused kernels' outputs. Per-row fused attention (heads wider than
// tiledAttentionMaxHead) reads Q, K and V in float32 (bufHeads).
func (c GPUConfig) bertBuffers(items, seqLen int) [nBuffers]int64 {
	b, l := int64(items), int64(seqLen)
	rows := b * l
	h, in, heads := int64(c.Hidden), int64(c.Intermediate), int64(c.Heads)
	var s [nBuffers]int64
	s[bufIDs], s[bufLens], s[bufX], s[bufProj], s[bufOut] = 4*rows, 4*b, 4*rows*h, 4*rows*h, 4*b*h
	gemmAttn := c.Attention != GPUAttentionFused
	if gemmAttn {
		s[bufScores] = 4 * b * heads * l * l
	}
	if c.Precision == GPUFloat32 {
		s[bufQKV], s[bufHeads], s[bufCtx], s[bufInter] = 4*rows*3*h, 4*rows*3*h, 4*rows*h, 4*rows*in
		return s
	}
	s[bufX16], s[bufQKV16], s[bufCtx16], s[bufInter16] = 2*rows*h, 2*rows*3*h, 2*rows*h, 2*rows*in
	switch {
	case gemmAttn:
		s[bufHeads16], s[bufP16] = 2*rows*3*h, 2*b*heads*l*l
	case c.tiledAttention():
		s[bufHeads16], s[bufHeads] = 2*rows*3*h, 4*rows*h
	default:
		s[bufHeads] = 4 * rows * 3 * h
	}
	return s
}

// HalfSeqBytes bounds what one sequence of at most seqLen tokens adds to a
// batch in half precision over the same batch in float32: for any batch ≥ 1
// padded to l ≤ seqLen, CUDAWorkingBytes(batch, l) is at most the float32
// configuration's plus batch × HalfSeqBytes(seqLen). Half precision mostly
// holds less (half-width copies replace float32 buffers), so this is 0 but
// where the half-precision probabilities (2 bytes a score, beside the
// float32 scores) outgrow what the narrower activations save. It holds
// because each buffer is linear in the batch, the difference per sequence
// is convex in the length (so its largest over 1..seqLen is at an end),
// and the buffers' alignments (under gpuAlign each) fall to a batch's
// first sequence. 0 in float32.
func (c GPUConfig) HalfSeqBytes(seqLen int) int64 {
	if c.Precision == GPUFloat32 || seqLen <= 0 {
		return 0
	}
	f32 := c
	f32.Precision = GPUFloat32
	more := func(l int) int64 { return sumOf(c.bertBuffers(1, l)) - sumOf(f32.bertBuffers(1, l)) }
	return max(0, max(more(1), more(seqLen))+nBuffers*gpuAlign)
}

func sumOf(sizes [nBuffers]int64) int64 {
	var n int64
	for _, b := range sizes {
		n += b
	}
	return n
}

// tiledAttentionMaxHead is the widest head bert_attention_tiled takes:
// each of its threads holds a query's components and its output's in
// registers, 2·64 floats.
const tiledAttentionMaxHead = 64

// tiledAttention says whether attention runs bert_attention_tiled: fused,
// with heads of at most tiledAttentionMaxHead components.
func (c GPUConfig) tiledAttention() bool {
	return c.Attention == GPUAttentionFused && !c.rowAttention && c.Heads > 0 && c.Hidden/c.Heads <= tiledAttentionMaxHead
}

// CUDAWorkingBytes is the device memory the CUDA encoder allocates for a
// batch of items padded to seqLen tokens: exactly its one allocation, each
// buffer rounded up to gpuAlign. The driver's own rounding of that
// allocation (2 MiB granules on the emulator) comes on top.
func (c GPUConfig) CUDAWorkingBytes(items, seqLen int) int64 {
	if items <= 0 || seqLen <= 0 {
		return 0
	}
	var n int64
	for _, b := range c.bertBuffers(items, seqLen) {
		n += (b + gpuAlign - 1) / gpuAlign * gpuAlign
	}
	return n
}
