package subscriber_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/promsum"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/subscriber"
)

// The learned batch limit drops while large messages run out of memory
// together, and grows back to -max-batch once only small ones come: the
// workload changes shape, and the limit follows it both ways.
func TestE2EBatchLimitGrowsBack(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	const maxBatch = 8
	state := filepath.Join(t.TempDir(), "state.json")
	// Count admission does not know sizes, so large messages (about 16.3
	// MiB each; the device has room for one) run out of memory together;
	// sixteen at once let batches fill whatever the limit is.
	cfg := subscriber.Config{Admission: subscriber.AdmitCount, Count: 16, MaxBatch: maxBatch,
		MaxBatchDelay: 50 * time.Millisecond, BatchLimitProbeAfter: 2, StateFile: state}
	p := newPipelineWith(t, 5, cfg, nil, func(dev *gpu.Sim) gpu.Model {
		m, err := timed.New(refembed.DefaultConfig(), timed.Timing{Launch: 2 * time.Millisecond, Throughput: 160 << 20}, dev)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	})
	limit := func() int { return int(promsum.Sum(t, p.reg, "vramq_subscriber_batch_limit_messages")) }

	// In rounds until the limit drops: the large messages run out of
	// memory together only when enough are received together, which a slow
	// receive (a loaded machine) may not give in one round (1 CI run failed
	// so).
	for round := 0; round < 3 && (round == 0 || limit() >= maxBatch); round++ {
		large := workload.Mixed(fmt.Sprintf("large-%d", round), 16)
		large.LargeEvery = 1
		p.send(large.Works())
		p.collect(16, 2*time.Minute)
	}
	if got := limit(); got >= maxBatch {
		t.Fatalf("batch limit %d after large messages ran out of memory together; the test does not lower it", got)
	}
	if n := promsum.Labelled(t, p.reg, "vramq_subscriber_batch_limit_changes_total", "cause", "oom"); n == 0 {
		t.Errorf("no batch limit change with cause oom counted")
	}
	lowered := limit()

	// Small messages only, in rounds until the limit is back (each probe
	// waits for two full batches, so a few hundred messages should do).
	small := 0
	for round := 0; round < 5 && limit() < maxBatch; round++ {
		spec := workload.Mixed(fmt.Sprintf("small-%d", round), 100)
		spec.LargeEvery = 0
		p.send(spec.Works())
		p.collect(100, 2*time.Minute)
		small += 100
	}
	t.Logf("limit %d after the large messages, %d after %d small ones; %v probes, %v failed", lowered, limit(), small,
		promsum.Labelled(t, p.reg, "vramq_subscriber_batch_limit_changes_total", "cause", "probe"),
		promsum.Labelled(t, p.reg, "vramq_subscriber_batch_limit_changes_total", "cause", "probe_failed"))
	if got := limit(); got != maxBatch {
		t.Errorf("batch limit %d after %d small messages, want it back at -max-batch %d", got, small, maxBatch)
	}
	if n := promsum.Labelled(t, p.reg, "vramq_subscriber_batch_limit_changes_total", "cause", "probe"); n < 1 {
		t.Errorf("no probe counted")
	}
	if left := p.shutdown(); left != 0 {
		t.Errorf("%d messages left on the work queue", left)
	}
	if d := p.deadLetters(); len(d) != 0 {
		t.Errorf("%d dead letters, first %q", len(d), d[0].Reason)
	}
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		BatchLimit int `json:"batch_limit"`
	}
	if err := json.Unmarshal(b, &f); err != nil || f.BatchLimit != maxBatch {
		t.Errorf("state file %s (%v): want the limit back at %d", b, err, maxBatch)
	}
}
