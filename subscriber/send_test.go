package subscriber

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// sendLog is a results queue for the outbox alone: it records each call's
// bodies and time, and can fail entries or hold calls.
type sendLog struct {
	mu    sync.Mutex
	calls [][]string
	at    []time.Duration // since start
	start time.Time
	fail  func(body string) error // an entry's error; nil for none
	hold  chan struct{}           // when set, each call waits for it to be closed
}

func (l *sendLog) send(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
	if l.hold != nil {
		<-l.hold
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var bodies []string
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		bodies = append(bodies, m.Body)
		if l.fail != nil {
			errs[i] = l.fail(m.Body)
		}
	}
	l.calls = append(l.calls, bodies)
	l.at = append(l.at, time.Since(l.start))
	return errs, nil
}

// sizes returns the entries of each call so far.
func (l *sendLog) sizes() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n []int
	for _, c := range l.calls {
		n = append(n, len(c))
	}
	return n
}

// told records what the outbox told about each entry.
type told struct {
	mu   sync.Mutex
	errs map[*task]error
}

func (s *told) done(t *task, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, twice := s.errs[t]; twice {
		panic("an entry told twice")
	}
	s.errs[t] = err
}

func (s *told) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errs)
}

func newTestOutbox(l *sendLog, s *told) *outbox {
	l.start = time.Now()
	s.errs = map[*task]error{}
	return outboxWith(l.send, s.done, job.MaxBatch, 1000, 100*time.Millisecond)
}

// results makes n results of size bytes each as SQS counts them, with
// bodies name-0, name-1... and an attribute that makes up the rest: the
// outbox must count attributes as SQS does (issue 14, item 5).
func someResults(name string, n, size int) []outResult {
	rs := make([]outResult, n)
	for i := range rs {
		body := fmt.Sprintf("%s-%d", name, i)
		rs[i] = outResult{msg: queue.Outgoing{Body: body}, t: &task{}}
		if pad := size - len(body) - len("pad") - len(job.AttrDataType); pad > 0 {
			rs[i].msg.Attributes = map[string]string{"pad": strings.Repeat("x", pad)}
			if got := job.MessageSize(body, rs[i].msg.Attributes); got != size {
				panic(fmt.Sprintf("someResults: made %d bytes, want %d", got, size))
			}
		}
	}
	return rs
}

func TestOutboxSharesCallsAcrossBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l sendLog
		var s told
		o := newTestOutbox(&l, &s)
		// Three device batches: the third fills a call, which its own
		// goroutine sends before add returns.
		o.add(someResults("a", 3, 10), 0)
		o.add(someResults("b", 4, 10), 0)
		if n := l.sizes(); len(n) != 0 {
			t.Fatalf("calls %v before ten results or the linger", n)
		}
		o.add(someResults("c", 3, 10), 0)
		if n := l.sizes(); !slices.Equal(n, []int{10}) {
			t.Fatalf("calls %v, want one of 10", n)
		}
		if got := l.calls[0]; got[0] != "a-0" || got[9] != "c-2" {
			t.Errorf("call holds %q, want the results in the order they came", got)
		}
		// A partial call waits its linger, then goes.
		o.add(someResults("d", 2, 10), 0)
		time.Sleep(99 * time.Millisecond)
		synctest.Wait()
		if n := l.sizes(); len(n) != 1 {
			t.Fatalf("calls %v after 99ms of a 100ms linger", n)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if n := l.sizes(); !slices.Equal(n, []int{10, 2}) {
			t.Fatalf("calls %v, want [10 2]", n)
		}
		if s.count() != 12 {
			t.Errorf("%d entries told, want 12", s.count())
		}
	})
}

func TestOutboxBoundsCallPayload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l sendLog
		var s told
		o := newTestOutbox(&l, &s) // 1000 bytes a call
		o.add(someResults("a", 7, 300), 0)
		if n := l.sizes(); !slices.Equal(n, []int{3, 3}) {
			t.Fatalf("calls %v, want two of 3 (900 of 1000 bytes each) at once", n)
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if n := l.sizes(); !slices.Equal(n, []int{3, 3, 1}) {
			t.Fatalf("calls %v, want the seventh after its linger", n)
		}
	})
}

