package bert

import (
	"context"
	"fmt"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
)

// An Embedder is a calibrate.ShapeMeter: `subscriber -calibrate -model DIR`
// measures padded shapes on it and fits a cost model with a length² term
// (calibrate.CalibrateShapes), and `-cost-model` gives the fit back to
// SetCostModel. The fit is of one sub-batch, items × padded length, which
// is what a sub-batch allocates on the device; Cost composes a message's
// cost from it as the analytic cost does (see cost.go): each item at its
// length's bucket, the per-batch bytes once per call.

// AttentionHeads is the model's attention heads per layer
// (calibrate.AttentionModel): a cost model for an Embedder must be one of
// padded shapes fitted for as many.
func (e *Embedder) AttentionHeads() int { return e.m.cfg.NumHeads }

// MaxSeqLength is the longest item in tokens, [CLS] and [SEP] included.
func (e *Embedder) MaxSeqLength() int { return e.m.MaxSeqLength() }

// shapeMeasurer is an Encoder that can say what a batch took on its device
// (CUDAEncoder).
type shapeMeasurer interface {
	Measure(ctx context.Context, ids [][]int32) (int64, error)
}

// MeasureShape runs a sub-batch of items sequences of seqLen tokens each
// and returns the most device memory it held at once
// (calibrate.ShapeMeter). On a GPU that is the encoder's own measurement:
// the drop of the driver's free memory, its rounding and cuBLAS's
// workspace included. On the CPU it is what the sub-batch takes from the
// Embedder's Allocator (the simulated device): the analytic WorkingBytes,
// without computing it. The token ids are spread over the vocabulary;
// memory depends on the shape alone.
func (e *Embedder) MeasureShape(ctx context.Context, items, seqLen int) (int64, error) {
	if items < 1 || seqLen < 1 || seqLen > e.MaxSeqLength() {
		return 0, fmt.Errorf("%w: %s: a batch of %d items × %d tokens; want at least 1 item of 1 to %d tokens",
			fault.ErrInvalidInput, e.name, items, seqLen, e.MaxSeqLength())
	}
	if e.closed.Load() {
		return 0, fmt.Errorf("%s: %w", e.name, ErrClosed)
	}
	ids := make([][]int32, items)
	vocab := int64(e.m.cfg.VocabSize)
	for i := range ids {
		ids[i] = make([]int32, seqLen)
		for k := range ids[i] {
			ids[i][k] = int32((int64(i)*7919 + int64(k)*104729 + 1) % vocab)
		}
	}
	if e.enc != nil {
		m, ok := e.enc.(shapeMeasurer)
		if !ok {
			return 0, fmt.Errorf("%s: its encoder cannot measure its memory", e.name)
		}
		return m.Measure(ctx, ids)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// On the CPU the device's memory is the Allocator's account of the
	// sub-batch, taken before it computes and not changed by computing, so
	// the sub-batch is not computed: a default sweep (256 items, up to 512
	// tokens) would take hours of CPU for the same figures.
	c := gpu.NewPeakCounter(e.mem)
	free, err := c.Alloc(e.m.WorkingBytes(items, seqLen))
	if err != nil {
		return 0, fmt.Errorf("%s: sub-batch of %d items × %d tokens: %w", e.name, items, seqLen, err)
	}
	free()
	return c.Peak(), nil
}

// CostModel is the calibrated cost model SetCostModel gave, of padded
// shapes (gpu.CostModel.Padded); the zero CostModel until then, when Cost
// applies the analytic bound instead, which no CostModel describes.
func (e *Embedder) CostModel() gpu.CostModel {
	if m := e.calibrated.Load(); m != nil {
		return *m
	}
	return gpu.CostModel{}
}

// SetCostModel makes Cost apply m, a cost model of padded shapes fitted
// on this model's device (calibrate.LoadCostModel checks that it is one,
// for this model's heads and device), instead of the analytic bound.
func (e *Embedder) SetCostModel(m gpu.CostModel) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("%s: %w", e.name, err)
	}
	e.calibrated.Store(&m)
	return nil
}

// calibratedCost is Cost under a calibrated m: each item charged a
// sequence of its bucket's length (per padded token, per attention score,
// per item), and the per-batch bytes once. A sub-batch of k items of one
// bucket B, padded to at most B, needs at most m.Padded(k, B) (the fit
// covers every shape it was calibrated over, and it grows with length),
// which is at most its items' charges plus the per-batch bytes; the
// sub-batches run in turn, so the batch needs the most of them, below the
// sum. BatchBytes says which part that is, so that a batch of several
// messages is charged it once.
func (e *Embedder) calibratedCost(m gpu.CostModel, items []job.Item) int64 {
	if len(items) == 0 {
		return 0
	}
	heads := int64(e.m.cfg.NumHeads)
	total := m.PerBatch
	for _, it := range items {
		b := int64(e.bucket(e.tokenCount(it)))
		total += b*m.PerToken + heads*b*b*m.PerScore + m.PerItem
	}
	return total
}

var _ gpu.CostModelSetter = (*Embedder)(nil)
