package bert

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/wordpiece"
)

// Embedder serves a Model to vramq's subscriber: it is a gpu.Model whose
// items are texts. Each text is tokenized (cut at MaxSeqLength, [CLS] and
// [SEP] kept), the batch is split into sub-batches of items of one length
// bucket (see bucket), and each sub-batch runs through Embed in turn. Its
// weights and each sub-batch's working memory are taken from an Allocator,
// so on a simulated device it runs out of memory where a device of that size
// would.
//
// An Embedder is safe for concurrent use.
type Embedder struct {
	m           *Model
	tok         *wordpiece.Tokenizer
	name        string
	mem         gpu.Allocator // nil: account nothing
	freeWeights func()
	// enc, when set, runs the sub-batches instead of m (a GPU), which
	// allocates for itself: mem is nil then, and weights and onDevice
	// report what enc holds.
	enc      Encoder
	weights  int64
	onDevice func() int64
	closed   atomic.Bool
	working  atomic.Int64
	// calibrated is the cost model SetCostModel gave (calibrate.go); nil
	// until then.
	calibrated atomic.Pointer[gpu.CostModel]
	// What Runs computed, in tokens (see Padding).
	tokens, computed, oneBatch atomic.Int64
}

// Padding is what an Embedder's Runs have computed so far, in tokens.
type Padding struct {
	Tokens   int64 // the items' own tokens
	Computed int64 // token rows computed: each sub-batch padded to its longest item
	// OneBatch is what padding each Run's items to the Run's longest item,
	// as one batch, would have computed: the cost of batching by arrival
	// order without length buckets.
	OneBatch int64
}

// Padding returns the token counts of the Runs so far.
func (e *Embedder) Padding() Padding {
	return Padding{Tokens: e.tokens.Load(), Computed: e.computed.Load(), OneBatch: e.oneBatch.Load()}
}

var (
	_ gpu.Model         = (*Embedder)(nil)
	_ gpu.Launcher      = (*Embedder)(nil)
	_ gpu.WorkingSet    = (*Embedder)(nil)
	_ gpu.LengthClasser = (*Embedder)(nil)
)

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("bert: embedder closed")

// Open loads the model and the tokenizer in dir and its weights' bytes onto
// mem (nil: account nothing).
func Open(dir string, mem gpu.Allocator) (*Embedder, error) {
	m, err := Load(dir)
	if err != nil {
		return nil, err
	}
	tok, err := wordpiece.Load(dir)
	if err != nil {
		return nil, err
	}
	return NewEmbedder(m, tok, mem)
}

// CheckTokenizer refuses a tokenizer whose ids run past m's vocabulary, as
// NewEmbedder does: for a caller that must know before loading m elsewhere.
func CheckTokenizer(m *Model, tok *wordpiece.Tokenizer) error {
	if tok.VocabSize() > m.cfg.VocabSize {
		return fmt.Errorf("bert: %s: the tokenizer has %d ids, the model's vocab_size is %d", m.dir, tok.VocabSize(), m.cfg.VocabSize)
	}
	return nil
}

// NewEmbedder serves m with tok, allocating m's weights on mem (nil:
// account nothing); the error wraps gpu.ErrOutOfMemory when they do not
// fit. A tokenizer whose ids run past the model's vocabulary is refused
// here, at start, rather than item by item later.
func NewEmbedder(m *Model, tok *wordpiece.Tokenizer, mem gpu.Allocator) (*Embedder, error) {
	if err := CheckTokenizer(m, tok); err != nil {
		return nil, err
	}
	e := &Embedder{m: m, tok: tok, name: "bert:" + m.Name(), mem: mem, freeWeights: func() {}}
	if mem != nil {
		free, err := mem.Alloc(e.Weights())
		if err != nil {
			return nil, fmt.Errorf("%s: load weights: %w", e.name, err)
		}
		e.freeWeights = free
	}
	return e, nil
}

// Name is "bert:" and the model directory's name, e.g.
// "bert:all-MiniLM-L6-v2": results carry it.
func (e *Embedder) Name() string { return e.name }

// Model is the encoder served.
func (e *Embedder) Model() *Model { return e.m }

// Weights is the memory the float32 weights hold.
func (e *Embedder) Weights() int64 {
	if e.enc != nil {
		return e.weights
	}
	return e.m.WeightBytes()
}

// Working is the working memory the Runs in progress hold now, taken from
// the Allocator (0 without one), or the device's own count on an Encoder.
func (e *Embedder) Working() int64 {
	if e.onDevice != nil {
		return e.onDevice()
	}
	return e.working.Load()
}

// Encoder computes one vector per item of token ids ([CLS] … [SEP]) as one
// batch padded to its longest item, as Model.Embed does, on a device that
// allocates for itself (CUDAEncoder). Out of memory must wrap
// gpu.ErrOutOfMemory, having freed what it took.
type Encoder interface {
	Embed(ctx context.Context, ids [][]int32) ([][]float32, error)
	Close() error
}

