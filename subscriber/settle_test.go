package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/smithy-go"

	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
)

// Issue 25, items 5, 6, 7 and 13: completion events that a forged message
// cannot settle early, that a many-chunk job cannot starve, that count
// refused items, and that need no read of a missing done marker.

// putManifestItems writes job jobID's manifest, chunk c holding items[c]
// items.
func putManifestItems(t *testing.T, p *memPayloads, jobID string, items ...int) {
	t.Helper()
	m := job.Manifest{V: job.Version, JobID: jobID, Chunks: len(items), ChunkItems: items, CreatedAt: time.Now().UTC()}
	for _, n := range items {
		m.Items += n
	}
	b, _ := json.Marshal(m)
	if _, err := p.Put(context.Background(), job.ManifestKey(jobID), b); err != nil {
		t.Fatal(err)
	}
}

// doneMarker is revision rev of jobID's done marker as JSON fields; nil when
// there is none.
func doneMarker(t *testing.T, p *memPayloads, jobID string, rev int) map[string]any {
	t.Helper()
	key := job.DoneKey(jobID)
	if rev > 1 {
		key = "done/" + jobID + "." + fmt.Sprint(rev) + ".json"
	}
	b, ok := p.object(key)
	if !ok {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("done marker %s: %v", b, err)
	}
	return m
}

// eventsOf is the events sink received for jobID, in order.
func eventsOf(sink *memSink, jobID string) []job.CompletionEvent {
	_, all := sink.sent()
	var out []job.CompletionEvent
	for _, ev := range all {
		if ev.JobID == jobID {
			out = append(out, ev)
		}
	}
	return out
}

// Item 5: a message that does not decode as work writes no failed marker,
// whatever job and chunk its body names, so it cannot settle the job before
// its real chunks run: they run, and the one event says complete.
func TestMalformedBodyWritesNoFailedMarker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, sink := newMemPayloads(), &memSink{}
		putManifest(t, p, "j", 2)
		h := start(t, 64*mib, Config{Payloads: p, Events: sink})
		h.work.Put(`{"job_id":"j","chunk":1}`, nil)
		h.work.Put(`{"v":1,"job_id":"j","chunk":0,"items":[]}`, nil)
		wait.For(t, time.Minute, "2 dead letters", func() bool { d, _ := h.dlq.Stats(); return d == 2 })
		h.send("j", 0, "mb=1")
		h.send("j", 1, "mb=1")
		wait.For(t, time.Minute, "2 results and an event", func() bool {
			r, _ := h.results.Stats()
			return r == 2 && len(eventsOf(sink, "j")) >= 1
		})
		h.shutdown()
		for c := range 2 {
			if m, ok := marker(t, p, "j", c); ok {
				t.Errorf("failed marker of chunk %d written for a malformed message: %+v", c, m)
			}
		}
		evs := eventsOf(sink, "j")
		if len(evs) != 1 || evs[0].Status != job.EventComplete || evs[0].ChunksDone != 2 || evs[0].ChunksFailed != 0 {
			t.Errorf("events %+v; want one, complete, 2 chunks done", evs)
		}
	})
}

// Item 5: a chunk that decoded as work but is at or past its job's chunk
// count gets no failed marker.
func TestFailedMarkerOnlyForChunksOfTheJob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		putManifest(t, p, "j", 2)
		h := start(t, 64*mib, Config{Payloads: p})
		h.send("j", 2, "mb=1 invalid")
		h.send("j", 5, "mb=1 invalid")
		h.send("j", 1, "mb=1 invalid")
		wait.For(t, time.Minute, "3 dead letters", func() bool { d, _ := h.dlq.Stats(); return d == 3 })
		h.shutdown()
		for _, c := range []int{2, 5} {
			if m, ok := marker(t, p, "j", c); ok {
				t.Errorf("failed marker of chunk %d of a 2-chunk job: %+v", c, m)
			}
		}
		if _, ok := marker(t, p, "j", 1); !ok {
			t.Error("no failed marker for chunk 1, which is the job's")
		}
	})
}