// A linger timer armed before a call was cut must not send the next
// results early, in a small call.
func TestOutboxLingerStartsWithEachCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l sendLog
		var s told
		o := newTestOutbox(&l, &s)
		o.add(someResults("a", 3, 10), 0) // linger until 100ms
		time.Sleep(90 * time.Millisecond)
		o.add(someResults("b", 7, 10), 0) // a full call at 90ms
		time.Sleep(5 * time.Millisecond)
		o.add(someResults("c", 1, 10), 0) // its own linger: until 195ms
		time.Sleep(time.Second)
		synctest.Wait()
		if n := l.sizes(); !slices.Equal(n, []int{10, 1}) {
			t.Fatalf("calls %v, want [10 1]", n)
		}
		if l.at[1] != 195*time.Millisecond {
			t.Errorf("the lone result went at %v, want 195ms (95ms + the linger)", l.at[1])
		}
	})
}

func TestOutboxReportsEachEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l sendLog
		var s told
		o := newTestOutbox(&l, &s)
		l.fail = func(body string) error {
			if body == "a-4" {
				return errors.New("InternalError")
			}
			return nil
		}
		rs := someResults("a", 10, 10)
		o.add(rs, 0)
		for i, r := range rs {
			if err := s.errs[r.t]; (err != nil) != (i == 4) {
				t.Errorf("entry %d: error %v; want one for entry 4 only", i, err)
			}
		}
	})
}

// Close sends what lingers at once, and returns only after every call,
// including one another goroutine is making, has answered.
func TestOutboxCloseSendsAndWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l sendLog
		var s told
		o := newTestOutbox(&l, &s)
		l.hold = make(chan struct{})
		go o.add(someResults("full", 10, 10), 0) // a runner, sending
		o.add(someResults("late", 2, 10), 0)     // lingering
		synctest.Wait()
		var closed atomic.Bool
		go func() {
			o.close()
			closed.Store(true)
		}()
		synctest.Wait()
		if closed.Load() {
			t.Fatal("close returned while calls were unanswered")
		}
		start := time.Now()
		close(l.hold)
		synctest.Wait()
		if !closed.Load() {
			t.Fatal("close did not return once the calls answered")
		}
		if time.Since(start) != 0 || s.count() != 12 {
			t.Errorf("after %v, %d of 12 told; want all, without waiting for the linger", time.Since(start), s.count())
		}
	})
}

// setLingers makes results and deletes wait for company for d, results as
// if more were always on their way.
func (h *harness) setLingers(d time.Duration) {
	o, k := h.sub.outbox, h.sub.keeper
	o.mu.Lock()
	o.more = func() bool { return true }
	o.mu.Unlock()
	// Nothing is pending yet: the batchers can be swapped for ones that
	// wait d, before the first message is sent.
	o.calls = o.newCalls(h.sub.fullCall(), h.sub.cfg.MaxMessageBytes, d)
	k.ends = k.newEnds(h.sub.fullCall(), d)
}

func (h *harness) outboxPending() int { return h.sub.outbox.calls.Len() }

// Small device batches share result calls, and then delete calls.
func TestResultsOfSeveralBatchesShareOneCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{MaxBatch: 2})
		for i := range 10 {
			h.send("job", i, "mb=1 ms=50")
		}
		wait.For(t, time.Minute, "10 messages deleted", func() bool { live, _ := h.work.Stats(); return live == 0 })
		h.shutdown()
		got, dups := h.resultsByKey()
		if len(got) != 10 || dups != 0 {
			t.Fatalf("%d results, %d duplicates", len(got), dups)
		}
		if n := observations(h.sub.m.batchSize); n < 5 {
			t.Errorf("%d device batches; the test needs batches of 2", n)
		}
		if n := h.results.Calls("Send"); n != 1 {
			t.Errorf("%d SendMessageBatch calls for 10 results of 5 batches, want 1", n)
		}
		if n := h.work.Calls("Delete"); n != 1 {
			t.Errorf("%d DeleteMessageBatch calls, want 1", n)
		}
	})
}

