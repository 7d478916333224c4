package bert

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomModel builds a model of cfg with weights at the scale of
// golden/onnx's generator (linear layers N(0, 1/fan_in), biases and
// LayerNorm shifts N(0, 0.1²), scales 1 + N(0, 0.1²)), in memory, for the
// tests and benchmarks that need shapes the committed models do not have.
func randomModel(cfg Config, seed uint64) *Model {
	r := rand.New(rand.NewPCG(seed, 1))
	fill := func(n int, f func() float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(f())
		}
		return v
	}
	normal := func(s float64) func() float64 { return func() float64 { return r.NormFloat64() * s } }
	one := func() float64 { return 1 + r.NormFloat64()*0.1 }
	h, in := cfg.HiddenSize, cfg.IntermediateSize
	ln := func() layerNorm { return layerNorm{gamma: fill(h, one), beta: fill(h, normal(0.1))} }
	w := &weights{
		word:        fill(cfg.VocabSize*h, normal(0.5)),
		pos:         fill(cfg.MaxPositionEmbeddings*h, normal(0.2)),
		tokenType0:  fill(h, normal(0.2)),
		embLN:       ln(),
		sourceDType: "F32",
	}
	for range cfg.NumLayers {
		w.layers = append(w.layers, layerWeights{
			qkvW:     fill(3*h*h, normal(1/sqrt(h))),
			qkvB:     fill(3*h, normal(0.1)),
			attnOutW: fill(h*h, normal(1/sqrt(h))),
			attnOutB: fill(h, normal(0.1)),
			attnLN:   ln(),
			interW:   fill(in*h, normal(1/sqrt(h))),
			interB:   fill(in, normal(0.1)),
			outW:     fill(h*in, normal(1/sqrt(in))),
			outB:     fill(h, normal(0.1)),
			outLN:    ln(),
		})
	}
	return &Model{cfg: cfg, sentence: Sentence{Pooling: PoolMean, Normalize: true, MaxSeqLength: cfg.MaxPositionEmbeddings}, w: w}
}

func sqrt(n int) float64 { return math.Sqrt(float64(n)) }

// miniLM is the shape of all-MiniLM-L6-v2.
var miniLM = Config{
	VocabSize: 30522, HiddenSize: 384, NumLayers: 6, NumHeads: 12,
	IntermediateSize: 1536, MaxPositionEmbeddings: 512, TypeVocabSize: 2, LayerNormEps: 1e-12,
}

// randomIDs is batch items of the given lengths, [CLS] … [SEP] with ids
// drawn from the vocabulary.
func randomIDs(r *rand.Rand, vocab int, lengths ...int) [][]int32 {
	out := make([][]int32, len(lengths))
	for i, n := range lengths {
		item := make([]int32, n)
		for j := range item {
			item[j] = int32(r.IntN(vocab))
		}
		out[i] = item
	}
	return slices.Clip(out)
}

// backends runs f once per matrix-product backend this machine has: gonum
// always, the FMA kernel where it has AVX2 and FMA.
func backends(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	saved := backend
	t.Cleanup(func() { backend = saved })
	for _, g := range []gemmBackend{gonumGEMM, fmaGEMM} {
		if !g.available() {
			t.Logf("%v: no AVX2+FMA here, it does not run", g)
			continue
		}
		backend = g
		t.Run(g.String(), f)
	}
	backend = saved
}
