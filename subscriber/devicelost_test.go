package subscriber

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
)

// lostModel loses its device at its run number at, and fails every run after
// it the same way, as a CUDA context broken by a sticky error does.
type lostModel struct {
	gpu.Model
	at   int64
	runs atomic.Int64
}

func (m *lostModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	if m.runs.Add(1) >= m.at {
		return nil, fmt.Errorf("injected illegal address: %w", gpu.ErrDeviceLost)
	}
	return m.Model.Run(ctx, items)
}

// A lost device takes the worker out: Run returns the loss without being
// asked to stop, health fails, every message not finished is back on the
// queue at once and none went to the DLQ, and nothing is received after.
func TestDeviceLostEndsTheWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var model *lostModel
		h := startWith(t, 64*mib, Config{MaxBatch: 1, Visibility: 5 * time.Minute}, func(h *harness, c *Config) {
			model = &lostModel{Model: h.model, at: 3}
			c.Backend = backend.InProcess{Model: model}
		})
		defer h.stop()
		for i := range 12 {
			h.send("job", i, "mb=1 ms=100")
		}
		var err error
		select {
		case err = <-h.done:
		case <-time.After(time.Minute):
			t.Fatal("Run still running a minute after the device was lost")
		}
		if !errors.Is(err, gpu.ErrDeviceLost) {
			t.Fatalf("Run: %v, want an error wrapping gpu.ErrDeviceLost", err)
		}
		if err := h.sub.Healthy(); !errors.Is(err, gpu.ErrDeviceLost) {
			t.Errorf("Healthy: %v, want gpu.ErrDeviceLost", err)
		}
		if d, _ := h.dlq.Stats(); d != 0 {
			t.Errorf("%d messages dead-lettered for a lost device", d)
		}
		results, _ := h.results.Stats()
		live, invisible := h.work.Stats()
		if results != 2 || live != 10 || invisible != 0 {
			t.Errorf("after the loss: %d results, %d messages left of which %d invisible; want 2 results and 10 messages, all visible",
				results, live, invisible)
		}
		if l := h.sub.Ledger(); l.Received != l.Deleted+l.Released+l.Lost+l.Abandoned || l.Deleted != 2 {
			t.Errorf("ledger %+v: want 2 deleted and the rest released", l)
		}
		runs := model.runs.Load()
		time.Sleep(time.Minute)
		if n := model.runs.Load(); n != runs {
			t.Errorf("the model ran %d more batches after Run returned", n-runs)
		}
	})
}
