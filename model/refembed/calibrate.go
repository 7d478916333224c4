package refembed

import (
	"context"
	"fmt"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// SetCostModel makes Cost apply m instead of the analytic model of the
// configuration. Run still allocates exactly its buffers; m only says how
// much to reserve for them.
func (e *Embedder) SetCostModel(m gpu.CostModel) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("%s: %w", e.name, err)
	}
	e.calibrated.Store(&m)
	return nil
}

// Measure runs items as one batch and returns the most memory it took from
// the Embedder's Allocator at once. It counts the batch's own allocations,
// so it is exact even while other batches run. It counts the sizes asked
// for: what an allocator that rounds them up takes beyond is not in it.
func (e *Embedder) Measure(ctx context.Context, items []job.Item) (int64, error) {
	c := gpu.NewPeakCounter(e.mem)
	_, err := e.run(ctx, items, c)
	return c.Peak(), err
}
