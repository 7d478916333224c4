package timed

import (
	"context"
	"encoding/json"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// Noop is a model that computes nothing: one byte of working memory and one
// tiny output ("0") per item. With it, what a subscriber spends is its own
// work and its queue's, which is what the overhead benchmarks measure.
type Noop struct{}

var _ gpu.Model = Noop{}

func (Noop) Name() string                { return "noop" }
func (Noop) Weights() int64              { return 0 }
func (Noop) Cost(items []job.Item) int64 { return int64(len(items)) }

func (Noop) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	out := make([]job.Output, len(items))
	for i, it := range items {
		out[i] = job.Output{ID: it.ID, Data: json.RawMessage("0")}
	}
	return out, ctx.Err()
}
