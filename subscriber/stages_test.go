package subscriber

import (
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/wait"
)

// slowReading is a device whose every memory reading takes a while, as
// NVML's can on a busy GPU (the per-process reading most).
type slowReading struct {
	gpu.Device
	took time.Duration
}

func (d slowReading) MemInfo() (gpu.MemInfo, error) {
	time.Sleep(d.took)
	return d.Device.MemInfo()
}

// stageSums reads the sum and count of every stage's histogram, and of
// message_seconds under the name "message".
func stageSums(t *testing.T, h *harness) map[string]*dto.Histogram {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.Histogram{}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "vramq_subscriber_stage_seconds":
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetHistogram()
			}
		case "vramq_subscriber_message_seconds":
			out["message"] = mf.GetMetric()[0].GetHistogram()
		}
	}
	return out
}

// At light load a message waits for nothing in the subscriber: in fake
// time, every stage but its run takes no time at all (the delete's is the
// keeper's batching, after the result is out), and the stage histograms
// say so, once per message. No timer, linger or poll wait is in its way:
// not the batch delay (a second here), not the result linger, and not the
// device reading after the batch, which takes 30 ms here and used to come
// before the results.
func TestLightLoadWaitsForNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const run, reading = 5 * time.Millisecond, 30 * time.Millisecond
		h := startWith(t, 100*mib, Config{MaxBatch: 8, MaxBatchDelay: time.Second}, func(h *harness, c *Config) {
			c.Device = slowReading{h.dev, reading}
			// Debug logging reads the device around each batch, on purpose.
			c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		})
		time.Sleep(time.Minute) // idle: the poller waits in a receive
		synctest.Wait()
		h.send("lone", 0, "mb=1 ms=5")
		wait.For(t, time.Minute, "the delete", func() bool { return h.sub.Ledger().Deleted == 1 })
		h.shutdown()
		got := stageSums(t, h)
		want := map[string]time.Duration{"admit": 0, "batch": 0, "run": run, "encode": 0, "send": 0, "message": run}
		for stage, d := range want {
			hist := got[stage]
			if hist == nil || hist.GetSampleCount() != 1 {
				t.Errorf("stage %s: %v, want one observation", stage, hist)
				continue
			}
			if s := hist.GetSampleSum(); s != d.Seconds() {
				t.Errorf("stage %s took %v, want %v", stage, time.Duration(s*1e9), d)
			}
		}
		if hist := got["delete"]; hist.GetSampleCount() != 1 || hist.GetSampleSum() <= 0 {
			t.Errorf("stage delete: %v, want one observation of the keeper's batching wait", hist)
		}
	})
}
