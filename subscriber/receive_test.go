package subscriber

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queue"
	"github.com/vramq/vramq/subscriber/queuetest"
)

// Messages count as waiting from their receipt, before they are decoded (so
// that the receive that goes out meanwhile asks only for the room left),
// and one that never starts (malformed, too large) stops counting when it
// leaves: otherwise every such message would shrink the prefetch buffer for
// good, and with a buffer of two the good messages behind them would never
// be received.
func TestWaitingCountsEachMessageUntilItStartsOrLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{Prefetch: 2})
		for range 3 {
			h.work.Put("not json", nil)
		}
		h.send("big", 0, "mb=100") // more than the whole device
		for i := range 3 {
			h.send("ok", i, "mb=1 ms=10")
		}
		wait.For(t, time.Minute, "3 results and 4 dead letters", func() bool {
			r, _ := h.results.Stats()
			d, _ := h.dlq.Stats()
			return r == 3 && d == 4
		})
		if w := h.sub.waiting.Load(); w != 0 {
			t.Errorf("%d messages still counted as waiting", w)
		}
		if g := testutil.ToFloat64(h.sub.m.waiting); g != 0 {
			t.Errorf("waiting gauge at %v, want 0", g)
		}
		h.shutdown()
	})
}

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
	m := newMetrics(prometheus.NewRegistry(), backend.DeviceBytes)
	return newKeeper(q, m, slog.New(slog.NewTextHandler(io.Discard, nil)), visibility, maxHold, job.MaxBatch), m
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

// failingDeletes fails every entry of its first fail Delete calls, with an
// error worth retrying, and records when each call came.
type failingDeletes struct {
	*queuetest.Mem
	fail  int
	start time.Time
	mu    sync.Mutex
	at    []time.Duration // of each Delete call, since start
}

func (q *failingDeletes) Delete(ctx context.Context, handles []string) ([]error, error) {
	q.mu.Lock()
	q.at = append(q.at, time.Since(q.start))
	n := len(q.at)
	q.mu.Unlock()
	if n > q.fail {
		return q.Mem.Delete(ctx, handles)
	}
	errs := make([]error, len(handles))
	for i := range errs {
		errs[i] = errors.New("InternalError: injected") // neither lease lost nor refused: worth retrying
	}
	return errs, nil
}

// A delete whose entry fails is retried after 1 s, then 2, 4 and 5 s (each
// with up to half taken off at random), and given up after five calls.
func TestKeeperRetriesEndsWithCappedExponentialBackoff(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fail       int
		wantCalls  int
		wantDelete bool
	}{
		{"succeeds at the eighth call", 7, maxEndAttempts, true},
		{"abandoned after eight calls", 100, maxEndAttempts, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := &failingDeletes{Mem: queuetest.NewMem(), fail: tc.fail}
				q.Mem.Put("x", nil)
				// A long visibility: the ending lease, no longer extended,
				// outlives the retries.
				k, _ := newTestKeeper(q, time.Hour, 2*time.Hour)
				ctx, cancel := context.WithCancel(t.Context())
				go k.run(ctx)
				l := receiveAll(t, q.Mem, k, 1, time.Hour)[0]
				q.start = time.Now()
				k.ack(l)
				time.Sleep(time.Minute)
				cancel()
				synctest.Wait()
				if err := k.close(t.Context()); err != nil {
					t.Fatal(err)
				}
				q.mu.Lock()
				at := q.at
				q.mu.Unlock()
				if len(at) != tc.wantCalls {
					t.Fatalf("Delete calls at %v, want %d calls", at, tc.wantCalls)
				}
				for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second,
					5 * time.Second, 5 * time.Second} {
					if gap := at[i+1] - at[i]; gap < want/2 || gap > want {
						t.Errorf("retry %d came %v after the call before, want %v to %v (calls at %v)", i+1, gap, want/2, want, at)
					}
				}
				if live, _ := q.Stats(); (live == 0) != tc.wantDelete {
					t.Errorf("%d messages live; deleted: want %v", live, tc.wantDelete)
				}
				abandoned := int64(0)
				if !tc.wantDelete {
					abandoned = 1
				}
				if k.abandoned.Load() != abandoned || k.held.Load() != 0 {
					t.Errorf("abandoned %d, held %d; want %d and 0", k.abandoned.Load(), k.held.Load(), abandoned)
				}
			})
		})
	}
}

