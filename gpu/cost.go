package gpu

import "fmt"

// CostModel is the working memory of one forward pass, which is linear in
// its input: Bytes(tokens, items) = tokens×PerToken + items×PerItem +
// PerBatch; for a transformer, whose attention grows with the square of the
// padded length, linear in the features of its padded shape (Padded). A
// model's analytic cost model (the reference model's
// refembed.Config.CostModel) has no constant term when the model allocates
// exactly its buffers; one calibrated on a device (package calibrate) has
// one, for what a real allocator adds to every batch.
type CostModel struct {
	// PerToken is the bytes each token of the batch adds (for the
	// reference model, its id and its gathered embedding row).
	PerToken int64 `json:"per_token"`
	// PerItem is the bytes each item adds whatever its length (for the
	// reference model, its offset, pooled vector, hidden activations and
	// output).
	PerItem int64 `json:"per_item"`
	// PerBatch is what one Run takes whatever its size: on a GPU, the
	// rounding of each buffer up to the allocation granularity and the
	// workspace of a GEMM library. Zero in an analytic model.
	//
	// Each Cost call carries it once, so a sum of per-message costs is an
	// upper bound whatever messages share a batch; a model that says so
	// (BatchCoster) lets the subscriber charge it once per batch instead.
	PerBatch int64 `json:"per_batch"`
	// PerScore is the bytes of each attention score a batch holds, for a
	// transformer that pads a batch to its longest item: items × heads ×
	// seqLen² of them, the term that grows with the square of the length
	// (see Padded). 0 for a model without attention; Bytes does not
	// apply it.
	PerScore int64 `json:"per_score"`
}

// Bytes is the working memory of one Run over items items holding tokens
// tokens in all. A Run of no items allocates nothing, so it costs nothing.
func (m CostModel) Bytes(tokens, items int64) int64 {
	if items == 0 {
		return 0
	}
	return tokens*m.PerToken + items*m.PerItem + m.PerBatch
}

// Padded is the working memory of one Run over items items padded to
// seqLen tokens each, by a model with heads attention heads: the padded
// tokens items×seqLen at PerToken, the items×heads×seqLen² attention scores
// at PerScore, and the items and the batch as in Bytes.
func (m CostModel) Padded(items, seqLen, heads int64) int64 {
	if items == 0 {
		return 0
	}
	return items*seqLen*m.PerToken + items*heads*seqLen*seqLen*m.PerScore + items*m.PerItem + m.PerBatch
}

// Validate reports a negative coefficient: a cost model that could estimate
// a batch as needing less memory than a smaller one.
func (m CostModel) Validate() error {
	if m.PerToken < 0 || m.PerItem < 0 || m.PerBatch < 0 || m.PerScore < 0 {
		return fmt.Errorf("cost model: per token %d, per item %d, per batch %d, per score %d bytes: none may be negative",
			m.PerToken, m.PerItem, m.PerBatch, m.PerScore)
	}
	return nil
}

// A CostModelSetter is a model whose Cost applies a CostModel that a
// calibrated one can replace. calibrate.LoadCostModel sets it, after checking that the
// cost model was fitted for this model on this device.
type CostModelSetter interface {
	Model
	// CostModel is the model Cost applies now.
	CostModel() CostModel
	// SetCostModel makes Cost apply m from now on. It refuses a model that
	// fails m.Validate. Safe to call at any time, but set it before the
	// model is used: costs already estimated keep the old model.
	SetCostModel(m CostModel) error
}

// A BatchCoster is a model whose every non-empty Cost call includes a part
// that a batch needs once, however many messages share it (a cost model's
// PerBatch; a GPU's allocation rounding). A batch of messages m₁…mₖ then
// needs at most BatchBytes + Σ(Cost(mᵢ) − BatchBytes), and the subscriber
// charges it so: each message its own part, each batch the rest once.
type BatchCoster interface {
	Model
	// BatchBytes is the per-batch part of each non-empty Cost now; at most
	// that Cost. Safe to call concurrently with Cost.
	BatchBytes() int64
}
