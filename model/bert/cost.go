package bert

import (
	"math/bits"
	"unsafe"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// How the Embedder's cost adds up.
//
// A transformer's working memory grows with the padded length of its batch,
// quadratically in attention, so a cost that sums per-item figures over
// items of their own lengths is sound only if no item is padded past the
// length it was counted at. Padding to the batch's longest item would break
// that the moment a short message joins a long one. So Run pads only
// within a length bucket: items are sorted into sub-batches by bucket,
// each padded to at most its bucket, and run one after another. An item is
// charged seqBytes(bucket), which bounds what one sequence of at most that
// length adds to any sub-batch of that bucket (every term of WorkingBytes
// is linear in the batch, or bounded by a per-sequence share; see
// seqOverhead). The sub-batches run in turn, so the batch needs the most of
// any of them, which is below their sum, which is below the sum of the
// items' costs: costs add up, as gpu.Model asks, whatever messages the
// subscriber puts together.
//
// The buckets are a geometric ladder with 16 rungs per octave (exact below
// 32 tokens): an item is padded by less than 1/16 of its length (6.25%),
// the padding waste the issue aims under (10%), while a message of texts
// of similar length still runs as one or two sub-batches rather than one
// per distinct length (on a GPU each sub-batch is a round of kernel
// launches). Sixteen and not eight rungs: eight would allow 12.5%.
const bucketRungs = 16

// bucket is the padded length an item of n tokens is counted and run at:
// n rounded up to the ladder, and never past MaxSeqLength (no item is
// longer, so the top bucket pads nothing beyond it).
func (e *Embedder) bucket(n int) int { return bucketOf(n, e.m.MaxSeqLength()) }

func bucketOf(n, maxLen int) int {
	if n <= bucketRungs {
		return max(n, 1)
	}
	step := 1 << (bits.Len(uint(n)) - 1 - bits.Len(bucketRungs-1)) // 2^(⌊log₂n⌋−4)
	return min((n+step-1)/step*step, maxLen)
}

// hostPerItem bounds what Run's device phase allocates per item besides
// Embed: its job.Output, and a share of each sub-batch's allocation record
// (every sub-batch has at least one item).
const hostPerItem = int64(unsafe.Sizeof(job.Output{})) + 128

// seqBytes bounds what one sequence adds to a sub-batch padded to at most
// seqLen tokens: for any batch ≥ 1, WorkingBytes(batch, l) ≤
// batch × seqBytes(seqLen) for every l ≤ seqLen.
func (c Config) seqBytes(seqLen int) int64 {
	const sliceHeader = 24
	return c.activationFloats(1, seqLen)*4 + int64(c.HiddenSize)*4 + sliceHeader + c.seqOverhead(seqLen) + hostPerItem
}

// seqOverhead is a per-sequence share of gemmOverhead. What the matrix
// products allocate depends on whether they go parallel, which a larger
// batch does and a single sequence may not: so it is not linear in the
// batch, and a sum of single-sequence figures would be short. Each term is
// bounded instead by one that is: a gonum product allocates at most a fixed
// cost plus one per 64×64 block, and ⌈batch·l/64⌉ ≤ batch·⌈l/64⌉;
// parallelFor's cost (the FMA backend's linear layers are one parallelFor
// each) is fixed per call, and a batch has at least one sequence to carry
// it.
func (c Config) seqOverhead(seqLen int) int64 {
	h, in := c.HiddenSize, c.IntermediateSize
	linear := func(out int) int64 {
		blocks := int64((seqLen+gemmBlock-1)/gemmBlock) * int64((out+gemmBlock-1)/gemmBlock)
		gonum := bytesPerParallelOp + blocks*bytesPerGoroutine
		return max(gonum, parallelForBytes())
	}
	perLayer := linear(3*h) + linear(h) + linear(in) + linear(h) +
		int64(c.NumHeads)*attentionBytes(seqLen, c.HeadDim()) +
		2*parallelForBytes()
	return int64(c.NumLayers) * perLayer
}

// Cost is the working memory Run needs for items: each item's seqBytes at
// its length's bucket; or, once SetCostModel gave a cost model calibrated
// on the device, what it says (calibratedCost). It tokenizes every text (which allocates only the
// ids). An item with binary data, which Run refuses, is counted as the
// empty text.
//
// On an Encoder (a GPU) Cost adds one Granule to a non-empty call. The
// device allocates each sub-batch as one buffer of at most the sum of its
// items' seqBytes (GPUConfig.CUDAWorkingBytes; TestCUDAWorkingBytesUnderCost),
// and the driver rounds it up, by less than a granule. The sub-batches of a
// batch run in turn, so the batch holds one rounded buffer at a time and
// needs the rounding once. A granule per item would be sound too, but
// charge 2 MiB for a short text's few hundred KiB; a granule per call is
// what makes costs add up, whichever messages share a batch and however
// many batches the device runs at once, and BatchBytes tells the
// subscriber that it is the per-batch part, charged once per batch. An
// encoder in half precision holds half-width buffers in place of most
// float32 ones, and where it holds more (its half-precision attention
// probabilities beside the float32 scores, at long lengths) each item is
// charged its bucket's share of the excess too (halfOperandSizer).
func (e *Embedder) Cost(items []job.Item) int64 {
	if m := e.calibrated.Load(); m != nil {
		return e.calibratedCost(*m, items)
	}
	half, _ := e.enc.(halfOperandSizer)
	var total int64
	for _, it := range items {
		b := e.bucket(e.tokenCount(it))
		total += e.m.cfg.seqBytes(b)
		if half != nil {
			total += half.HalfSeqBytes(b)
		}
	}
	if e.enc != nil && len(items) > 0 {
		total += Granule
	}
	return total
}

// BatchBytes is the part of each non-empty Cost that a batch needs once
// (gpu.BatchCoster): the calibrated cost model's PerBatch, or on an
// Encoder the Granule its allocations round up by; none for the analytic
// cost on the host, whose figures hold per sequence.
func (e *Embedder) BatchBytes() int64 {
	if m := e.calibrated.Load(); m != nil {
		return m.PerBatch
	}
	if e.enc != nil {
		return Granule
	}
	return 0
}

var _ gpu.BatchCoster = (*Embedder)(nil)

// halfOperandSizer is an Encoder that multiplies in half precision and so
// may allocate more than the float32 buffers seqBytes bounds: at most
// HalfSeqBytes(bucket) more per sequence (GPUConfig.HalfSeqBytes). The
// CUDA encoder is one.
type halfOperandSizer interface {
	HalfSeqBytes(seqLen int) int64
}

// Granule is the unit a GPU driver rounds allocations up to: 2 MiB, the
// large-page size CUDA's allocator maps device memory in (and what the
// emulated driver rounds to).
const Granule = 2 << 20

func (e *Embedder) tokenCount(it job.Item) int {
	if len(it.Data) > 0 {
		return e.tok.NumSpecial()
	}
	return len(e.tok.Encode(it.Text, e.m.MaxSeqLength()))
}

// LengthClass is the class of a message for the subscriber's batcher
// (gpu.LengthClasser): the octave of its longest item's length in tokens
// (1, 2–3, 4–7, …, 256–511, 512). Messages of one octave pad little
// against each other, and Run's buckets take care of the rest; messages
// of different octaves would share a batch only to run as separate
// sub-batches, the short ones waiting for the long.
func (e *Embedder) LengthClass(items []job.Item) int {
	longest := 0
	for _, it := range items {
		longest = max(longest, e.tokenCount(it))
	}
	return bits.Len(uint(longest))
}
