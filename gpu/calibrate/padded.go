package calibrate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Why padded shapes are fitted here, beside the token-and-item fit, and not
// in the model's package: calibration is one idea (a sweep, a
// non-negative least squares, a measured margin, a file checked at load),
// and a transformer differs from the reference model only in what a batch
// is. Its memory depends on the padded shape (items × length), and its
// attention scores grow with the square of the length, so the sweep is one
// of shapes and the fit has one more term (gpu.CostModel.PerScore). What a
// model must supply is the measurement of one shape: a ShapeMeter. How a
// message's cost adds up from the fitted shape costs (bucketing, padding)
// stays the model's.

// An AttentionModel is a model that pads each batch to a common length and
// runs attention over it: a cost model for it is one of padded shapes with
// its number of heads (gpu.CostModel.Padded). LoadCostModel gives such a
// model only a cost model fitted that way, for as many heads, and any other
// model only one that is not.
type AttentionModel interface {
	// AttentionHeads is the model's attention heads per layer.
	AttentionHeads() int
}

// A ShapeMeter is a model whose batches run padded to a common length and
// that can say how much device memory a batch of a given shape really took.
// CalibrateShapes measures through it.
type ShapeMeter interface {
	AttentionModel
	Name() string
	// MaxSeqLength is the longest sequence the model runs, in tokens: the
	// sweep's lengths run from 1 to it.
	MaxSeqLength() int
	// MeasureShape runs a batch of items sequences of seqLen tokens each
	// and returns the most device memory it held at once, as Meter.Measure
	// does (allocator rounding and library workspace included). The
	// tokens are the model's to choose: memory depends on the shape alone.
	MeasureShape(ctx context.Context, items, seqLen int) (peak int64, err error)
}

// Shape is a padded batch: Items sequences of SeqLen tokens.
type Shape struct{ Items, SeqLen int }

// Shapes is the sweep's padded batches for a model of sequences up to
// maxSeqLen tokens, in the order CalibrateShapes measures them: for every
// item count from 1 to MaxItems, lengths from 1 to maxSeqLen, both ends
// included, one drawn at random from each of the equal strata between; as
// many lengths as Batches has token totals for that count (Points at
// MaxItems, proportionally fewer below, at least 4). So the longest
// sequences are measured at every item count, the largest batch included.
//
// Every item count, not counts 25% apart as Batches has: a padded batch's
// memory is nearly proportional to its items, so a gap of a quarter in
// items would put a quarter of the largest batch between samples (and into
// the bound from monotonicity, Calibration.MonotoneBound). With every
// count, the gap is about one sequence at the longest length, and
// with lengths proportionally as dense as the items are many, about as
// many bytes apart at every count.
func (s Sweep) Shapes(maxSeqLen int) []Shape {
	r := rand.New(rand.NewPCG(s.Seed, 0x73_68_61_70_65)) // "shape"
	var shapes []Shape
	for n := 1; n <= s.MaxItems; n++ {
		points := max(minPoints, (s.Points*n+s.MaxItems-1)/s.MaxItems)
		for _, l := range tokenTotals(r, 1, maxSeqLen, points) {
			shapes = append(shapes, Shape{Items: n, SeqLen: l})
		}
	}
	return shapes
}

// CalibrateShapes measures the sweep's padded shapes one at a time on m,
// which must have the device to itself, and fits a cost model of padded
// shapes to them (FitPadded). As Calibrate, it runs a first batch it does
// not count, and a batch that runs out of memory ends the sweep with an
// error naming its shape.
func CalibrateShapes(ctx context.Context, m ShapeMeter, device string, s Sweep) (*Calibration, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	maxLen, heads := m.MaxSeqLength(), m.AttentionHeads()
	if maxLen < 1 || heads < 1 {
		return nil, fmt.Errorf("calibrate %s: sequences of at most %d tokens, %d attention heads; want at least 1 of each",
			m.Name(), maxLen, heads)
	}
	start := time.Now()
	shapes := s.Shapes(maxLen)
	if _, err := m.MeasureShape(ctx, shapes[0].Items, shapes[0].SeqLen); err != nil {
		return nil, fmt.Errorf("calibrate %s: first batch: %w", m.Name(), err)
	}
	samples := make([]Sample, 0, len(shapes))
	for _, sh := range shapes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		peak, err := m.MeasureShape(ctx, sh.Items, sh.SeqLen)
		if err != nil {
			return nil, fmt.Errorf("calibrate %s: batch of %d items × %d tokens: %w", m.Name(), sh.Items, sh.SeqLen, err)
		}
		samples = append(samples, Sample{Items: sh.Items, SeqLen: sh.SeqLen, Bytes: peak})
	}
	c, err := FitPadded(samples, heads)
	if err != nil {
		return nil, fmt.Errorf("calibrate %s: %w", m.Name(), err)
	}
	c.Model, c.Device, c.Sweep, c.MaxTokens = m.Name(), device, s, maxLen
	c.Took = time.Since(start)
	return c, nil
}

// FitPadded fits bytes = PerToken×items×seqLen + PerScore×items×heads×seqLen²
// + PerItem×items + PerBatch (gpu.CostModel.Padded) to samples of padded
// shapes (Items and SeqLen set; their Tokens and Scores are set here), as
// Fit does: non-negative least squares, PerBatch raised to cover every
// sample, then by the margin measured for the shapes between samples. The
// samples should include the corners: the fewest and most items, each at
// the shortest and longest length, as a Sweep's Shapes do.
func FitPadded(samples []Sample, heads int) (*Calibration, error) {
	if len(samples) == 0 {
		return nil, errors.New("fit: no samples")
	}
	if heads < 1 {
		return nil, fmt.Errorf("fit: %d attention heads; want at least 1", heads)
	}
	for i, s := range samples {
		if s.Items < 1 || s.SeqLen < 1 || s.Bytes < 0 {
			return nil, fmt.Errorf("fit: %v: want at least 1 item of at least 1 token and no negative bytes", s)
		}
		n, l := int64(s.Items), int64(s.SeqLen)
		samples[i].Tokens, samples[i].Scores = n*l, n*int64(heads)*l*l
	}
	return fit(samples, form{heads: heads})
}
