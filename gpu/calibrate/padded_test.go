package calibrate

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// shapeDevice is a transformer's memory as a function of its padded shape,
// measured as a GPU would: a batch of items × seqLen allocates the
// buffers of a BERT-like encoder (token rows, attention scores per head,
// per-item vectors), each rounded to 256 bytes, as one allocation the
// driver rounds up to its granule. It is monotone in items and length, and
// its length² term is the scores.
type shapeDevice struct {
	name                 string
	hidden, inner, heads int64
	maxSeqLen            int
	granule              int64
	measured             int // MeasureShape calls
	cost                 *gpu.CostModel
}

func (d *shapeDevice) bytes(items, seqLen int64) int64 {
	round := func(x, g int64) int64 { return (x + g - 1) / g * g }
	rows := items * seqLen
	n := round(4*rows, 256) + round(4*items, 256) + round(4*rows*d.hidden*9, 256) + round(4*rows*d.inner, 256) +
		round(4*items*d.heads*seqLen*seqLen, 256) + round(4*items*d.hidden, 256)
	return round(n, d.granule)
}

func (d *shapeDevice) Name() string        { return d.name }
func (d *shapeDevice) Weights() int64      { return 0 }
func (d *shapeDevice) MaxSeqLength() int   { return d.maxSeqLen }
func (d *shapeDevice) AttentionHeads() int { return int(d.heads) }
func (d *shapeDevice) Cost([]job.Item) int64 {
	return 0
}
func (d *shapeDevice) Run(context.Context, []job.Item) ([]job.Output, error) { return nil, nil }
func (d *shapeDevice) MeasureShape(_ context.Context, items, seqLen int) (int64, error) {
	d.measured++
	return d.bytes(int64(items), int64(seqLen)), nil
}
func (d *shapeDevice) CostModel() gpu.CostModel {
	if d.cost == nil {
		return gpu.CostModel{}
	}
	return *d.cost
}
func (d *shapeDevice) SetCostModel(m gpu.CostModel) error { d.cost = &m; return m.Validate() }

var (
	_ ShapeMeter          = (*shapeDevice)(nil)
	_ gpu.CostModelSetter = (*shapeDevice)(nil)
)

// The sweep's shapes reach the longest sequence at every item count,
// the largest batch included, and are the same for the same seed.
func TestSweepShapes(t *testing.T) {
	s := Sweep{MaxItems: 40, Points: 12, Seed: 3}
	shapes := s.Shapes(384)
	longest := map[int]bool{}
	shortest := map[int]bool{}
	for _, sh := range shapes {
		if sh.SeqLen < 1 || sh.SeqLen > 384 || sh.Items < 1 || sh.Items > 40 {
			t.Fatalf("shape %+v outside 1..40 items × 1..384 tokens", sh)
		}
		longest[sh.Items] = longest[sh.Items] || sh.SeqLen == 384
		shortest[sh.Items] = shortest[sh.Items] || sh.SeqLen == 1
	}
	for n := 1; n <= 40; n++ {
		if !longest[n] || !shortest[n] {
			t.Errorf("%d items: longest sequence measured %v, shortest %v; want both", n, longest[n], shortest[n])
		}
	}
	if !cmp.Equal(shapes, s.Shapes(384)) {
		t.Error("the same sweep gave other shapes")
	}
	if len(shapes) < 12 {
		t.Errorf("%d shapes", len(shapes))
	}
}

// Exact samples of a known padded cost model give back its coefficients,
// the length² one included, with no margin. A fit without the length² term
// cannot: the per-token and per-item terms cannot follow a square.
func TestFitPaddedRecoversCoefficients(t *testing.T) {
	const heads = 12
	want := gpu.CostModel{PerToken: 3 << 10, PerScore: 4, PerItem: 1536, PerBatch: 6 << 20}
	var samples []Sample
	for _, sh := range (Sweep{MaxItems: 64, Points: 24, Seed: 9}).Shapes(512) {
		samples = append(samples, Sample{Items: sh.Items, SeqLen: sh.SeqLen,
			Bytes: want.Padded(int64(sh.Items), int64(sh.SeqLen), heads)})
	}
	c, err := FitPadded(samples, heads)
	if err != nil {
		t.Fatal(err)
	}
	if c.Raw != want || c.Cost != want || c.Margin != 0 || c.WorstUnderRaw.Bytes != 0 || c.WorstOver.Bytes != 0 {
		t.Errorf("fit of exact samples:\n%s\nwant %+v exactly, no margin", c, want)
	}
	for _, s := range samples {
		if s.Tokens != int64(s.Items*s.SeqLen) || s.Scores != int64(s.Items*heads*s.SeqLen*s.SeqLen) {
			t.Fatalf("%+v: tokens and scores not those of the shape", s)
		}
	}
	if c.Heads != heads || !strings.Contains(c.String(), "4 B/attention score") {
		t.Errorf("heads %d; report:\n%s", c.Heads, c)
	}

	for _, bad := range [][]Sample{nil, {{Items: 0, SeqLen: 1}}, {{Items: 1, SeqLen: 0}}, {{Items: 1, SeqLen: 1, Bytes: -1}}} {
		if _, err := FitPadded(bad, heads); err == nil {
			t.Errorf("FitPadded(%v) took it", bad)
		}
	}
	if _, err := FitPadded([]Sample{{Items: 1, SeqLen: 1, Bytes: 1}}, 0); err == nil {
		t.Error("FitPadded took 0 heads")
	}
	if _, err := Fit([]Sample{{Items: 1, Tokens: 4, SeqLen: 4, Bytes: 1}}); err == nil {
		t.Error("Fit took a padded sample")
	}
}