// Item 5: a decoded but forged chunk dead-lettered before the real one ran
// settles the job partial; when the real chunk's result lands, a corrected
// event goes out, revision 2, complete, written to its own done marker.
func TestCorrectedEventWhenAResultLandsAfterAPartialOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, sink := newMemPayloads(), &memSink{}
		putManifest(t, p, "j", 2)
		h := start(t, 64*mib, Config{Payloads: p, Events: sink})
		h.send("j", 1, "mb=1 invalid") // forged
		h.send("j", 0, "mb=1")
		wait.For(t, time.Minute, "a first event", func() bool { return len(eventsOf(sink, "j")) == 1 })
		h.send("j", 1, "mb=1") // the real chunk 1
		wait.For(t, time.Minute, "a corrected event", func() bool { return len(eventsOf(sink, "j")) >= 2 })
		// Redeliveries after the correction send nothing more.
		h.send("j", 0, "mb=1")
		h.send("j", 1, "mb=1")
		wait.For(t, time.Minute, "4 results", func() bool { r, _ := h.results.Stats(); return r == 4 })
		h.shutdown()
		evs := eventsOf(sink, "j")
		if len(evs) != 2 || evs[0].Status != job.EventPartial || evs[1].Status != job.EventComplete || evs[1].ChunksDone != 2 {
			t.Fatalf("events %+v; want partial, then complete", evs)
		}
		first, second := doneMarker(t, p, "j", 1), doneMarker(t, p, "j", 2)
		if first["revision"] != 1.0 || first["status"] != job.EventPartial {
			t.Errorf("done marker of revision 1: %v", first)
		}
		if second["revision"] != 2.0 || second["status"] != job.EventComplete {
			t.Errorf("done marker of revision 2: %v", second)
		}
		if m := doneMarker(t, p, "j", 3); m != nil {
			t.Errorf("a third revision: %v", m)
		}
	})
}

// collidingJobID is a job id whose checks, before issue 25, shared a lock
// stripe with jobID's.
func collidingJobID(jobID string) string {
	hash := func(s string) uint32 { h := fnv.New32a(); _, _ = h.Write([]byte(s)); return h.Sum32() % 64 }
	for i := 0; ; i++ {
		if id := fmt.Sprintf("small%d", i); hash(id) == hash(jobID) {
			return id
		}
	}
}

// Item 6, the scenario: a job of 1,000 chunks, each settling on its
// own, next to a small job whose checks once queued behind the big one's
// (one lock stripe, the timeout running while they waited) and failed for
// good. Listing costs time by the key, as S3's pages do. Both jobs get
// their event, and the big job's checks list a number of keys that grows
// with its chunks, not with their square. (Before issue 25 this test
// hangs rather than fails: a bubble's clock stands still while goroutines
// wait on a sync.Mutex, the stripe lock.)
func TestSettlementOfASmallJobNextToAManyChunkJob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 1000
		p, sink := newMemPayloads(), &memSink{}
		small := collidingJobID("big")
		putManifest(t, p, "big", n)
		putManifest(t, p, small, 2)
		p.listHook = func(ctx context.Context, prefix string, keys int) error {
			select {
			case <-time.After(50*time.Millisecond + time.Duration(keys)*time.Millisecond):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		h := start(t, 64*mib, Config{Payloads: p, Events: sink, MaxBatch: 1})
		for c := range n {
			h.send("big", c, "mb=1")
			if c == n/2 {
				h.send(small, 0, "mb=1")
				h.send(small, 1, "mb=1")
			}
		}
		wait.For(t, 4*time.Hour, "every result and the big job's event", func() bool {
			r, _ := h.results.Stats()
			return r == n+2 && len(eventsOf(sink, "big")) == 1
		})
		h.shutdown()
		if evs := eventsOf(sink, small); len(evs) != 1 || evs[0].Status != job.EventComplete {
			t.Errorf("the small job's events: %+v; want one, complete", evs)
		}
		if evs := eventsOf(sink, "big"); len(evs) != 1 || evs[0].ChunksDone != n {
			t.Errorf("the big job's events: %+v", evs)
		}
		if got := p.listedFor("big"); got > 30*n {
			t.Errorf("checks of the big job listed %d keys; want at most %d", got, 30*n)
		}
	})
}

