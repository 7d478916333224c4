package timed

import (
	"context"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// Measure runs items as one batch, its time included, and returns the
// memory it asked of the model's Allocator: its Cost.
func (m *Model) Measure(ctx context.Context, items []job.Item) (int64, error) {
	c := gpu.NewPeakCounter(m.mem)
	_, err := m.run(ctx, items, c)
	return c.Peak(), err
}