// Calibrated on a device that rounds every buffer and the allocation, the
// cost model is never below what any shape of the range takes, at every
// item count and every length up to the longest, not only the measured
// ones: the coverage margin works over shapes.
func TestCalibrateShapesNeverUnderEstimates(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for trial := range 6 {
		d := &shapeDevice{name: "bert:test", hidden: 32 + 32*r.Int64N(4), inner: 128, heads: 1 + r.Int64N(8),
			maxSeqLen: 64 + r.IntN(200), granule: []int64{256, 64 << 10, 2 << 20}[trial%3]}
		s := Sweep{MaxItems: 24, Points: 10, Seed: uint64(trial)}
		c, err := CalibrateShapes(t.Context(), d, "emu", s)
		if err != nil {
			t.Fatal(err)
		}
		if d.measured != len(s.Shapes(d.maxSeqLen))+1 || c.Model != "bert:test" || c.Device != "emu" || c.MaxTokens != d.maxSeqLen {
			t.Errorf("measured %d shapes; calibration %s on %s up to %d tokens", d.measured, c.Model, c.Device, c.MaxTokens)
		}
		if c.Cost.PerScore == 0 {
			t.Errorf("trial %d: no length² term:\n%s", trial, c)
		}
		for n := int64(1); n <= int64(s.MaxItems); n++ {
			for l := int64(1); l <= int64(d.maxSeqLen); l++ {
				if est, need := c.Cost.Padded(n, l, d.heads), d.bytes(n, l); est < need {
					t.Fatalf("trial %d: %d items × %d tokens: estimated %d, takes %d\n%s", trial, n, l, est, need, c)
				}
			}
		}
		t.Logf("trial %d: %d heads, up to %d tokens, granule %s: %s; margin %s", trial, d.heads, d.maxSeqLen,
			exactBytes(d.granule), formatModel(c.Cost, true), exactBytes(c.Margin))
	}
}

