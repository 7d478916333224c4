package bert

import (
	"strings"
	"testing"
)

func TestBertConfigValidate(t *testing.T) {
	good := GPUConfig{Vocab: 512, Hidden: 64, Layers: 2, Heads: 4, Intermediate: 128, MaxPositions: 128,
		LayerNormEps: 1e-12, MaxSeqLength: 128}
	if err := good.Validate(); err != nil {
		t.Fatalf("a valid config: %v", err)
	}
	for name, tc := range map[string]struct {
		edit func(*GPUConfig)
		want string
	}{
		"heads not dividing hidden": {func(c *GPUConfig) { c.Heads = 5 }, "not a multiple"},
		"sequence past positions":   {func(c *GPUConfig) { c.MaxSeqLength = 129 }, "exceeds the 128 position"},
		"no layers":                 {func(c *GPUConfig) { c.Layers = 0 }, "layers: 0"},
		"eps zero":                  {func(c *GPUConfig) { c.LayerNormEps = 0 }, "eps"},
		"unknown pooling":           {func(c *GPUConfig) { c.Pooling = 3 }, "pooling 3"},
	} {
		c := good
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one mentioning %q", name, err, tc.want)
		}
	}
}

// The estimate is the batch's buffers, each rounded to gpuAlign: the
// attention scores make it grow with the square of the length.
func TestCUDAWorkingBytesShape(t *testing.T) {
	c := GPUConfig{Vocab: 30522, Hidden: 384, Layers: 6, Heads: 12, Intermediate: 1536, MaxPositions: 512,
		LayerNormEps: 1e-12, MaxSeqLength: 512}
	if got := c.CUDAWorkingBytes(0, 10); got != 0 {
		t.Errorf("no items: %d bytes", got)
	}
	one := c.CUDAWorkingBytes(1, 128)
	// 128 rows: ids, x, qkv, heads, ctx, proj, inter; 12 heads × 128² scores;
	// one length; one pooled vector; each buffer rounded up to 256 bytes.
	rows := int64(128)
	want := 4*rows + 256 + 4*rows*384*(1+3+3+1+1) + 4*rows*1536 + 4*12*128*128 + 4*384
	if one != want {
		t.Errorf("1 × 128: %d bytes, want %d", one, want)
	}
	// Doubling the length adds 2048 rows (ids, five h-wide buffers, the
	// inner activations) and quadruples the scores.
	short, long := c.CUDAWorkingBytes(8, 256), c.CUDAWorkingBytes(8, 512)
	perRow := int64(4 * (1 + 9*384 + 1536))
	if got, want := long-short, 8*256*perRow+4*8*12*(512*512-256*256); got != want {
		t.Errorf("8 items, 256 → 512 tokens: %d more bytes, want %d", got, want)
	}
}

// In half precision the estimate is the half-precision operands beside the
// float32 hidden state, projection output and scores, with no float32 copy
// of what a GEMM reads or writes in half: less than float32 wherever the
// scores do not dominate, and HalfSeqBytes (what Cost adds per sequence)
// 0 there.
func TestCUDAWorkingBytesHalfShape(t *testing.T) {
	c := GPUConfig{Vocab: 30522, Hidden: 384, Layers: 6, Heads: 12, Intermediate: 1536, MaxPositions: 512,
		LayerNormEps: 1e-12, MaxSeqLength: 512, Precision: GPUFloat16}
	// 128 rows: ids; x and proj in float32; x, the Q/K/V projection, Q/K/V
	// by head, the attention output and the inner activations in binary16;
	// 12 heads × 128² scores in float32 and probabilities in binary16; one
	// length; one pooled vector; each buffer rounded up to 256 bytes.
	rows, h, in := int64(128), int64(384), int64(1536)
	want := 4*rows + 256 + 4*rows*h*2 + 2*rows*h*(1+3+3+1) + 2*rows*in + (4+2)*12*128*128 + 4*h
	if got := c.CUDAWorkingBytes(1, 128); got != want {
		t.Errorf("float16, 1 × 128: %d bytes, want %d", got, want)
	}
	f32 := c
	f32.Precision = GPUFloat32
	for _, attn := range []GPUAttention{GPUAttentionGEMM, GPUAttentionFused} {
		c.Attention, f32.Attention = attn, attn
		for _, l := range []int{1, 32, 128, 512} {
			half, single := c.CUDAWorkingBytes(64, l), f32.CUDAWorkingBytes(64, l)
			if holdsLess := attn == GPUAttentionFused || l <= 128; holdsLess && half >= single {
				t.Errorf("attention %d, 64 × %d: float16 %d bytes, float32 %d: not less", attn, l, half, single)
			}
			if hs := c.HalfSeqBytes(l); (half < single) != (hs == 0) && l > 1 {
				t.Errorf("attention %d, 64 × %d: float16 %d bytes against float32's %d, HalfSeqBytes %d", attn, l, half, single, hs)
			}
		}
	}
}

