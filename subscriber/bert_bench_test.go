package subscriber

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/cputime"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/bert"
	"github.com/vramq/vramq/subscriber/queuetest"
)

// arrivalOrder is a BERT model without its length classes: the subscriber
// then batches messages in the order they arrive, as it does any model.
type arrivalOrder struct {
	gpu.Model
	gpu.Launcher
	gpu.WorkingSet
}

// BenchmarkLengthBatching is the whole subscriber, on in-memory queues,
// serving a generated BERT (hidden 64, 2 layers, max_seq_length 128, the
// real tokenizer) on the bimodal workload (workload.Mixed: one message in
// five of 32 texts of 600 words, cut at 128 tokens; the rest of 8 texts of
// 24 words, about 60 tokens), batched by arrival order (the baseline) and
// by length class. One op is the whole workload of 40 messages once each
// way, alternately, so that both see the same machine. It reports, for
// arrival and classes:
//
//   - items/cpu-s: texts embedded per second of the process's CPU time
//     (wall time swings with the other work on a shared machine), and
//     classes/arrival, their ratio;
//   - waste-%: token rows computed beyond the texts' own tokens, in
//     percent of those (the model pads each length bucket's sub-batch to
//     its longest);
//   - onebatch-waste-%: what padding each device batch to its longest
//     text would have computed beyond the tokens, which is what batching
//     by arrival order costs a model without length buckets.
func BenchmarkLengthBatching(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "bench-bert")
	g := bert.Generated{Config: bert.Config{VocabSize: 30522, HiddenSize: 64, NumLayers: 2, NumHeads: 2,
		IntermediateSize: 256, MaxPositionEmbeddings: 128, TypeVocabSize: 2, LayerNormEps: 1e-12}, MaxSeqLength: 128, Seed: 1}
	if err := bert.Generate(dir, "../model/wordpiece/testdata/tokenizer", g); err != nil {
		b.Fatal(err)
	}
	works := workload.Mixed("length-batching", 40).Works()
	items := 0
	for _, w := range works {
		items += len(w.Items)
	}
	type mode struct {
		name  string
		dev   *gpu.Sim
		e     *bert.Embedder
		model gpu.Model
		cpu   float64
	}
	var modes []*mode
	for _, name := range []string{"arrival", "classes"} {
		m := &mode{name: name, dev: gpu.NewSim(1 << 30)}
		var err error
		if m.e, err = bert.Open(dir, m.dev); err != nil {
			b.Fatal(err)
		}
		m.model = m.e
		if name == "arrival" {
			m.model = arrivalOrder{m.e, m.e, m.e}
		}
		modes = append(modes, m)
	}
	for b.Loop() {
		for _, m := range modes {
			m.cpu += runWorkload(b, m.model, m.dev, works)
		}
	}
	rate := map[string]float64{}
	for _, m := range modes {
		p := m.e.Padding()
		rate[m.name] = float64(items*b.N) / m.cpu
		b.ReportMetric(rate[m.name], m.name+"-items/cpu-s")
		b.ReportMetric(100*float64(p.Computed-p.Tokens)/float64(p.Tokens), m.name+"-waste-%")
		b.ReportMetric(100*float64(p.OneBatch-p.Tokens)/float64(p.Tokens), m.name+"-onebatch-waste-%")
	}
	b.ReportMetric(rate["classes"]/rate["arrival"], "classes/arrival")
}

// runWorkload puts works on a fresh queue and runs a subscriber of model
// until every message is deleted, and returns the CPU seconds that took.
func runWorkload(b *testing.B, model gpu.Model, dev *gpu.Sim, works []job.Work) float64 {
	q, results := queuetest.NewMem(), queuetest.NewMem()
	for _, w := range works {
		body, err := json.Marshal(w)
		if err != nil {
			b.Fatal(err)
		}
		q.Put(string(body), job.Attributes(w.Key()))
	}
	sub, err := New(Config{
		Queue: q, Results: results, DLQ: queuetest.NewMem(), Backend: backend.InProcess{Model: model}, Device: dev, VRAMReserve: 1 << 20,
		Prefetch: 20, MaxInflight: 100, MaxBatch: 8, WaitTime: time.Second,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, stop := context.WithCancel(b.Context())
	done := make(chan error, 1)
	cpu := cputime.Process()
	go func() { done <- sub.Run(ctx) }()
	for sub.Ledger().Deleted < int64(len(works)) {
		select {
		case err := <-done:
			b.Fatalf("the subscriber stopped after %d of %d deletes: %v", sub.Ledger().Deleted, len(works), err)
		case <-time.After(time.Millisecond):
		}
	}
	b.StopTimer() // the shutdown is not the workload's
	defer b.StartTimer()
	used := cputime.Process() - cpu
	stop()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return used.Seconds()
}