// NewEmbedderOn serves m with tok as NewEmbedder does, the sub-batches
// running on enc, a device holding m's weights in weights bytes, whose
// working memory now is working(). m stays the description of the model
// (configuration, sentence settings, the cost model) and is not run. Cost
// adds a granule of the device's allocator per call (see Granule). Close
// closes enc.
func NewEmbedderOn(m *Model, tok *wordpiece.Tokenizer, enc Encoder, weights int64, working func() int64) (*Embedder, error) {
	e, err := NewEmbedder(m, tok, nil)
	if err != nil {
		return nil, err
	}
	e.enc, e.weights, e.onDevice = enc, weights, working
	return e, nil
}

// Close frees the weights' memory. Run fails with ErrClosed afterwards.
func (e *Embedder) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	e.freeWeights()
	if e.enc != nil {
		return e.enc.Close()
	}
	return nil
}

// Tokens returns item's token ids as Run computes them: at most
// MaxSeqLength, [CLS] and [SEP] included. An item with binary data instead
// of text is an error wrapping fault.ErrInvalidInput.
func (e *Embedder) Tokens(it job.Item) ([]int32, error) {
	if len(it.Data) > 0 {
		return nil, fmt.Errorf("%w: item %s has binary data; %s embeds text only", fault.ErrInvalidInput, job.QuoteID(it.ID), e.name)
	}
	return e.tok.Encode(it.Text, e.m.MaxSeqLength()), nil
}

// Run embeds items: Launch, then the launched batch's Run.
func (e *Embedder) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	l, err := e.Launch(ctx, items)
	if err != nil {
		return nil, err
	}
	return l.Run(ctx)
}

// subBatch is the items of one length bucket, in the order given.
type subBatch struct {
	bucket int       // the padded length Cost counted
	index  []int     // positions in the batch
	ids    [][]int32 // their token ids
}

// launched is a tokenized batch, sorted into sub-batches.
type launched struct {
	e    *Embedder
	n    int
	ids  []string
	subs []subBatch
}

// Launch tokenizes items and sorts them into sub-batches by length
// bucket: the host's side of a batch, which takes no device memory. An item
// with binary data fails the batch with fault.ErrInvalidInput.
func (e *Embedder) Launch(ctx context.Context, items []job.Item) (gpu.Launched, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l := &launched{e: e, n: len(items), ids: make([]string, len(items))}
	at := map[int]int{} // bucket → index in l.subs
	for i, it := range items {
		ids, err := e.Tokens(it)
		if err != nil {
			return nil, err
		}
		l.ids[i] = it.ID
		b := e.bucket(len(ids))
		k, ok := at[b]
		if !ok {
			k = len(l.subs)
			at[b] = k
			l.subs = append(l.subs, subBatch{bucket: b})
		}
		l.subs[k].index = append(l.subs[k].index, i)
		l.subs[k].ids = append(l.subs[k].ids, ids)
	}
	// Shortest first: deterministic, and the cheap sub-batches are done
	// before a long one that may time out.
	slices.SortFunc(l.subs, func(a, b subBatch) int { return a.bucket - b.bucket })
	return l, nil
}

// Run computes each sub-batch in turn, taking its working memory from the
// Allocator before computing: a sub-batch that does not fit fails the
// batch with an error wrapping gpu.ErrOutOfMemory, having freed what it
// took.
func (l *launched) Run(ctx context.Context) ([]job.Output, error) {
	e := l.e
	if e.closed.Load() {
		return nil, fmt.Errorf("%s: %w", e.name, ErrClosed)
	}
	outs := make([]job.Output, l.n)
	for _, s := range l.subs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := e.runSub(ctx, s, outs); err != nil {
			return nil, err
		}
	}
	for i := range outs {
		outs[i].ID = l.ids[i]
	}
	longest := 0
	for _, s := range l.subs {
		for _, ids := range s.ids {
			longest = max(longest, len(ids))
		}
	}
	e.oneBatch.Add(int64(l.n) * int64(longest))
	return outs, nil
}

func (e *Embedder) runSub(ctx context.Context, s subBatch, outs []job.Output) error {
	seqLen := 0
	for _, ids := range s.ids {
		seqLen = max(seqLen, len(ids))
	}
	if e.mem != nil {
		need := e.m.WorkingBytes(len(s.ids), seqLen)
		free, err := e.mem.Alloc(need)
		if err != nil {
			return fmt.Errorf("%s: sub-batch of %d items × %d tokens: %w", e.name, len(s.ids), seqLen, err)
		}
		e.working.Add(need)
		defer func() { e.working.Add(-need); free() }()
	}
	var vecs [][]float32
	var err error
	if e.enc != nil {
		vecs, err = e.enc.Embed(ctx, s.ids)
	} else {
		vecs, err = e.m.Embed(s.ids)
	}
	if err != nil {
		return err
	}
	var tokens int64
	for _, ids := range s.ids {
		tokens += int64(len(ids))
	}
	e.tokens.Add(tokens)
	e.computed.Add(int64(len(s.ids)) * int64(seqLen))
	for k, i := range s.index {
		outs[i].Embedding = vecs[k]
	}
	return nil
}
