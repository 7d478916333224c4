package subscriber

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queuetest"
)

// serialModel is a device that runs one batch at a time (one stream, one
// process, as most inference servers drive a GPU), so a batch's fixed cost is
// paid in series and the batch size sets the throughput: each batch takes
// launch, then per for each message, and needs its messages' memory (an
// item "big" 6 MiB, any other 1 MiB) from the simulated device, allocated
// after the launch as a framework does, so a batch that does not fit has
// paid its launch.
type serialModel struct {
	dev         *gpu.Sim
	launch, per time.Duration
	mu          sync.Mutex
}

func (m *serialModel) Name() string   { return "serial" }
func (m *serialModel) Weights() int64 { return 0 }

// Cost is 1 per item: the benchmark runs under count admission, which
// does not look at it.
func (m *serialModel) Cost(items []job.Item) int64 { return int64(len(items)) }

func (m *serialModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	time.Sleep(m.launch)
	var need int64
	for _, it := range items {
		need += mib
		if strings.HasPrefix(it.Text, "big") {
			need += 5 * mib
		}
	}
	free, err := m.dev.Alloc(need)
	if err != nil {
		return nil, err
	}
	defer free()
	time.Sleep(time.Duration(len(items)) * m.per)
	outs := make([]job.Output, len(items))
	for i, it := range items {
		outs[i] = job.Output{ID: it.ID, Embedding: []float32{1}}
	}
	return outs, ctx.Err()
}

// BenchmarkBatchLimitGrowBack is a workload that changes shape halfway: 64
// large messages, which run out of memory in batches of more than two and
// lower the learned limit from 8 to 2, then 2,048 small ones, of which 8 fit
// in a batch. It reports the small half's throughput with the limit growing
// back (the default -batch-limit-probe-after, 32) and without (negative: the
// limit stays at 2), each on a fresh subscriber in the same iteration, their
// ratio, and the limit each ended at. The device runs one batch at a time,
// 4 ms of launch plus 0.25 ms per message: batches of 2 make at most 444
// messages/s, of 8 1,333.
//
// Count admission (which does not look at sizes, so the large messages do
// run out of memory) is set above -max-inflight so that it never blocks:
// when admission is full, the batcher sends what it holds at once, and
// batches then take the size of the ones whose end freed the room, so a
// raised limit would never fill (see bench/README.md).
func BenchmarkBatchLimitGrowBack(b *testing.B) {
	var on, off, limOn, limOff float64
	runs := 0
	for b.Loop() {
		r, l := growBackRun(b, 0)
		on, limOn = on+r, limOn+float64(l)
		r, l = growBackRun(b, -1)
		off, limOff = off+r, limOff+float64(l)
		runs++
	}
	n := float64(runs)
	b.ReportMetric(on/n, "grow-msgs/s")
	b.ReportMetric(off/n, "fixed-msgs/s")
	b.ReportMetric(on/off, "ratio")
	b.ReportMetric(limOn/n, "grow-limit")
	b.ReportMetric(limOff/n, "fixed-limit")
	b.ReportMetric(0, "ns/op")
}

// growBackRun runs the two halves on a fresh subscriber and returns the
// second half's throughput, in messages per second, and the limit at the end.
func growBackRun(b *testing.B, probeAfter int) (float64, int) {
	const large, small = 64, 2048
	work, results, dlq := queuetest.NewMem(), queuetest.NewMem(), queuetest.NewMem()
	dev := gpu.NewSim(16 * mib)
	cfg := Config{Queue: work, Results: results, DLQ: dlq, Device: dev,
		Backend:   backend.InProcess{Model: &serialModel{dev: dev, launch: 4 * time.Millisecond, per: 250 * time.Microsecond}},
		Admission: AdmitCount, Count: 200, MaxBatch: 8, MaxBatchDelay: 20 * time.Millisecond, VRAMReserve: 1,
		WaitTime: time.Second, BatchLimitProbeAfter: probeAfter,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry()}
	sub, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	put := func(text string, from, n int) {
		for i := from; i < from+n; i++ {
			w := job.Work{V: job.Version, JobID: "shape", Chunk: i, Items: []job.Item{{ID: "0", Text: text}}}
			body, _ := json.Marshal(w)
			work.Put(string(body), job.Attributes(w.Key()))
		}
	}
	wait := func(n int) {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			r, _ := results.Stats()
			if r >= n {
				return
			}
			if d, _ := dlq.Stats(); d > 0 || time.Now().After(deadline) {
				b.Fatalf("%d results of %d, %d dead letters", r, n, d)
			}
			time.Sleep(time.Millisecond)
		}
	}
	put("big", 0, large)
	wait(large)
	if l := sub.state.batchLimit(); l != 2 && l != 3 {
		b.Fatalf("batch limit %d after the large half, want it lowered to 2 (or probing 3)", l)
	}
	start := time.Now()
	put("small", large, small)
	wait(large + small)
	took := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return small / took.Seconds(), sub.state.batchLimit()
}
