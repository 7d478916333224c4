package subscriber

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/cputime"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queue"
)

// BenchmarkPipeline is the whole subscriber, from receive to delete, on an
// in-memory queue with a model that computes nothing (timed.Noop): decoding,
// leases, admission, batching, result encoding and the batched result sends
// and deletes. One op is one message of one small item. With no SQS and no
// emulator in it, its time is the CPU the subscriber spends per message of
// its own, which bench overhead can only see mixed with the SDK's and the
// emulator's.
//
// Its baselines run on the same queue, one goroutine receiving ten at a
// time, in line:
//
//   - bare: send a prebuilt result per message, delete the ten: the calls
//     alone, the floor of any consumer;
//   - bare+json: also decode each work message and encode its result with
//     encoding/json, as any consumer of these messages must.
//
// The subscriber runs with bench overhead's settings: prefetch 20,
// max-inflight 100, max-batch 10, JSON logs at info to a discard writer.
func BenchmarkPipeline(b *testing.B) {
	b.Run("bare", func(b *testing.B) { benchBare(b, false) })
	b.Run("bare+json", func(b *testing.B) { benchBare(b, true) })
	b.Run("subscriber", benchSubscriber)
}

// pipeQueue is the benchmark's queue: it makes n work messages of one item
// of four words, hands each out once, in order, and counts deletes and sent
// results. It does no more than that, so that its own cost is small and the
// same for every consumer. Messages are made as they are received, so that
// a large b.N costs no memory up front.
type pipeQueue struct {
	n int

	mu   sync.Mutex
	next int

	deleted atomic.Int64
	sent    atomic.Int64
	done    chan struct{} // closed once every message is deleted
}

var (
	_ queue.Queue  = (*pipeQueue)(nil)
	_ queue.Sender = (*pipeQueue)(nil)
)

func newPipeQueue(n int) *pipeQueue {
	return &pipeQueue{n: n, done: make(chan struct{})}
}

// pipeMessage is the i-th of n work messages, as job.Work would encode it.
func pipeMessage(i, n int) queue.Message {
	c, id := strconv.Itoa(i), "m"+strconv.Itoa(i)
	body := `{"v":1,"job_id":"pipeline","chunk":` + c + `,"chunks":` + strconv.Itoa(n) +
		`,"items":[{"id":"` + c + `","text":"four words of text"}]}`
	return queue.Message{ID: id, Handle: id + "#1", Body: body, ReceiveCount: 1,
		Attributes: job.Attributes(job.Key{JobID: "pipeline", Chunk: i})}
}

func (q *pipeQueue) Receive(ctx context.Context, max int, wait, _ time.Duration) ([]queue.Message, error) {
	q.mu.Lock()
	first := q.next
	k := min(max, q.n-first)
	q.next += k
	q.mu.Unlock()
	if k == 0 {
		// Nothing left: a long poll that finds nothing.
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		return nil, nil
	}
	out := make([]queue.Message, k)
	for j := range out {
		out[j] = pipeMessage(first+j, q.n)
	}
	return out, nil
}

func (q *pipeQueue) Delete(_ context.Context, handles []string) ([]error, error) {
	if q.deleted.Add(int64(len(handles))) == int64(q.n) {
		close(q.done)
	}
	return make([]error, len(handles)), nil
}

func (q *pipeQueue) ChangeVisibility(_ context.Context, handles []string, _ time.Duration) ([]error, error) {
	return make([]error, len(handles)), nil
}

func (q *pipeQueue) Send(_ context.Context, msgs []queue.Outgoing) ([]error, error) {
	q.sent.Add(int64(len(msgs)))
	return make([]error, len(msgs)), nil
}

func benchBare(b *testing.B, decode bool) {
	q := newPipeQueue(b.N)
	results := &pipeQueue{}
	prebuilt := `{"v":1,"job_id":"pipeline","chunk":0,"model":"noop","outputs":[{"id":"0","data":0}],"attempt":1,"worker_ms":0}`
	ctx := b.Context()
	b.ReportAllocs()
	cpu := startCPU()
	b.ResetTimer()
	for q.deleted.Load() < int64(b.N) {
		msgs, err := q.Receive(ctx, job.MaxBatch, time.Second, 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		out := make([]queue.Outgoing, len(msgs))
		handles := make([]string, len(msgs))
		for i, m := range msgs {
			body := prebuilt
			if decode {
				var w job.Work
				if err := json.Unmarshal([]byte(m.Body), &w); err != nil {
					b.Fatal(err)
				}
				r := job.Result{V: job.Version, JobID: w.JobID, Chunk: w.Chunk, Model: "noop", Attempt: m.ReceiveCount,
					Outputs: []job.Output{{ID: w.Items[0].ID, Data: json.RawMessage("0")}}}
				enc, err := json.Marshal(r)
				if err != nil {
					b.Fatal(err)
				}
				body = string(enc)
			}
			out[i] = queue.Outgoing{Body: body, Attributes: m.Attributes}
			handles[i] = m.Handle
		}
		if _, err := results.Send(ctx, out); err != nil {
			b.Fatal(err)
		}
		if _, err := q.Delete(ctx, handles); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu.report(b)
	if n := results.sent.Load(); n != int64(b.N) {
		b.Fatalf("%d results for %d messages", n, b.N)
	}
}

func benchSubscriber(b *testing.B) {
	q := newPipeQueue(b.N)
	results := &pipeQueue{}
	sub, err := New(Config{
		Queue: q, Results: results, DLQ: &pipeQueue{},
		Backend: backend.InProcess{Model: timed.Noop{}}, Device: gpu.NewSim(1 << 30), VRAMReserve: 1 << 20,
		Prefetch: 20, MaxInflight: 100, MaxBatch: 10, WaitTime: time.Second,
		Logger:     slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, stop := context.WithCancel(b.Context())
	defer stop()
	done := make(chan error, 1)
	b.ReportAllocs()
	cpu := startCPU()
	b.ResetTimer()
	go func() { done <- sub.Run(ctx) }()
	select {
	case <-q.done:
	case err := <-done:
		b.Fatalf("the subscriber stopped after %d of %d deletes: %v", q.deleted.Load(), b.N, err)
	}
	b.StopTimer()
	cpu.report(b)
	stop()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if n := results.sent.Load(); n != int64(b.N) {
		b.Fatalf("%d results for %d messages", n, b.N)
	}
}

// The benchmark's messages are what the subscriber takes for valid work.
func TestPipeMessageIsValidWork(t *testing.T) {
	m := pipeMessage(7, 9)
	w, err := job.DecodeWork([]byte(m.Body))
	if err != nil {
		t.Fatal(err)
	}
	if w.JobID != "pipeline" || w.Chunk != 7 || w.Chunks != 9 || len(w.Items) != 1 || w.Items[0].ID != "7" {
		t.Errorf("decoded %+v", w)
	}
}

// cpuClock reads this process's CPU time (cputime.Process). The subscriber
// spreads a message's work over goroutines that run at once, so its ns/op
// (wall time) and its CPU per message differ; cpu-ns/op is the one to
// compare with the bare loops.
type cpuClock struct{ start time.Duration }

func startCPU() cpuClock { return cpuClock{cputime.Process()} }

func (c cpuClock) report(b *testing.B) {
	b.ReportMetric(float64(cputime.Process()-c.start)/float64(b.N), "cpu-ns/op")
}
