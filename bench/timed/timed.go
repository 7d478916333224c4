// Package timed is the benchmarks' simulated model: the reference model's
// memory and a GPU's time without the arithmetic (Model), and a model that
// does nothing (Noop), so that admission strategies and the subscriber's own
// overhead can be measured on a machine without a GPU.
package timed

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/refembed"
)

// Model is the reference model's memory and a GPU's time without the
// arithmetic: it costs exactly what a refembed.Embedder of the same
// configuration costs, allocates that from its gpu.Allocator (a gpu.Sim) for
// the length of the batch, and takes the time its Timing gives, on a device
// shared by all the batches it runs at once. Its outputs are deterministic unit vectors of the
// configured size, so result messages are as large as the real model's.
//
// It exists so that admission strategies can be compared for throughput
// and out-of-memory errors on a machine without a GPU, where the CPU
// reference model would measure the CPU instead. A Model is safe for
// concurrent use.
type Model struct {
	cfg         refembed.Config
	cost        gpu.CostModel
	costOf      func([]job.Item) int64 // another model's Cost (NewFor); nil: cfg's
	out         int                    // width of the outputs
	timing      Timing
	name        string
	weights     int64
	mem         gpu.Allocator
	dev         *sharedDevice
	freeWeights func()
	closed      atomic.Bool
	working     atomic.Int64 // bytes the batches in progress hold now
}

var (
	_ gpu.Model      = (*Model)(nil)
	_ gpu.WorkingSet = (*Model)(nil)
	_ gpu.Launcher   = (*Model)(nil)
)

// New loads a model shaped by cfg onto mem: it allocates the bytes
// an refembed.Embedder's weights would take, failing with an error wrapping
// gpu.ErrOutOfMemory when they do not fit. A nil mem accounts nothing.
func New(cfg refembed.Config, timing Timing, mem gpu.Allocator) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := timing.Validate(); err != nil {
		return nil, err
	}
	m := &Model{
		cfg:     cfg,
		cost:    cfg.CostModel(),
		timing:  timing,
		name:    fmt.Sprintf("timed-embed-v%d-d%d-h%d-o%d-t%d", cfg.Vocab, cfg.Dim, cfg.Hidden, cfg.Out, cfg.MaxTokens),
		weights: cfg.WeightBytes(),
		out:     cfg.Out,
	}
	return m.load(mem)
}

// NewFor is the timed stand-in of another model, of: of's
// weights and Cost (a BERT's, say, whose cost grows with the square of its
// texts' length), outputs out wide, and timing's time, computing nothing.
// It loads onto mem as New does. Its Config is the zero refembed.Config,
// whose MaxTokens of 0 calibrate.Calibrate refuses: calibrate the model
// itself.
func NewFor(of gpu.Model, out int, timing Timing, mem gpu.Allocator) (*Model, error) {
	if out < 1 {
		return nil, fmt.Errorf("timed model of %s: %d output values, want at least 1", of.Name(), out)
	}
	if err := timing.Validate(); err != nil {
		return nil, err
	}
	m := &Model{
		costOf:  of.Cost,
		timing:  timing,
		name:    "timed-" + of.Name(),
		weights: of.Weights(),
		out:     out,
	}
	return m.load(mem)
}

// load gives m a device of its own to time batches on and puts its
// weights on mem (none: a model whose memory nobody accounts).
func (m *Model) load(mem gpu.Allocator) (*Model, error) {
	m.mem = mem
	m.dev = newSharedDevice(m.timing.Throughput)
	m.freeWeights = func() {}
	if mem != nil {
		free, err := mem.Alloc(m.weights)
		if err != nil {
			return nil, fmt.Errorf("%s: load weights: %w", m.name, err)
		}
		m.freeWeights = free
	}
	return m, nil
}

// Name says the model is timed and its shape.
func (m *Model) Name() string { return m.name }

// Weights is what an refembed.Embedder's weights of this configuration take.
func (m *Model) Weights() int64 { return m.weights }

// Cost is what an refembed.Embedder of this configuration costs for items, or the
// model's of NewFor.
func (m *Model) Cost(items []job.Item) int64 {
	if m.costOf != nil {
		return m.costOf(items)
	}
	return m.cfg.Cost(m.cost, items)
}

