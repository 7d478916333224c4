package bert

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// The golden files hold ONNX Runtime's outputs (golden/onnx/gen.mjs) for
// the weights of each model directory under testdata/model.

type goldenFile struct {
	Oracle  string `json:"oracle"`
	Batches []struct {
		IDs     [][]int32              `json:"ids"`
		Outputs map[string][][]float32 `json:"outputs"`
	} `json:"batches"`
}

func readGolden(t *testing.T, dir string) goldenFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Batches) == 0 {
		t.Fatalf("%s: no batches", dir)
	}
	return g
}

// goldenTolerance is the largest absolute difference allowed between an
// element of a vector here and ONNX Runtime's. Unnormalized vectors have
// elements of about 1 (LayerNorm's output), normalized ones about
// 1/sqrt(64); both are compared with this bound.
//
// Measured (TestGoldenONNX -v): the largest difference over all 312
// comparisons (6 outputs × 13 items, in their batch and alone, × 2 models)
// is 1.3e-6 (F32) and 1.7e-6 (F16), with either matrix-product backend.
// Mutations, each against this bound:
// GELU's tanh approximation in place of erf fails all 312, by 1.9e-5 to
// 7.0e-4; scores without the 1/sqrt(d) scale fail 288, by up to 2.1 (the
// 24 that pass are the one-token items, whose softmax is 1 whatever the
// scale).
const goldenTolerance = 1e-5

func maxAbsDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		e := math.Abs(float64(a[i]) - float64(b[i]))
		if !(e <= d) {
			d = e // NaN counts as the worst
		}
	}
	return d
}

// For the external tests of this directory (cuda_encoder_test.go, package
// bert_test), which read the same golden files.
var (
	ReadGolden = readGolden
	MaxAbsDiff = maxAbsDiff
)

// goldenModes are the outputs of a golden file and the Sentence settings
// that give them.
var goldenModes = []struct {
	key       string
	pooling   Pooling
	normalize bool
}{
	{"mean", PoolMean, false}, {"cls", PoolCLS, false}, {"max", PoolMax, false},
	{"mean_norm", PoolMean, true}, {"cls_norm", PoolCLS, true}, {"max_norm", PoolMax, true},
}

func goldenDirs(t *testing.T) []string {
	dirs, err := filepath.Glob("testdata/model/*")
	if err != nil || len(dirs) < 2 {
		t.Fatalf("testdata/model: %v, %v", dirs, err)
	}
	return dirs
}

// TestGoldenONNX compares Embed, for every pooling with and without
// normalization, with ONNX Runtime's outputs on the same weights: each
// batch as the oracle ran it, padded, and each of its items alone.
func TestGoldenONNX(t *testing.T) {
	backends(t, func(t *testing.T) { testGoldenONNX(t) })
}

func testGoldenONNX(t *testing.T) {
	for _, dir := range goldenDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			g := readGolden(t, dir)
			m, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for _, mode := range goldenModes {
				mm := *m
				mm.sentence.Pooling, mm.sentence.Normalize = mode.pooling, mode.normalize
				for bi, batch := range g.Batches {
					want := batch.Outputs[mode.key]
					if len(want) != len(batch.IDs) {
						t.Fatalf("batch %d: %d %s outputs for %d items", bi, len(want), mode.key, len(batch.IDs))
					}
					got, err := mm.Embed(batch.IDs)
					if err != nil {
						t.Fatal(err)
					}
					for i := range want {
						d := maxAbsDiff(got[i], want[i])
						worst = max(worst, d)
						if d > goldenTolerance {
							t.Errorf("%s, batch %d, item %d (%d tokens): differs from ONNX Runtime by %.3g (tolerance %g)", mode.key, bi, i,
								len(batch.IDs[i]), d, goldenTolerance)
						}
						alone, err := mm.Embed(batch.IDs[i : i+1])
						if err != nil {
							t.Fatal(err)
						}
						if d := maxAbsDiff(alone[0], want[i]); d > goldenTolerance {
							t.Errorf("%s, batch %d, item %d alone: differs from ONNX Runtime by %.3g (tolerance %g)", mode.key, bi, i, d, goldenTolerance)
						}
					}
				}
			}
			t.Logf("%s (%s weights), against %s: largest difference %.3g", dir, m.WeightDType(), g.Oracle, worst)
		})
	}
}

// TestGoldenConfiguredPooling checks that each directory's own
// sentence-transformers files select the pooling the golden file holds.
func TestGoldenConfiguredPooling(t *testing.T) {
	want := map[string]string{"tiny-f32": "mean_norm", "tiny-f16": "cls"}
	for _, dir := range goldenDirs(t) {
		key, ok := want[filepath.Base(dir)]
		if !ok {
			t.Fatalf("%s: no expectation", dir)
		}
		g := readGolden(t, dir)
		m, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		for bi, batch := range g.Batches {
			got, err := m.Embed(batch.IDs)
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if d := maxAbsDiff(got[i], batch.Outputs[key][i]); d > goldenTolerance {
					t.Errorf("%s: batch %d item %d: differs from ONNX Runtime's %s by %.3g", dir, bi, i, key, d)
				}
			}
		}
	}
}
