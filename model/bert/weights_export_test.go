package bert

import (
	"path/filepath"
	"testing"
)

// GPU hands over the model's own shape, pooling and weights: every golden
// directory's export is a valid CUDA config whose tensors are the loaded
// ones, and each pooling maps to its CUDA counterpart.
func TestGPUExport(t *testing.T) {
	for _, dir := range goldenDirs(t) {
		m, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		cfg, w := m.GPU()
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
		c := m.Config()
		if cfg.Hidden != c.HiddenSize || cfg.Layers != c.NumLayers || cfg.Heads != c.NumHeads || cfg.Vocab != c.VocabSize ||
			cfg.Intermediate != c.IntermediateSize || cfg.MaxSeqLength != m.MaxSeqLength() || cfg.LayerNormEps != c.LayerNormEps {
			t.Errorf("%s: exported %+v for %+v", dir, cfg, c)
		}
		if err := w.CheckShape(cfg); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
		short := *w
		short.Layers = append([]GPULayerWeights(nil), w.Layers...)
		short.Layers[1].InterB = short.Layers[1].InterB[1:]
		if err := short.CheckShape(cfg); err == nil {
			t.Errorf("%s: a bias one value short passed CheckShape", dir)
		}
		if got, want := w.Bytes(), m.WeightBytes(); got != want {
			t.Errorf("%s: exported weights hold %d bytes, the model %d", filepath.Base(dir), got, want)
		}
		if &w.Layers[0].QKVW[0] != &m.w.layers[0].qkvW[0] {
			t.Errorf("%s: the export copied the weights", dir)
		}
		for p, want := range map[Pooling]GPUPooling{PoolMean: GPUPoolMean, PoolCLS: GPUPoolCLS, PoolMax: GPUPoolMax} {
			s := m.Sentence()
			s.Pooling, s.Normalize = p, !s.Normalize
			got, _ := m.WithSentence(s).GPU()
			if got.Pooling != want || got.Normalize != s.Normalize {
				t.Errorf("%s: pooling %v normalize %v exported as %v, %v", dir, p, s.Normalize, got.Pooling, got.Normalize)
			}
		}
	}
}