// Item 6: the checks of a job of n chunks, each settling on its own, list
// a number of keys that grows with n, not with n² (500,000 here).
func TestSettlementListingGrowsWithChunksNotTheirSquare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 1000
		p, sink := newMemPayloads(), &memSink{}
		putManifest(t, p, "big", n)
		h := start(t, 64*mib, Config{Payloads: p, Events: sink, MaxBatch: 1})
		for c := range n {
			h.send("big", c, "mb=1")
		}
		wait.For(t, time.Hour, "every result and the event", func() bool {
			r, _ := h.results.Stats()
			return r == n && len(eventsOf(sink, "big")) == 1
		})
		h.shutdown()
		if got := p.listedFor("big"); got > 30*n {
			t.Errorf("checks of the job listed %d keys; want at most %d", got, 30*n)
		} else {
			t.Logf("checks of the job listed %d keys", got)
		}
	})
}

// Item 6: a check that fails (the bucket refuses a List) is tried again
// after a backoff, not dropped with the message already deleted.
func TestFailedSettlementCheckRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, sink := newMemPayloads(), &memSink{}
		putManifest(t, p, "r", 1)
		var fails atomic.Int64
		p.listHook = func(ctx context.Context, prefix string, keys int) error {
			if strings.HasPrefix(prefix, "results/r/") && fails.Add(1) <= 3 {
				return errors.New("SlowDown")
			}
			return nil
		}
		h := start(t, 64*mib, Config{Payloads: p, Events: sink})
		h.send("r", 0, "mb=1")
		wait.For(t, time.Hour, "the event", func() bool { return len(eventsOf(sink, "r")) == 1 })
		h.shutdown()
		if fails.Load() < 4 {
			t.Errorf("%d lists of results/r/; want the 3 that failed and one more", fails.Load())
		}
	})
}

// Item 7: the event counts refused items as failed, not done, as GET does.
func TestEventCountsRefusedItems(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, sink := newMemPayloads(), &memSink{}
		putManifestItems(t, p, "ie", 2, 1)
		h := start(t, 64*mib, Config{Payloads: p, Events: sink})
		h.send("ie", 0, "mb=1", "mb=1 invalid")
		h.send("ie", 1, "mb=1")
		wait.For(t, time.Minute, "the event", func() bool { return len(eventsOf(sink, "ie")) == 1 })
		h.shutdown()
		m := doneMarker(t, p, "ie", 1)
		if m["items"] != 3.0 || m["items_done"] != 2.0 || m["items_failed"] != 1.0 || m["status"] != job.EventComplete {
			t.Errorf("event %v; want complete, 3 items, 2 done, 1 failed", m)
		}
	})
}

// Item 7: a redelivered chunk that is not what ran first (forged, with
// other items) cannot rewrite the chunk's item-error count: it is the
// stored result's.
func TestItemErrorsMarkerIsTheStoredResults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		h := start(t, 64*mib, Config{Payloads: p})
		h.send("none", 0, "mb=1", "mb=1", "mb=1")
		h.send("one", 0, "mb=1", "mb=1 invalid", "mb=1")
		wait.For(t, time.Minute, "2 results", func() bool { r, _ := h.results.Stats(); return r == 2 })
		h.send("none", 0, "mb=1 invalid", "mb=1", "mb=1")
		h.send("one", 0, "mb=1 invalid", "mb=1 invalid", "mb=1")
		wait.For(t, time.Minute, "4 results", func() bool { r, _ := h.results.Stats(); return r == 4 })
		h.shutdown()
		// The forged "none" wrote its count before it found the stored
		// result, then put that result's back: none, or a marker of 0.
		if b, ok := p.object(job.ItemErrorsKey("none", 0)); ok {
			var ie job.ItemErrorsMarker
			if err := json.Unmarshal(b, &ie); err != nil || ie.ItemsFailed != 0 {
				t.Errorf("item-error marker %s for a chunk whose stored result has no error", b)
			}
		}
		b, _ := p.object(job.ItemErrorsKey("one", 0))
		var ie job.ItemErrorsMarker
		if err := json.Unmarshal(b, &ie); err != nil || ie.ItemsFailed != 1 {
			t.Errorf("item-error marker %s; want the stored result's 1", b)
		}
	})
}

// iamPayloads is a bucket as S3 answers a role without s3:ListBucket on
// done/*: reading a missing done marker is AccessDenied, not NoSuchKey.
// PutIfAbsent reads first, as payload.Store does.
type iamPayloads struct{ *memPayloads }