// Config is the configuration the model was made with.
func (m *Model) Config() refembed.Config { return m.cfg }

// MaxTokens is the most tokens the model reads from an item, as the
// reference model of its configuration reads (calibrate.Meter).
func (m *Model) MaxTokens() int { return m.cfg.MaxTokens }

// CountTokens is how many tokens the model reads from text, as the reference
// model of its configuration counts them (calibrate.Meter).
func (m *Model) CountTokens(text string) int { return m.cfg.CountTokens(text) }

// Working is the memory the batches in progress hold now, allocated from the
// Allocator; 0 without one.
func (m *Model) Working() int64 { return m.working.Load() }

// Timing is the model of time Run follows.
func (m *Model) Timing() Timing { return m.timing }

// Busy is how long the simulated device has had work in progress, launches
// not counted: busy time over elapsed time is its utilisation.
func (m *Model) Busy() time.Duration { return m.dev.Busy() }

// Close frees the weights' memory. Run fails with gpu.ErrClosed afterwards.
func (m *Model) Close() error {
	if !m.closed.Swap(true) {
		m.freeWeights()
	}
	return nil
}

// Run waits out the launch, allocates the batch's working memory (failing
// with gpu.ErrOutOfMemory when it does not fit, as a framework does part way into
// a forward pass), does the batch's work on the shared device, and frees the
// memory.
func (m *Model) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	return m.run(ctx, items, m.mem)
}

// Launch waits out the launch, which takes neither memory nor the device's
// throughput; the batch it returns does the rest of Run.
func (m *Model) Launch(ctx context.Context, items []job.Item) (gpu.Launched, error) {
	return m.launch(ctx, items, m.mem)
}

// run is Run taking the batch's memory from mem (nil: account nothing),
// which Measure wraps to count it.
func (m *Model) run(ctx context.Context, items []job.Item, mem gpu.Allocator) ([]job.Output, error) {
	b, err := m.launch(ctx, items, mem)
	if err != nil {
		return nil, err
	}
	return b.Run(ctx)
}

func (m *Model) launch(ctx context.Context, items []job.Item, mem gpu.Allocator) (*timedBatch, error) {
	if m.closed.Load() {
		return nil, fmt.Errorf("%s: %w", m.name, gpu.ErrClosed)
	}
	if len(items) > 0 {
		if err := backoff.Sleep(ctx, m.timing.Launch); err != nil {
			return nil, err
		}
	}
	return &timedBatch{m: m, items: items, mem: mem}, nil
}

// timedBatch is a Model's batch past its launch.
type timedBatch struct {
	m     *Model
	items []job.Item
	mem   gpu.Allocator
}

func (b *timedBatch) Run(ctx context.Context) ([]job.Output, error) {
	m, items := b.m, b.items
	if len(items) == 0 {
		return []job.Output{}, ctx.Err()
	}
	if m.closed.Load() {
		return nil, fmt.Errorf("%s: %w", m.name, gpu.ErrClosed)
	}
	cost := m.Cost(items)
	if b.mem != nil {
		free, err := b.mem.Alloc(cost)
		if err != nil {
			return nil, fmt.Errorf("%s: batch of %d: %w", m.name, len(items), err)
		}
		// Counted only while really allocated (see gpu.WorkingSet).
		m.working.Add(cost)
		defer func() { m.working.Add(-cost); free() }()
	}
	if err := m.dev.work(ctx, cost); err != nil {
		return nil, err
	}
	out := make([]job.Output, len(items))
	for i, it := range items {
		out[i] = job.Output{ID: it.ID, Embedding: unitVector(it.Text, m.out)}
	}
	return out, nil
}

// unitVector is a deterministic vector of n values of unit length, seeded by
// text, standing in for an embedding.
func unitVector(text string, n int) []float32 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(text); i++ {
		h = (h ^ uint64(text[i])) * 0x100000001b3
	}
	r := refembed.Rand{State: refembed.Mix64(h)}
	v := make([]float32, n)
	var sum float64
	for i := range v {
		v[i] = r.Symmetric()
		sum += float64(v[i]) * float64(v[i])
	}
	if sum > 0 {
		scale := float32(1 / math.Sqrt(sum))
		for i := range v {
			v[i] *= scale
		}
	}
	return v
}
