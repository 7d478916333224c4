package subscriber

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queue"
)

// batchCostModel is the test model with a per-batch part (gpu.BatchCoster):
// every Cost call carries perBatch once, and every Run really allocates it
// once on the device, beside its items' own memory, as a GPU's allocation
// rounding or a cost model's PerBatch does.
type batchCostModel struct {
	*testModel
	perBatch int64
}

func (m batchCostModel) BatchBytes() int64 { return m.perBatch }

func (m batchCostModel) Cost(items []job.Item) int64 {
	if len(items) == 0 {
		return 0
	}
	return m.testModel.Cost(items) + m.perBatch
}

func (m batchCostModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	free, err := m.dev.Alloc(m.perBatch)
	if err != nil {
		return nil, err
	}
	defer free()
	return m.testModel.Run(ctx, items)
}

var _ gpu.BatchCoster = batchCostModel{}

// runShortTexts sends n one-item messages of 1 MiB each to a subscriber whose
// budget is budget, with batches of at most maxBatch and a model whose
// batches need perBatch once, and returns once all are deleted.
func runShortTexts(t *testing.T, n, maxBatch int, perBatch, budget int64) *harness {
	t.Helper()
	cfg := Config{MaxBatch: maxBatch, MaxBatchBytes: 1 << 40, MaxBatchDelay: time.Second}
	h := startWith(t, budget+1, cfg, func(h *harness, c *Config) {
		c.Backend = backend.InProcess{Model: batchCostModel{testModel: h.model, perBatch: perBatch}}
	})
	time.Sleep(time.Minute) // the first receive waits for what comes
	synctest.Wait()
	h.sendBurst("short", n, "mb=1 ms=10")
	wait.For(t, time.Minute, "all messages deleted", func() bool { return h.sub.Ledger().Deleted == int64(n) })
	return h
}

// A batch of short texts is charged the per-batch part once, not once per
// message: eight messages of 1 MiB with a 4 MiB per-batch part run as one
// batch in 16 MiB (the last to join needs room for its whole cost while it
// is admitted: 7 + 4 + 5), where charging each 5 MiB would admit three at a
// time.
func TestBatchChargedPerBatchBytesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, perBatch = 8, 4 * mib
		h := runShortTexts(t, n, 32, perBatch, n*mib+2*perBatch)
		if runs := h.model.runs.Load(); runs != 1 {
			t.Errorf("%d runs, want the %d messages as one batch: the per-batch part was charged more than once", runs, n)
		}
		if n := h.dev.OOMs(); n != 0 {
			t.Errorf("%d OOMs", n)
		}
		h.shutdown()
		if err := unreleased(h.sub); err != nil {
			t.Error(err)
		}
	})
}

// The per-batch part is still charged, once for each batch: in batches of
// four, two batches need 2×(4 + 4) = 16 MiB, and in 14 MiB the second waits
// for room, so the device, which each Run really takes its per-batch part
// from, never runs out of memory. Charged for neither batch, the eight
// messages' own 8 MiB (and the last one's whole cost while admitted) would fit and
// both batches would run at once.
func TestBatchStillChargedPerBatchBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, perBatch = 8, 4 * mib
		h := runShortTexts(t, n, 4, perBatch, n*mib+perBatch+2*mib)
		if oom := h.dev.OOMs(); oom != 0 {
			t.Errorf("%d OOMs: a batch was admitted without its per-batch part", oom)
		}
		h.shutdown()
		if err := unreleased(h.sub); err != nil {
			t.Error(err)
		}
	})
}

// sendBurst puts n one-item messages of text on the work queue in one Send,
// under the queue's lock, so that one receive takes all: puts one by one
// let a receive running beside them take the first few alone, now and then.
func (h *harness) sendBurst(jobID string, n int, text string) {
	h.t.Helper()
	var burst []queue.Outgoing
	for i := range n {
		w := job.Work{V: job.Version, JobID: jobID, Chunk: i, Items: []job.Item{{ID: "i0", Text: text}}}
		body, _ := json.Marshal(w)
		burst = append(burst, queue.Outgoing{Body: string(body), Attributes: job.Attributes(w.Key())})
	}
	if _, err := h.work.Send(h.t.Context(), burst); err != nil {
		h.t.Fatal(err)
	}
}
