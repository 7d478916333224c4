package subscriber

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
	"github.com/vramq/vramq/subscriber/queuetest"
)

// BenchmarkAdmission is one admit and release through the admission type, as
// admit and runBatch do for each message: weight, acquire, release. Its
// baseline is the same on a bare semaphore.Weighted ("semaphore").
//
//   - uncontended: one goroutine, the semaphore always has room.
//   - contended: b.RunParallel (GOMAXPROCS goroutines) on one semaphore
//     that has room for all of them: the cost of its mutex under contention.
//   - saturated: 2×GOMAXPROCS goroutines on a semaphore with room for one
//     message (count N=1; vram with a budget of one message): each acquire
//     waits for a release, the cost of the hand-off.
//   - uncontended+deadline: also the context.WithDeadline that admit wraps
//     each acquire in (for AdmitTimeout), the path's full per-message cost.
func BenchmarkAdmission(b *testing.B) {
	const cost = 240 << 10 // a small message of the mixed workload, about 240.8 KiB
	type kind struct {
		name   string
		size   int64 // semaphore size for the baseline
		weight int64
		adm    func(saturated bool) *admission
	}
	mk := func(s Strategy, budget int64, count int) *admission {
		a, err := newAdmission(s, budget, count)
		if err != nil {
			b.Fatal(err)
		}
		return a
	}
	kinds := []kind{
		{"semaphore", 1 << 40, 1, nil},
		{"vram", 0, 0, func(sat bool) *admission {
			if sat {
				return mk(AdmitVRAM, cost, 0)
			}
			return mk(AdmitVRAM, 16<<30, 0)
		}},
		{"count", 0, 0, func(sat bool) *admission {
			if sat {
				return mk(AdmitCount, 0, 1)
			}
			return mk(AdmitCount, 0, 8)
		}},
		{"none", 0, 0, func(sat bool) *admission { return mk(AdmitNone, 0, 0) }},
	}
	// acquireRelease returns one admit+release of the kind.
	acquireRelease := func(k kind, saturated bool) func(ctx context.Context) error {
		if k.adm == nil {
			size := k.size
			if saturated {
				size = 1
			}
			sem := semaphore.NewWeighted(size)
			return func(ctx context.Context) error {
				if err := sem.Acquire(ctx, 1); err != nil {
					return err
				}
				sem.Release(1)
				return nil
			}
		}
		a := k.adm(saturated)
		return func(ctx context.Context) error {
			w := a.weight(cost)
			if err := a.acquire(ctx, w); err != nil {
				return err
			}
			a.giveBack(w)
			return nil
		}
	}
	for _, k := range kinds {
		b.Run(k.name+"/uncontended", func(b *testing.B) {
			b.ReportAllocs()
			op := acquireRelease(k, false)
			ctx := context.Background()
			for b.Loop() {
				if err := op(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(k.name+"/uncontended+deadline", func(b *testing.B) {
			b.ReportAllocs()
			op := acquireRelease(k, false)
			ctx := context.Background()
			for b.Loop() {
				actx, cancel := context.WithDeadline(ctx, time.Now().Add(time.Minute))
				err := op(actx)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, sat := range []bool{false, true} {
			name, par := "/contended", 1
			if sat {
				if k.name == "none" {
					continue // none never waits
				}
				name, par = "/saturated", 2
			}
			b.Run(k.name+name, func(b *testing.B) {
				b.ReportAllocs()
				op := acquireRelease(k, sat)
				ctx := context.Background()
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := op(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkKeeperAck is the keeper's side of acking n messages: n acks
// (each queued for a batched delete) and the flush that sends them in
// DeleteMessageBatch-sized calls to the in-memory queue and takes their
// leases out of the table.
// Its baseline, "direct", is the same deletes called straight on the queue
// in batches of ten, one after another: what any consumer pays. Receiving
// the messages is set-up and not timed.
func BenchmarkKeeperAck(b *testing.B) {
	const visibility = time.Minute
	setup := func(b *testing.B, n int) (*queuetest.Mem, []queue.Message, time.Time) {
		q := queuetest.NewMem()
		for range n {
			q.Put("x", nil)
		}
		start := time.Now()
		msgs, err := q.Receive(context.Background(), n, 0, visibility)
		if err != nil || len(msgs) != n {
			b.Fatalf("received %d of %d: %v", len(msgs), n, err)
		}
		return q, msgs, start
	}
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("keeper/n=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				b.StopTimer()
				q, msgs, start := setup(b, n)
				k, _ := newTestKeeper(q, visibility, time.Hour)
				ls := make([]*lease, n)
				for i, m := range msgs {
					ls[i] = k.hold(m, start)
				}
				b.StartTimer()
				for _, l := range ls {
					k.ack(l)
				}
				if err := k.close(ctx); err != nil {
					b.Fatal(err)
				}
				if got := k.deleted.Load(); got != int64(n) {
					b.Fatalf("%d of %d deleted", got, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
		})
		b.Run(fmt.Sprintf("direct/n=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				b.StopTimer()
				q, msgs, _ := setup(b, n)
				b.StartTimer()
				for i := 0; i < n; i += job.MaxBatch {
					hs := make([]string, 0, job.MaxBatch)
					for _, m := range msgs[i:min(i+job.MaxBatch, n)] {
						hs = append(hs, m.Handle)
					}
					errs, err := q.Delete(ctx, hs)
					if err != nil {
						b.Fatal(err)
					}
					for _, e := range errs {
						if e != nil {
							b.Fatal(e)
						}
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
		})
	}
}