// With fused attention a batch's memory grows with its length, not its
// square: twice the length takes at most twice the bytes (and the
// buffers' alignment), where the GEMM path's scores take four times.
func TestCUDAWorkingBytesFusedIsLinearInLength(t *testing.T) {
	c := GPUConfig{Vocab: 30522, Hidden: 384, Layers: 6, Heads: 12, Intermediate: 1536, MaxPositions: 512,
		LayerNormEps: 1e-12, MaxSeqLength: 512}
	for _, p := range []GPUPrecision{GPUFloat32, GPUFloat16} {
		c.Precision = p
		for _, l := range []int{16, 64, 256} {
			c.Attention = GPUAttentionFused
			short, long := c.CUDAWorkingBytes(32, l), c.CUDAWorkingBytes(32, 2*l)
			if long > 2*short+int64(len(c.bertBuffers(1, 1)))*gpuAlign {
				t.Errorf("%v, fused: %d items × %d tokens take %d bytes, × %d tokens %d: more than twice", p, 32, l, short, 2*l, long)
			}
			c.Attention = GPUAttentionGEMM
			if gemm := c.CUDAWorkingBytes(32, 2*l); l == 256 && gemm <= long*3/2 {
				t.Errorf("%v: the GEMM path's %d bytes at 32 × %d are not well over fused attention's %d: the test shows nothing", p, gemm, 2*l, long)
			}
		}
	}
}

// Fused attention runs the query-tiled kernel for heads of up to 64
// components (MiniLM's 32, BERT-base's 64), the per-row one for wider
// heads; GEMM attention runs neither. In half precision the tiled kernel's
// Q, K and V halves are charged, the per-row kernel's float32 reads not.
func TestTiledAttentionByHeadWidth(t *testing.T) {
	for _, tc := range []struct {
		hidden, heads int
		attn          GPUAttention
		tiled         bool
	}{{64, 4, GPUAttentionFused, true}, {384, 12, GPUAttentionFused, true}, {768, 12, GPUAttentionFused, true},
		{780, 12, GPUAttentionFused, false}, {1024, 8, GPUAttentionFused, false}, {768, 12, GPUAttentionGEMM, false}} {
		c := GPUConfig{Hidden: tc.hidden, Heads: tc.heads, Intermediate: 4 * tc.hidden, Attention: tc.attn, Precision: GPUFloat16}
		if got := c.tiledAttention(); got != tc.tiled {
			t.Errorf("hidden %d, %d heads, attention %d: tiled %v, want %v", tc.hidden, tc.heads, tc.attn, got, tc.tiled)
		}
		qkv := c.bertBuffers(2, 10)[bufHeads16]
		if want := int64(2 * 3 * 2 * 10 * tc.hidden); tc.attn == GPUAttentionFused && (qkv == want) != tc.tiled {
			t.Errorf("hidden %d, %d heads, fused: %d bytes of Q, K and V halves charged, tiled %v", tc.hidden, tc.heads, qkv, tc.tiled)
		}
	}
}

func TestPrecisionOfWeights(t *testing.T) {
	for dtype, want := range map[string]GPUPrecision{"F16": GPUFloat16, "BF16": GPUBFloat16, "F32": GPUFloat32,
		"F16+F32": GPUFloat32, "BF16+F16": GPUFloat32, "": GPUFloat32} {
		if got := PrecisionOfWeights(dtype); got != want {
			t.Errorf("PrecisionOfWeights(%q) = %v, want %v", dtype, got, want)
		}
	}
}

func TestVariantName(t *testing.T) {
	for _, c := range []struct {
		p    GPUPrecision
		a    GPUAttention
		want string
	}{{GPUFloat32, GPUAttentionGEMM, "bert:m"}, {GPUFloat16, GPUAttentionGEMM, "bert:m@float16"},
		{GPUFloat32, GPUAttentionFused, "bert:m@fused-attention"}, {GPUBFloat16, GPUAttentionFused, "bert:m@bfloat16+fused-attention"}} {
		if got := variantName("bert:m", GPUConfig{Precision: c.p, Attention: c.a}); got != c.want {
			t.Errorf("%v, attention %d: %q, want %q", c.p, c.a, got, c.want)
		}
	}
}

// HalfSeqBytes is what Cost adds per sequence in half precision over the
// float32 bound: for any batch padded to any length up to seqLen, with
// either attention, the half-precision allocation is at most the float32
// one plus the batch times HalfSeqBytes(seqLen).
func TestHalfSeqBytesBoundsWhatHalfAdds(t *testing.T) {
	for _, c := range []Config{miniLM, paddingConfig, {VocabSize: 512, HiddenSize: 8, NumLayers: 1, NumHeads: 8,
		IntermediateSize: 8, MaxPositionEmbeddings: 512, LayerNormEps: 1e-12}} {
		for _, p := range []GPUPrecision{GPUFloat16, GPUBFloat16} {
			for _, a := range []GPUAttention{GPUAttentionGEMM, GPUAttentionFused} {
				g := GPUConfig{Vocab: c.VocabSize, Hidden: c.HiddenSize, Layers: c.NumLayers, Heads: c.NumHeads,
					Intermediate: c.IntermediateSize, MaxPositions: c.MaxPositionEmbeddings, LayerNormEps: c.LayerNormEps,
					MaxSeqLength: c.MaxPositionEmbeddings, Precision: p, Attention: a}
				f32 := g
				f32.Precision = GPUFloat32
				for _, top := range []int{1, 2, 17, 64, 128, 300, 512} {
					per := g.HalfSeqBytes(top)
					for _, l := range []int{1, 2, top / 2, top - 1, top} {
						for _, n := range []int{1, 2, 3, 7, 64} {
							if l < 1 || l > top {
								continue
							}
							if half, single := g.CUDAWorkingBytes(n, l), f32.CUDAWorkingBytes(n, l); half > single+int64(n)*per {
								t.Fatalf("hidden %d, %v, attention %d: %d × %d tokens take %d bytes, over float32's %d + %d × HalfSeqBytes(%d) = %d",
									c.HiddenSize, p, a, n, l, half, single, n, top, per)
							}
						}
					}
				}
			}
		}
	}
}