func (p iamPayloads) Read(ctx context.Context, key string) ([]byte, error) {
	if _, ok := p.object(key); !ok && strings.HasPrefix(key, "done/") {
		return nil, fmt.Errorf("payload: get %s: %w", key, &smithy.GenericAPIError{Code: "AccessDenied", Message: "Access Denied"})
	}
	return p.memPayloads.Read(ctx, key)
}

func (p iamPayloads) PutIfAbsent(ctx context.Context, key string, body []byte) (bool, []byte, error) {
	if b, err := p.Read(ctx, key); err == nil {
		return false, b, nil
	} else if !strings.Contains(err.Error(), "missing") {
		return false, nil, err
	}
	return p.memPayloads.PutIfAbsent(ctx, key, body)
}

// Item 13: the done marker is written first, conditionally, and read only
// when it is there: a role that reads a missing key as AccessDenied still
// gets its event, once.
func TestDoneMarkerNeedsNoReadOfAMissingKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, sink := iamPayloads{newMemPayloads()}, &memSink{}
		putManifest(t, p.memPayloads, "iam", 1)
		h := start(t, 64*mib, Config{Payloads: p, Events: sink})
		h.send("iam", 0, "mb=1")
		wait.For(t, time.Hour, "the event", func() bool { return len(eventsOf(sink, "iam")) >= 1 })
		h.send("iam", 0, "mb=1") // a redelivery: the marker is there, read after the refused write
		wait.For(t, time.Minute, "2 results", func() bool { r, _ := h.results.Stats(); return r == 2 })
		h.shutdown()
		if evs := eventsOf(sink, "iam"); len(evs) != 1 {
			t.Errorf("%d events; want 1", len(evs))
		}
	})
}

// Item 6: the jobs a subscriber keeps, and so its checks running or
// waiting to retry, are bounded: jobs with no check running are forgotten
// to make room, and when every job kept has one, a check of one more is
// dropped (a redelivery checks again), whatever job ids a sender makes up.
func TestSettlementChecksBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, sink := newMemPayloads(), &memSink{}
		putManifest(t, p, "late", 1)
		h := start(t, 64*mib, Config{Payloads: p, Events: sink})
		st := h.sub.settle
		fill := func(running bool) {
			st.mu.Lock()
			defer st.mu.Unlock()
			clear(st.jobs)
			for i := range maxSettleJobs {
				st.jobs[fmt.Sprint("kept", i)] = &jobSettle{running: running, witness: -1}
			}
		}
		fill(false)
		h.sub.jobSettling("idle-room")
		st.mu.Lock()
		n, ok := len(st.jobs), st.jobs["idle-room"] != nil
		st.mu.Unlock()
		if !ok || n > maxSettleJobs*3/4+1 {
			t.Errorf("with %d idle jobs kept: %d jobs after one more, the new one kept %v", maxSettleJobs, n, ok)
		}
		fill(true)
		h.send("late", 0, "mb=1")
		wait.For(t, time.Minute, "a result", func() bool { r, _ := h.results.Stats(); return r == 1 })
		h.shutdown()
		if n := counter(h.sub.m.events.WithLabelValues("dropped")); n != 1 {
			t.Errorf("%d checks dropped; want 1", n)
		}
		if evs := eventsOf(sink, "late"); len(evs) != 0 {
			t.Errorf("events %+v for a check that had no room", evs)
		}
	})
}

// The item-error marker is written before the chunk's result: GET's count
// lists results, then reads markers, so a chunk seen done is seen with its
// failed items (written after, a job polled in between read complete with
// every item done).
func TestItemErrorsMarkedBeforeTheResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		var mu sync.Mutex
		var order []string
		p.putErr = func(key string) error {
			mu.Lock()
			defer mu.Unlock()
			if key == job.ItemErrorsKey("m", 0) || key == job.ResultKey("m", 0) {
				order = append(order, key)
			}
			return nil
		}
		h := start(t, 64*mib, Config{Payloads: p})
		h.send("m", 0, "mb=1", "mb=1 invalid", "mb=1")
		wait.For(t, time.Minute, "the result", func() bool { r, _ := h.results.Stats(); return r == 1 })
		h.shutdown()
		mu.Lock()
		defer mu.Unlock()
		if want := []string{job.ItemErrorsKey("m", 0), job.ResultKey("m", 0)}; !slices.Equal(order, want) {
			t.Errorf("written in the order %q; want %q", order, want)
		}
	})
}
