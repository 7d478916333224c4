package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// The cache reads a job's cancel record once per TTL, not once per
// message: a "no" is kept for the TTL, a "yes" for good, a failed read
// counts as "no" for the TTL, concurrent askers share one read, and the
// table stays within its bound.
func TestCancelCacheReadsOncePerTTL(t *testing.T) {
	var mu sync.Mutex
	reads := map[string]int{}
	present := map[string]bool{}
	var fail atomic.Bool
	read := func(_ context.Context, key string) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		reads[key]++
		switch {
		case fail.Load():
			return nil, errors.New("bucket unreachable")
		case present[key]:
			return []byte(`{}`), nil
		}
		return nil, payload.ErrMissing
	}
	readsOf := func(jobID string) int {
		mu.Lock()
		defer mu.Unlock()
		return reads[job.CancelKey(jobID)]
	}
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	c := newCancels(read, 5*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	c.now = clock.Now
	ctx := t.Context()

	for range 100 {
		if c.cancelled(ctx, "j") {
			t.Fatal("j cancelled without a record")
		}
	}
	if n := readsOf("j"); n != 1 {
		t.Errorf("100 checks within the TTL read the record %d times, want 1", n)
	}
	mu.Lock()
	present[job.CancelKey("j")] = true
	mu.Unlock()
	clock.advance(4 * time.Second)
	if c.cancelled(ctx, "j") || readsOf("j") != 1 {
		t.Errorf("within the TTL the cached no stands (reads %d)", readsOf("j"))
	}
	clock.advance(time.Second) // the TTL has passed
	if !c.cancelled(ctx, "j") || readsOf("j") != 2 {
		t.Errorf("after the TTL the record is read again and found (reads %d)", readsOf("j"))
	}
	clock.advance(time.Hour)
	for range 100 {
		if !c.cancelled(ctx, "j") {
			t.Fatal("a cancelled job came back")
		}
	}
	if n := readsOf("j"); n != 2 {
		t.Errorf("a yes is kept for good: %d reads, want 2", n)
	}

	// A failed read: not cancelled, and not read again within the TTL.
	fail.Store(true)
	for range 10 {
		if c.cancelled(ctx, "k") {
			t.Error("a failed read counts as cancelled")
		}
	}
	if n := readsOf("k"); n != 1 {
		t.Errorf("a failed read is retried %d times within the TTL, want once in all", n)
	}
	fail.Store(false)

	// Concurrent askers about a job not in the cache share one read.
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { c.cancelled(ctx, "m") })
	}
	wg.Wait()
	if n := readsOf("m"); n != 1 {
		t.Errorf("50 concurrent checks made %d reads, want 1", n)
	}

	// Bounded: expired answers go first, then any.
	c.maxEntries = 3
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		c.cancelled(ctx, id)
	}
	c.mu.Lock()
	n := len(c.answers)
	c.mu.Unlock()
	if n > 3 {
		t.Errorf("%d answers kept, bound 3", n)
	}
}

func cancelJob(t *testing.T, p *memPayloads, jobID string) {
	t.Helper()
	b, _ := json.Marshal(job.CancelRecord{V: job.Version, JobID: jobID, At: time.Now().UTC()})
	if _, err := p.Put(t.Context(), job.CancelKey(jobID), b); err != nil {
		t.Fatal(err)
	}
}

// Chunks of a cancelled job are deleted without running, each with its
// cancelled marker, and the cancel record is read once, not once per
// message; another job's chunks run as usual.
func TestCancelledChunksEndUnrun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		cancelJob(t, p, "gone")
		h := start(t, 64*mib, Config{Payloads: p})
		for c := range 30 {
			h.send("gone", c, "mb=1 ms=5")
		}
		for c := range 10 {
			h.send("live", c, "mb=1 ms=5")
		}
		wait.For(t, time.Minute, "10 results and 30 cancelled chunks", func() bool {
			r, _ := h.results.Stats()
			return r == 10 && counter(h.sub.m.cancelled) == 30
		})
		h.shutdown()

		got, _ := h.resultsByKey()
		for k := range got {
			if k.JobID == "gone" {
				t.Errorf("chunk %d of the cancelled job ran", k.Chunk)
			}
		}
		for c := range 30 {
			b, ok := p.object(job.CancelledKey("gone", c))
			var m job.CancelledMarker
			if !ok || json.Unmarshal(b, &m) != nil || m.JobID != "gone" || m.Chunk != c || m.MessageID == "" {
				t.Errorf("chunk %d: cancelled marker %q", c, b)
			}
		}
		if _, ok := p.object(job.CancelledKey("live", 0)); ok {
			t.Error("a chunk of a live job was marked cancelled")
		}
		if live, invisible := h.work.Stats(); live+invisible != 0 {
			t.Errorf("%d messages left on the work queue", live+invisible)
		}
		if l := h.sub.Ledger(); l.Deleted != 40 {
			t.Errorf("ledger %+v: want 40 deleted", l)
		}
		if n := p.readsOf(job.CancelKey("gone")); n != 1 {
			t.Errorf("30 chunks of a cancelled job read its record %d times, want 1", n)
		}
		if n := p.readsOf(job.CancelKey("live")); n > 3 {
			t.Errorf("10 chunks of a live job read its cancel record %d times, want at most one per TTL", n)
		}
	})
}

// A cancel that comes while a job's chunks wait for the device stops those
// not yet run: they are checked again before their batch runs, once the
// cached answer has expired, and the running chunk finishes.
func TestCancelWhileWaitingForTheDevice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		// Room for one chunk at a time: the others wait in admission.
		h := start(t, 64*mib, Config{Payloads: p, CancelCheckTTL: time.Second})
		for c := range 4 {
			h.send("j", c, "mb=40 ms=10000")
		}
		wait.For(t, time.Minute, "the first chunk to run", func() bool { return h.model.runs.Load() == 1 })
		cancelJob(t, p, "j")
		wait.For(t, 2*time.Minute, "1 result and 3 cancelled chunks", func() bool {
			r, _ := h.results.Stats()
			return r == 1 && counter(h.sub.m.cancelled) == 3
		})
		h.shutdown()
		if n := h.model.runs.Load(); n != 1 {
			t.Errorf("the model ran %d times; want only the chunk that was running", n)
		}
		if live, invisible := h.work.Stats(); live+invisible != 0 {
			t.Errorf("%d messages left on the work queue", live+invisible)
		}
	})
}

// A cancelled marker that cannot be written leaves the message on the
// queue, released for a retry, never deleted uncounted.
func TestCancelMarkerFailureReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		cancelJob(t, p, "j")
		var failing atomic.Bool
		failing.Store(true)
		p.putErr = func(key string) error {
			if failing.Load() {
				return errors.New("bucket unreachable")
			}
			return nil
		}
		h := start(t, 64*mib, Config{Payloads: p, RetryDelay: time.Second})
		h.send("j", 0, "mb=1")
		wait.For(t, time.Minute, "a release", func() bool { return h.sub.Ledger().Released >= 1 })
		if counter(h.sub.m.cancelled) != 0 || h.sub.Ledger().Deleted != 0 {
			t.Fatal("deleted without its marker")
		}
		failing.Store(false)
		wait.For(t, time.Minute, "the cancel", func() bool { return counter(h.sub.m.cancelled) == 1 })
		h.shutdown()
		if _, ok := p.object(job.CancelledKey("j", 0)); !ok {
			t.Error("no cancelled marker")
		}
		if h.model.runs.Load() != 0 {
			t.Error("the model ran a cancelled chunk")
		}
	})
}
