package subscriber

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
)

// sizeModel is the test model noting when each Run starts and how many
// items it has.
type sizeModel struct {
	*testModel
	mu     sync.Mutex
	starts []time.Time
	sizes  []int
}

func (m *sizeModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	m.mu.Lock()
	m.starts = append(m.starts, time.Now())
	m.sizes = append(m.sizes, len(items))
	m.mu.Unlock()
	return m.testModel.Run(ctx, items)
}

// A lone message on an idle subscriber runs at once: nothing else is
// queued and no batch is running, so waiting MaxBatchDelay for company
// only delays it.
func TestLoneMessageOnIdleDeviceRunsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = time.Second
		var m *sizeModel
		h := startWith(t, 100*mib, Config{MaxBatch: 8, MaxBatchDelay: delay}, func(h *harness, c *Config) {
			m = &sizeModel{testModel: h.model}
			c.Backend = backend.InProcess{Model: m}
		})
		time.Sleep(time.Minute) // long idle: the poller waits in a receive
		synctest.Wait()
		sent := time.Now()
		h.send("lone", 0, "mb=1 ms=5")
		wait.For(t, time.Minute, "the message deleted", func() bool { return h.sub.Ledger().Deleted == 1 })
		h.shutdown()
		if len(m.starts) != 1 {
			t.Fatalf("%d runs, want 1", len(m.starts))
		}
		if waited := m.starts[0].Sub(sent); waited != 0 {
			t.Errorf("the lone message started %v after it was sent, want at once (MaxBatchDelay %v)", waited, delay)
		}
	})
}

// On an idle device, the messages of one receive go as one batch, at once:
// the first does not leave alone while the rest of its receive is still on
// its way through decoding and admission.
func TestIdleReceiveRunsAsOneBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, delay = 5, time.Second
		var m *sizeModel
		h := startWith(t, 100*mib, Config{MaxBatch: 8, MaxBatchDelay: delay}, func(h *harness, c *Config) {
			m = &sizeModel{testModel: h.model}
			c.Backend = backend.InProcess{Model: m}
		})
		time.Sleep(time.Minute)
		synctest.Wait()
		sent := time.Now()
		h.sendBurst("burst", n, "mb=1 ms=5")
		wait.For(t, time.Minute, "all messages deleted", func() bool { return h.sub.Ledger().Deleted == n })
		h.shutdown()
		if len(m.sizes) != 1 || m.sizes[0] != n {
			t.Errorf("batches of %v, want one of %d", m.sizes, n)
		}
		if waited := m.starts[0].Sub(sent); waited != 0 {
			t.Errorf("the batch started %v after the messages were sent, want at once (MaxBatchDelay %v)", waited, delay)
		}
	})
}

// At saturation batches still fill: messages come one at a time, one every
// 2 ms, faster than batches of one could serve them (20 ms each), so while
// a batch runs the next gathers rather than each message going on its own
// the moment nothing else is waiting.
func TestSaturatedBatchesStillFill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 60
		var m *sizeModel
		h := startWith(t, 100*mib, Config{MaxBatch: 8, MaxBatchDelay: 50 * time.Millisecond}, func(h *harness, c *Config) {
			m = &sizeModel{testModel: h.model}
			c.Backend = backend.InProcess{Model: m}
		})
		for i := range n {
			h.send("busy", i, "mb=1 ms=20")
			time.Sleep(2 * time.Millisecond)
		}
		wait.For(t, time.Minute, "all messages deleted", func() bool { return h.sub.Ledger().Deleted == n })
		h.shutdown()
		if per := float64(n) / float64(len(m.sizes)); per < 4 {
			t.Errorf("%.1f messages per batch at saturation, want at least 4 (MaxBatch 8): %v", per, m.sizes)
		}
		if testing.Verbose() {
			t.Logf("batch sizes %v", m.sizes)
		}
	})
}
