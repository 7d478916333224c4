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
	// 754 binary16, rounds each product's other operand (the activations,
	// Q, K, V and the attention probabilities) to binary16 on the device,
	// and multiplies through cublasGemmEx on the tensor cores with float32
	// accumulation and a float32 result. Embeddings, biases, LayerNorm,
	// softmax, GELU and pooling stay float32, as PyTorch's autocast keeps
	// them.
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

// bertBuffers are the byte sizes of one batch's device buffers, in the
// order the CUDA encoder carves its one allocation: token ids, item
// lengths, the hidden state, the fused Q/K/V projection, the same split by
// head, the attention scores (items·heads·seqLen²; none with fused
// attention), the attention output, a projection's output, the
// feed-forward layer's inner activations, the pooled vectors, and in half
// precision the products' half-precision operands (halfOperands; 0 in
// float32).
func (c GPUConfig) bertBuffers(items, seqLen int) [11]int64 {
	b, l := int64(items), int64(seqLen)
	rows := b * l
	h, in, heads := int64(c.Hidden), int64(c.Intermediate), int64(c.Heads)
	scores := 4 * b * heads * l * l
	if c.Attention == GPUAttentionFused {
		scores = 0
	}
	var half int64
	if c.Precision != GPUFloat32 {
		qkv, other := c.halfOperands(items, seqLen)
		half = (2*qkv+gpuAlign-1)/gpuAlign*gpuAlign + 2*other // the other starts aligned, as cuBLAS prefers
	}
	return [11]int64{4 * rows, 4 * b, 4 * rows * h, 4 * rows * 3 * h, 4 * rows * 3 * h,
		scores, 4 * rows * h, 4 * rows * h, 4 * rows * in, 4 * b * h, half}
}

// HalfSeqBytes bounds what one sequence of at most seqLen tokens adds to a
// batch's half-precision operands: for any batch ≥ 1 padded to l ≤ seqLen,
// the half-precision buffer (bertBuffers' last) is at most batch ×
// HalfSeqBytes(seqLen), since each of its terms is linear in the batch and
// grows with the length, and its two alignments (under 2·gpuAlign) fall to
// a batch's first sequence. 0 in float32.
func (c GPUConfig) HalfSeqBytes(seqLen int) int64 {
	if c.Precision == GPUFloat32 || seqLen <= 0 {
		return 0
	}
	qkv, other := c.halfOperands(1, seqLen)
	return 2*(qkv+other) + 2*gpuAlign
}

// halfOperands is how many half-precision values the products' operands
// take: Q, K and V by head (qkv), which the scores and the attention output
// read, and beside them one other (the attention probabilities, or a
// projection's input: the hidden state, the attention output or the inner
// activations), the largest of those. Fused attention has no probabilities:
// the tiled kernel reads Q, K and V in half precision, the per-row one
// (heads wider than tiledAttentionMaxHead) in float32 (qkv 0).
func (c GPUConfig) halfOperands(items, seqLen int) (qkv, other int64) {
	b, l := int64(items), int64(seqLen)
	rows := b * l
	h, in, heads := int64(c.Hidden), int64(c.Intermediate), int64(c.Heads)
	if c.Attention == GPUAttentionFused {
		if c.tiledAttention() {
			return 3 * rows * h, max(rows*in, rows*h)
		}
		return 0, max(rows*in, rows*h)
	}
	return 3 * rows * h, max(b*heads*l*l, rows*in, rows*h)
}

// tiledAttentionMaxHead is the widest head bert_attention_tiled takes:
// each of its threads holds a query's components and its output's in
// registers, 2·64 floats.
const tiledAttentionMaxHead = 64

// tiledAttention says whether attention runs bert_attention_tiled: fused,
// with heads of at most tiledAttentionMaxHead components.
func (c GPUConfig) tiledAttention() bool {
	return c.Attention == GPUAttentionFused && c.Heads > 0 && c.Hidden/c.Heads <= tiledAttentionMaxHead
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