// A padded cost model's file carries its form and heads; it loads onto a
// model with as many attention heads and no other, and a model with
// attention refuses a file of tokens and items (as every file written
// before the padded form is).
func TestPaddedCostModelFile(t *testing.T) {
	d := &shapeDevice{name: "bert:tiny", hidden: 64, inner: 128, heads: 4, maxSeqLen: 128, granule: 2 << 20}
	c, err := CalibrateShapes(t.Context(), d, "emu", Sweep{MaxItems: 8, Points: 6, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := c.File()
	if f.Form != FormPadded || f.Heads != 4 || f.MaxTokens != 128 || f.MaxItems != 8 || f.PerScore == 0 {
		t.Fatalf("file %+v", f)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "cost.json")
	if err := SaveCostModel(path, f); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCostModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(f, got); diff != "" {
		t.Errorf("round trip (-saved +read):\n%s", diff)
	}
	if _, err := LoadCostModel(path, d, "emu"); err != nil || d.CostModel() != f.CostModel {
		t.Fatalf("load: %v; the model applies %+v, want %+v", err, d.CostModel(), f.CostModel)
	}

	refuse := func(what string, path string, m gpu.Model, device, want string) {
		t.Helper()
		if _, err := LoadCostModel(path, m, device); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", what, err, want)
		}
	}
	refuse("another device", path, d, "NVIDIA H100 80GB HBM3", "fitted on device")
	refuse("another model", path, &shapeDevice{name: "bert:other", heads: 4}, "emu", "fitted for model")
	refuse("as many heads, fewer", path, &shapeDevice{name: "bert:tiny", heads: 2}, "emu", "fitted for 4 attention heads, not 2")
	// A model without attention with the same name is refused the padded
	// form; a model with attention the tokens-and-items form.
	linear := &linearModel{shapeDevice{name: "bert:tiny"}}
	refuse("padded onto a model without attention", path, linear, "emu", "for a model without attention")
	old := filepath.Join(dir, "old.json")
	write := func(p, body string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A file as written before the padded form: no form, heads or per_score.
	write(old, `{"model":"bert:tiny","device":"emu","per_token":1,"per_item":2,"per_batch":3,"samples":1,"max_items":1,"max_tokens":1,`+
		`"worst_under_estimate_raw":0,"margin":0,"worst_over_estimate":0,"fitted_at":"2026-01-01T00:00:00Z"}`)
	if f, err := LoadCostModel(old, linear, "emu"); err != nil || f.PerScore != 0 || linear.CostModel() != (gpu.CostModel{PerToken: 1, PerItem: 2, PerBatch: 3}) {
		t.Errorf("an old file onto a model without attention: %v, %+v", err, f)
	}
	refuse("tokens and items onto a model with attention", old, d, "emu", "not of padded shapes")

	for _, tc := range []struct{ body, want string }{
		{`{"model":"m","device":"d","form":"padded","heads":4,"per_token":1,"per_item":1,"per_batch":0}`, `missing "per_score"`},
		{`{"model":"m","device":"d","form":"padded","per_token":1,"per_item":1,"per_batch":0,"per_score":4}`, `missing "heads"`},
		{`{"model":"m","device":"d","form":"padded","heads":0,"per_token":1,"per_item":1,"per_batch":0,"per_score":4}`, `heads 0`},
		{`{"model":"m","device":"d","form":"squared","heads":4,"per_token":1,"per_item":1,"per_batch":0,"per_score":4}`, `form "squared"`},
		{`{"model":"m","device":"d","per_token":1,"per_item":1,"per_batch":0,"per_score":4}`, `only a cost model of the "padded" form`},
		{`{"model":"m","device":"d","form":"padded","heads":4,"per_token":1,"per_item":1,"per_batch":0,"per_score":-4}`, "negative"},
	} {
		p := filepath.Join(dir, "bad.json")
		write(p, tc.body)
		if _, err := ReadCostModel(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadCostModel(%s) = %v, want an error saying %q", tc.body, err, tc.want)
		}
	}
}

// linearModel is a shapeDevice without attention.
type linearModel struct{ s shapeDevice }

func (m *linearModel) Name() string                                          { return m.s.name }
func (m *linearModel) Weights() int64                                        { return 0 }
func (m *linearModel) Cost([]job.Item) int64                                 { return 0 }
func (m *linearModel) Run(context.Context, []job.Item) ([]job.Output, error) { return nil, nil }
func (m *linearModel) CostModel() gpu.CostModel                              { return m.s.CostModel() }
func (m *linearModel) SetCostModel(c gpu.CostModel) error                    { return m.s.SetCostModel(c) }

// The margin for batches between samples is what the calibration measured
// (samples held out of a fit), not the gap between neighbouring samples of
// the largest batches, which is tens of MiB for BERT-base's shapes and was
// charged to every message: on a device that rounds like a GPU driver, it is
// a granule or two, and still no shape of the range is under-estimated.
// The figures are a 3-token text's charge and the most 3-token texts a
// budget admits, with the bound from monotonicity (the margin before) and
// with the measured margin.
func TestMarginIsMeasuredNotTheGapBetweenSamples(t *testing.T) {
	const granule = 2 << 20
	d := &shapeDevice{name: "bert:base-shape", hidden: 768, inner: 3072, heads: 12, maxSeqLen: 512, granule: granule}
	s := DefaultSweep(64)
	c, err := CalibrateShapes(t.Context(), d, "emu", s)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", c)
	if c.Margin > 2*granule {
		t.Errorf("margin %s; want at most two granules (%s): what the samples held out showed", exactBytes(c.Margin), exactBytes(2*granule))
	}
	if c.MonotoneBound <= 8*granule {
		t.Errorf("bound from monotonicity %s: the sweep's gaps are too small for the test to show anything", exactBytes(c.MonotoneBound))
	}
	for n := int64(1); n <= int64(s.MaxItems); n++ {
		for l := int64(1); l <= int64(d.maxSeqLen); l++ {
			if est, need := c.Cost.Padded(n, l, d.heads), d.bytes(n, l); est < need {
				t.Fatalf("%d items × %d tokens: estimated %d, takes %d", n, l, est, need)
			}
		}
	}
	before := c.Cost
	before.PerBatch += c.MonotoneBound - c.Margin
	const budget = 8 << 30
	for _, m := range []struct {
		name string
		cost gpu.CostModel
	}{{"monotone bound (before)", before}, {"measured margin (after)", c.Cost}} {
		text := m.cost.Padded(1, 3, d.heads)
		t.Logf("FIGURE calibrated margin, %s: margin %s; a 3-token text charged %s (it takes %s); "+
			"3-token texts in an 8 GiB budget: %d charged per message, %d with the per-batch bytes once",
			m.name, exactBytes(m.cost.PerBatch-c.Raw.PerBatch-c.WorstUnderRaw.Bytes), exactBytes(text), exactBytes(d.bytes(1, 3)),
			budget/text, (budget-m.cost.PerBatch)/(text-m.cost.PerBatch))
	}
}