// One entry of a shared call failing releases that message alone, for a
// retry; the others in the call are deleted.
func TestFailedResultEntryReleasesOnlyItsMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{MaxBatch: 2, RetryDelay: time.Second})
		var failed atomic.Bool
		h.results.SendErr = func(body string) error {
			if strings.Contains(body, `"job_id":"bad"`) && failed.CompareAndSwap(false, true) {
				return errors.New("injected InternalError")
			}
			return nil
		}
		for i := range 3 {
			h.send("good", i, "mb=1 ms=50")
		}
		h.send("bad", 0, "mb=1 ms=50")
		wait.For(t, time.Minute, "4 results", func() bool { r, _ := h.results.Stats(); return r == 4 })
		h.shutdown()
		got, _ := h.resultsByKey()
		for k, r := range got {
			want := 1
			if k.JobID == "bad" {
				want = 2
			}
			if r.Attempt != want {
				t.Errorf("%v: result at attempt %d, want %d", k, r.Attempt, want)
			}
		}
		if n := counter(h.sub.m.released.WithLabelValues("backoff")); n != 1 {
			t.Errorf("%d messages released for a retry, want 1", n)
		}
		if n := h.results.Calls("Send"); n != 2 {
			t.Errorf("%d SendMessageBatch calls, want 2: the four results, then the retry", n)
		}
		if l := h.sub.Ledger(); l.Deleted != 4 || l.Released != 1 {
			t.Errorf("ledger %+v, want 4 deleted and 1 released", l)
		}
	})
}

// Shutdown sends the results still waiting for company, then deletes their
// messages, without waiting out the linger.
func TestShutdownFlushesLingeringResults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{})
		h.setLingers(time.Hour)
		for i := range 3 {
			h.send("job", i, "mb=1 ms=10")
		}
		wait.For(t, time.Minute, "3 results waiting in the outbox", func() bool { return h.outboxPending() == 3 })
		if r, _ := h.results.Stats(); r != 0 {
			t.Fatalf("%d results sent before the linger or shutdown", r)
		}
		begin := time.Now()
		h.shutdown()
		if took := time.Since(begin); took > time.Minute {
			t.Errorf("shutdown took %v: it waited for the linger", took)
		}
		if r, _ := h.results.Stats(); r != 3 {
			t.Errorf("%d results sent, want 3", r)
		}
		if live, _ := h.work.Stats(); live != 0 {
			t.Errorf("%d messages left on the work queue", live)
		}
		if l := h.sub.Ledger(); l.Deleted != 3 {
			t.Errorf("ledger %+v, want 3 deleted", l)
		}
	})
}

// A result waiting for company holds neither admission (the next message
// runs meanwhile) nor a lease that can lapse (heartbeats go on).
func TestLingeringResultFreesAdmissionAndKeepsItsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{Visibility: 3 * time.Second, MaxBatch: 1})
		h.setLingers(20 * time.Second)
		h.send("first", 0, "mb=40 ms=10")
		wait.For(t, time.Minute, "the first result waiting", func() bool { return h.outboxPending() == 1 })
		h.send("second", 0, "mb=40 ms=10") // 80 MiB of 64 with the first's
		wait.For(t, 5*time.Second, "the second to run", func() bool { return h.model.runs.Load() == 2 })
		if n := h.outboxPending(); n == 0 {
			t.Fatal("the first result went before the second ran; the test needs it waiting")
		}
		wait.For(t, time.Minute, "both messages deleted", func() bool { return h.sub.Ledger().Deleted == 2 })
		h.shutdown()
		got, dups := h.resultsByKey()
		if len(got) != 2 || dups != 0 || got[job.Key{JobID: "first"}].Attempt != 1 {
			t.Errorf("results %v, %d duplicates; want each once, at its first attempt", got, dups)
		}
		if n := counter(h.sub.m.extensions); n == 0 {
			t.Error("no visibility extension while results waited 20s under a 3s timeout")
		}
		if n := counter(h.sub.m.leasesLost.WithLabelValues("delete")); n != 0 {
			t.Errorf("%d leases lost at delete", n)
		}
	})
}

