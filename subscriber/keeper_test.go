package subscriber

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
	"github.com/vramq/vramq/subscriber/queuetest"
)

// slowQueue delays visibility changes, so a finish can arrive while an
// extension is on the wire.
type slowQueue struct {
	*queuetest.Mem
	mu    sync.Mutex // guards calls
	delay time.Duration
	calls []int // entries per ChangeVisibility call
}

func (q *slowQueue) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
	q.mu.Lock()
	q.calls = append(q.calls, len(handles))
	q.mu.Unlock()
	time.Sleep(q.delay)
	return q.Mem.ChangeVisibility(ctx, handles, timeout)
}

func newTestKeeper(q queue.Queue, visibility, maxHold time.Duration) (*keeper, *metrics) {
	m := newMetrics(prometheus.NewRegistry())
	return newKeeper(q, m, slog.New(slog.NewTextHandler(io.Discard, nil)), visibility, maxHold), m
}

// receiveAll takes n messages off q under leases of k.
func receiveAll(t *testing.T, q *queuetest.Mem, k *keeper, n int, visibility time.Duration) []*lease {
	t.Helper()
	var ls []*lease
	for len(ls) < n {
		start := time.Now()
		msgs, err := q.Receive(t.Context(), job.MaxBatch, 0, visibility)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			ls = append(ls, k.hold(m, start))
		}
	}
	return ls
}

func TestKeeperExtendsAllHeldLeasesInBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &slowQueue{Mem: queuetest.NewMem()}
		for range 25 {
			q.Mem.Put("x", nil)
		}
		k, m := newTestKeeper(q, 30*time.Second, time.Hour)
		ctx, cancel := context.WithCancel(t.Context())
		go k.run(ctx)
		ls := receiveAll(t, q.Mem, k, 25, 30*time.Second)

		// Two minutes is four timeouts: without extensions every message
		// would be visible again.
		time.Sleep(2*time.Minute + time.Second) // off the tick
		if _, invisible := q.Stats(); invisible != 25 {
			t.Errorf("%d of 25 held messages invisible after 2m with a 30s timeout", invisible)
		}
		for _, n := range q.calls {
			if n > job.MaxBatch {
				t.Errorf("a visibility call with %d entries", n)
			}
		}
		// All 25 are due together, so each heartbeat is three calls.
		sum := 0
		for _, n := range q.calls {
			sum += n
		}
		if len(q.calls) == 0 || len(q.calls)%3 != 0 || sum != len(q.calls)/3*25 {
			t.Errorf("calls %v: want the 25 leases extended together, in tens", q.calls)
		}
		if got := counter(m.extensions); got != len(q.calls)/3*25 {
			t.Errorf("%d extensions counted for %d calls", got, len(q.calls))
		}
		for _, l := range ls {
			k.ack(l)
		}
		cancel()
		// run must have returned before close, as Run orders them: a flush
		// of its own still starting calls would race close's wait for them.
		synctest.Wait()
		if err := k.close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if live, _ := q.Stats(); live != 0 {
			t.Errorf("%d messages not deleted", live)
		}
		if k.held.Load() != 0 {
			t.Errorf("%d leases still held", k.held.Load())
		}
	})
}

// A delete asked for while an extension is on the wire waits for it, so no
// visibility change ever reaches SQS after the delete.
func TestKeeperNeverExtendsAfterDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &slowQueue{Mem: queuetest.NewMem(), delay: time.Second}
		q.Mem.Put("x", nil)
		k, _ := newTestKeeper(q, 6*time.Second, time.Hour)
		ctx, cancel := context.WithCancel(t.Context())
		go k.run(ctx)
		l := receiveAll(t, q.Mem, k, 1, 6*time.Second)[0]

		// Ticks every 2s; the one at 4s finds 2s left and extends, for 1s.
		time.Sleep(4*time.Second + 500*time.Millisecond)
		k.mu.Lock()
		inflight := l.extending
		k.mu.Unlock()
		if !inflight {
			t.Fatal("test setup: no extension in flight")
		}
		k.ack(l)
		time.Sleep(time.Minute) // many more heartbeats
		cancel()
		// run must have returned before close, as Run orders them: a flush
		// of its own still starting calls would race close's wait for them.
		synctest.Wait()
		if err := k.close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if live, _ := q.Stats(); live != 0 {
			t.Error("message not deleted")
		}
		if len(q.Violations()) > 0 {
			t.Errorf("violations: %q", q.Violations())
		}
		if len(q.calls) != 1 {
			t.Errorf("%d visibility calls; want only the one in flight at the delete", len(q.calls))
		}
		if ls := q.Mem.DeletedHandles(); len(ls) != 1 {
			t.Errorf("deleted %d messages, want 1", len(ls))
		}
	})
}

func TestKeeperLetsGoAfterMaxHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := queuetest.NewMem()
		q.Put("x", nil)
		k, m := newTestKeeper(q, 3*time.Second, 10*time.Second)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go k.run(ctx)
		l := receiveAll(t, q, k, 1, 3*time.Second)[0]
		time.Sleep(20 * time.Second)
		if !l.lost.Load() {
			t.Error("lease not marked lost after max hold")
		}
		if counter(m.leasesLost.WithLabelValues("max_hold")) != 1 {
			t.Error("max-hold loss not counted")
		}
		if _, invisible := q.Stats(); invisible != 0 {
			t.Error("message still invisible 10s after max hold: it was extended past it")
		}
	})
}

// A handle that no longer holds its message (here: deleted behind the
// keeper's back) is noticed at the next extension and the lease marked lost.
func TestKeeperNoticesLostLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := queuetest.NewMem()
		q.Put("x", nil)
		k, m := newTestKeeper(q, 3*time.Second, time.Hour)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go k.run(ctx)
		l := receiveAll(t, q, k, 1, 3*time.Second)[0]
		// Another consumer gets the message after its visibility lapsed:
		// our handle is stale.
		q.Expire(l.msg.Handle)
		if _, err := q.Receive(t.Context(), 1, 0, time.Minute); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		if !l.lost.Load() || counter(m.leasesLost.WithLabelValues("extend")) != 1 {
			t.Errorf("stale handle not noticed: lost=%v", l.lost.Load())
		}
		k.ack(l)
		cancel()
		// run must have returned before close, as Run orders them: a flush
		// of its own still starting calls would race close's wait for them.
		synctest.Wait()
		if err := k.close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if live, _ := q.Stats(); live != 1 {
			t.Error("a delete with a stale handle removed the other consumer's message")
		}
	})
}