// Close waits for ends still being retried until its context ends, then
// reports them and stops their retries.
func TestKeeperCloseGivesUpOnFailingEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &failingDeletes{Mem: queuetest.NewMem(), fail: 100}
		q.Mem.Put("x", nil)
		k, _ := newTestKeeper(q, time.Hour, 2*time.Hour)
		l := receiveAll(t, q.Mem, k, 1, time.Hour)[0]
		k.ack(l)
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		if err := k.close(ctx); err == nil {
			t.Fatal("close returned nil with a delete still failing")
		}
		q.mu.Lock()
		calls := len(q.at)
		q.mu.Unlock()
		time.Sleep(time.Minute)
		q.mu.Lock()
		defer q.mu.Unlock()
		if len(q.at) != calls {
			t.Errorf("%d Delete calls after close gave up", len(q.at)-calls)
		}
		if k.held.Load() != 1 || k.abandoned.Load() != 0 {
			t.Errorf("held %d, abandoned %d; want the lease left held, not counted", k.held.Load(), k.abandoned.Load())
		}
	})
}

// recordingQueue records each Delete and ChangeVisibility call.
type recordingQueue struct {
	*queuetest.Mem
	mu    sync.Mutex
	calls []string // "delete n" or "visibility n timeout"
}

func (q *recordingQueue) Delete(ctx context.Context, handles []string) ([]error, error) {
	q.mu.Lock()
	q.calls = append(q.calls, fmt.Sprintf("delete %d", len(handles)))
	q.mu.Unlock()
	return q.Mem.Delete(ctx, handles)
}

func (q *recordingQueue) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
	q.mu.Lock()
	q.calls = append(q.calls, fmt.Sprintf("visibility %d %v", len(handles), timeout))
	q.mu.Unlock()
	return q.Mem.ChangeVisibility(ctx, handles, timeout)
}

// Ends that wait together go in one call per kind: the deletes in one, the
// releases in one per delay.
func TestKeeperSendsOneCallPerKindOfEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &recordingQueue{Mem: queuetest.NewMem()}
		for range 7 {
			q.Mem.Put("x", nil)
		}
		k, _ := newTestKeeper(q, time.Minute, time.Hour)
		ctx, cancel := context.WithCancel(t.Context())
		go k.run(ctx)
		ls := receiveAll(t, q.Mem, k, 7, time.Minute)
		k.release(ls[0], 5*time.Second)
		k.ack(ls[1])
		k.release(ls[2], 0)
		k.ack(ls[3])
		k.release(ls[4], 5*time.Second)
		k.release(ls[5], 0)
		k.ack(ls[6])
		time.Sleep(time.Second)
		synctest.Wait()
		q.mu.Lock()
		got := slices.Sorted(slices.Values(q.calls))
		q.mu.Unlock()
		want := []string{"delete 3", "visibility 2 0s", "visibility 2 5s"}
		if !slices.Equal(got, want) {
			t.Errorf("calls %q, want %q", got, want)
		}
		cancel()
		synctest.Wait()
		if err := k.close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if k.deleted.Load() != 3 || k.released.Load() != 4 || k.held.Load() != 0 {
			t.Errorf("deleted %d, released %d, held %d; want 3, 4, 0", k.deleted.Load(), k.released.Load(), k.held.Load())
		}
	})
}

// The start flow reads how many may wait from how fast waiting messages
// start: Prefetch before it has seen enough, and where they start fast; one
// where each waits a minute; and an hour with nothing waiting (an empty
// queue) is no evidence of slow starts.
func TestStartFlowKeepsWhatStartsWithinTarget(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	const most, target = 20, 30 * time.Second
	cases := []struct {
		name  string
		every time.Duration // one start each, with messages waiting throughout
		for_  time.Duration
		// want is 30 s of starts at the rate, rounded up; one more just
		// after a start, which the decayed count reads at its height.
		lo, hi int
	}{
		{"too little seen", time.Second, 2 * time.Second, most, most},
		{"a start a second", time.Second, 5 * time.Minute, most, most},
		{"a start every 5 s", 5 * time.Second, 5 * time.Minute, 6, 7},
		{"a start a minute", time.Minute, 10 * time.Minute, 1, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := startFlow{tau: time.Minute}
			f.advance(t0, false)
			now := t0
			for now.Sub(t0) < c.for_ {
				now = now.Add(c.every)
				f.advance(now, true)
				f.starts++
			}
			if got := f.depth(now, true, most, target); got < c.lo || got > c.hi {
				t.Errorf("depth %d after %v of a start every %v; want %d to %d", got, c.for_, c.every, c.lo, c.hi)
			}
		})
	}
	t.Run("an idle hour after slow starts", func(t *testing.T) {
		f := startFlow{tau: time.Minute}
		f.advance(t0, false)
		now := t0
		for range 10 {
			now = now.Add(time.Minute)
			f.advance(now, true)
			f.starts++
		}
		if got := f.depth(now, false, most, target); got != 1 {
			t.Fatalf("depth %d after a start a minute; want 1", got)
		}
		if got := f.depth(now.Add(time.Hour), false, most, target); got != most {
			t.Errorf("depth %d after an hour with nothing waiting; want %d (Prefetch)", got, most)
		}
	})
}