// Under -max-inflight below ten a call can never gather ten: results and
// deletes go once every message that can be held is in the call, rather
// than wait for company that cannot come while receiving waits for them.
func TestLingerGivesWayToTheInflightBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{MaxInflight: 2, Prefetch: 2})
		h.setLingers(time.Hour)
		for i := range 6 {
			h.send("job", i, "mb=1 ms=10")
		}
		begin := time.Now()
		wait.For(t, 2*time.Hour, "6 messages deleted", func() bool { return h.sub.Ledger().Deleted == 6 })
		if took := time.Since(begin); took > time.Minute {
			t.Errorf("6 messages took %v with -max-inflight=2: results or deletes waited for company", took)
		}
		h.shutdown()
		if r, _ := h.results.Stats(); r != 6 {
			t.Errorf("%d results, want 6", r)
		}
	})
}

// A partial call lingers only while more results may come: with nothing else
// running or waiting, the last result of a burst, or a lone message under
// light traffic, goes at once rather than after the linger.
func TestOutboxSendsAtOnceWhenNothingElseIsComing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l sendLog
		var s told
		o := newTestOutbox(&l, &s)
		var running atomic.Bool
		running.Store(true)
		o.more = running.Load
		o.add(someResults("a", 3, 10), 0)
		synctest.Wait()
		if n := l.sizes(); len(n) != 0 {
			t.Fatalf("calls %v while other messages were running: want the results waiting for company", n)
		}
		running.Store(false) // the last batch returns
		o.add(someResults("b", 2, 10), 0)
		synctest.Wait()
		if n := l.sizes(); !slices.Equal(n, []int{5}) || time.Since(l.start) != 0 {
			t.Fatalf("calls %v after %v; want one of 5 at once", n, time.Since(l.start))
		}
		o.add(someResults("c", 1, 10), 0) // a lone message, light traffic
		synctest.Wait()
		if n := l.sizes(); !slices.Equal(n, []int{5, 1}) || time.Since(l.start) != 0 {
			t.Errorf("calls %v after %v; want the lone result sent at once", n, time.Since(l.start))
		}
		o.close()
		if s.count() != 6 {
			t.Errorf("%d entries told, want 6", s.count())
		}
	})
}

// Two batches that return at once both stop counting as running before
// either adds its results. Their promises keep the first from sending alone:
// one call carries both.
func TestOutboxWaitsForPromisedResults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l sendLog
		var s told
		o := newTestOutbox(&l, &s)
		o.more = func() bool { return false } // both batches have returned
		o.promise(2)
		o.promise(2)
		o.add(someResults("a", 2, 10), 2)
		synctest.Wait()
		if n := l.sizes(); len(n) != 0 {
			t.Fatalf("calls %v with another batch's results promised: want the first waiting", n)
		}
		o.add(someResults("b", 1, 10), 2) // one of b's tasks went to the DLQ
		synctest.Wait()
		if n := l.sizes(); !slices.Equal(n, []int{3}) || time.Since(l.start) != 0 {
			t.Fatalf("calls %v after %v; want one of 3 at once", n, time.Since(l.start))
		}
		o.close()
		if s.count() != 3 {
			t.Errorf("%d entries told, want 3", s.count())
		}
	})
}

// A call SQS refuses as a whole and for good is sent again in halves, so the
// one result it cannot take fails alone, permanently, and its neighbours go
// out (issue 14, item 5).
func TestOutboxIsolatesARefusedEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s told
		var calls atomic.Int32
		o := outboxWith(nil, s.done, job.MaxBatch, 1<<20, time.Millisecond)
		o.send = func(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
			calls.Add(1)
			for _, m := range msgs {
				if m.Body == "a-3" {
					return nil, &queue.Error{Kind: queue.ErrRefused, Code: "BatchRequestTooLong"}
				}
			}
			return make([]error, len(msgs)), nil
		}
		s.errs = map[*task]error{}
		rs := someResults("a", 10, 10)
		o.add(rs, 0)
		o.close()
		for i, r := range rs {
			err, ok := s.errs[r.t]
			switch {
			case !ok:
				t.Errorf("result %d never told", i)
			case i == 3 && !permanent(err):
				t.Errorf("the refused result told with %v; want a permanent refusal", err)
			case i != 3 && err != nil:
				t.Errorf("result %d told with %v; want sent", i, err)
			}
		}
		if n := calls.Load(); n > 9 {
			t.Errorf("%d calls for 10 results; halving needs at most 9", n)
		}
	})
}
