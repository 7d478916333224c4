package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// sendWork puts w on the work queue, with its attributes.
func (h *harness) sendWork(w job.Work) {
	w.V = job.Version
	b, err := json.Marshal(w)
	if err != nil {
		h.t.Fatal(err)
	}
	h.work.Put(string(b), job.Attributes(w.Key()))
}

// claimChecked stores it in p as the publisher would and returns the item
// that stands for it in a message.
func claimChecked(t *testing.T, p *memPayloads, key string, it job.Item) job.Item {
	t.Helper()
	b, err := json.Marshal(it)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := p.Put(context.Background(), key, b)
	if err != nil {
		t.Fatal(err)
	}
	return job.Item{ID: it.ID, Ref: &ref}
}

func marker(t *testing.T, p *memPayloads, jobID string, chunk int) (job.FailedMarker, bool) {
	t.Helper()
	b, ok := p.object(job.FailedKey(jobID, chunk))
	if !ok {
		return job.FailedMarker{}, false
	}
	var m job.FailedMarker
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("failed marker %s: %v", b, err)
	}
	return m, true
}

// Claim-checked items are fetched, verified and run with their real content
// (the cost comes from it too); an object that is missing, changed, or not
// the item goes to the DLQ as claim_check, with a failed marker for the
// chunk, as does a malformed message that still names its chunk.
func TestClaimCheckFetchesVerifiesAndDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		h := start(t, 64*mib, Config{Payloads: p})
		big := job.Item{ID: "i0", Text: "mb=20 ms=10 a long text"}
		h.sendWork(job.Work{JobID: "ok", Items: []job.Item{
			claimChecked(t, p, job.ItemKey("ok", "i0"), big), {ID: "i1", Text: "mb=1"}}})

		// Stored under another item's key: the one this reference must name
		// holds nothing.
		missing := claimChecked(t, p, job.ItemKey("missing", "i9"), job.Item{ID: "i0", Text: "mb=1"})
		missing.Ref.Key = job.ItemKey("missing", "i0")
		h.sendWork(job.Work{JobID: "missing", Items: []job.Item{missing}})

		corrupt := claimChecked(t, p, job.ItemKey("corrupt", "i0"), job.Item{ID: "i0", Text: "mb=1 abc"})
		if _, err := p.Put(t.Context(), corrupt.Ref.Key, []byte(`{"id":"i0","text":"mb=1 abd"}`)); err != nil {
			t.Fatal(err)
		}
		h.sendWork(job.Work{JobID: "corrupt", Chunk: 1, Items: []job.Item{corrupt}})

		other := claimChecked(t, p, job.ItemKey("other", "i0"), job.Item{ID: "someone-else", Text: "mb=1"})
		other.ID = "i0"
		h.sendWork(job.Work{JobID: "other", Items: []job.Item{other}})
		h.sendWork(job.Work{JobID: "nested", Items: []job.Item{
			claimChecked(t, p, job.ItemKey("nested", "i0"), job.Item{ID: "i0", Ref: corrupt.Ref})}})
		foreign := claimChecked(t, p, job.ItemKey("foreign", "i0"), job.Item{ID: "i0", Text: "mb=1"})
		foreign.Ref.Bucket = "someone-elses-bucket"
		h.sendWork(job.Work{JobID: "foreign", Items: []job.Item{foreign}})
		// Issue 14, item 1: a reference that names another job's object, or
		// any key but this job's payloads, is refused whatever the object
		// holds, even with its true size and SHA-256 and the same item id.
		thief := claimChecked(t, p, job.ItemKey("ok", "i0"), big)
		h.sendWork(job.Work{JobID: "thief", Items: []job.Item{thief}})
		// A key of this job's payloads, holding exactly this item, but not
		// the one the publisher would have named it: refused too.
		sibling := claimChecked(t, p, job.ItemKey("sibling", "i1"), job.Item{ID: "i0", Text: "mb=1"})
		h.sendWork(job.Work{JobID: "sibling", Items: []job.Item{sibling}})
		anyKey := claimChecked(t, p, "results/someone/0.json", job.Item{ID: "i0", Text: "mb=1"})
		h.sendWork(job.Work{JobID: "anykey", Items: []job.Item{anyKey}})
		h.work.Put(`{"v":1,"job_id":"malformed","chunk":2,"items":[]}`, nil)

		wait.For(t, time.Minute, "1 result and 9 dead letters", func() bool {
			r, _ := h.results.Stats()
			d, _ := h.dlq.Stats()
			return r == 1 && d == 9
		})
		h.shutdown()

		got, _ := h.resultsByKey()
		r := got[job.Key{JobID: "ok"}]
		if len(r.Outputs) != 2 || r.Outputs[0].Embedding[0] != float32(len(big.Text)) {
			t.Errorf("outputs %+v; want the first from the fetched text %q", r.Outputs, big.Text)
		}
		if peak := h.sub.PeakBytes(); peak < 21*mib {
			t.Errorf("peak admitted %d bytes; the cost must come from the fetched content (21 MiB)", peak)
		}

		reasons := map[string]string{}
		for _, m := range h.dlq.All() {
			k, ok := chunkOf(queue.Message{Body: m.Body, Attributes: m.Attributes})
			if !ok {
				t.Fatalf("dead letter %q names no chunk", m.Body)
			}
			reasons[k.JobID] = m.Attributes[job.AttrReason]
		}
		// The reasons are stored in markers and served by the publisher:
		// whether the object is there, its size, its SHA-256 and what it
		// holds must not show (issue 14, item 1), so missing, corrupt, other
		// and nested read the same.
		const noMatch = `claim_check: item "i0": no object in the payload bucket matches the reference`
		const badRef = `claim_check: item "i0": the reference does not name this item's object in the payload bucket`
		corruptObj, _ := p.object(corrupt.Ref.Key)
		trueSum := refTo("mem", corrupt.Ref.Key, corruptObj).SHA256
		for jobID, want := range map[string]string{
			"sibling":   badRef,
			"missing":   noMatch,
			"corrupt":   noMatch,
			"other":     noMatch,
			"nested":    noMatch,
			"foreign":   badRef,
			"thief":     badRef,
			"anykey":    badRef,
			"malformed": "malformed: malformed message: no items",
		} {
			if reasons[jobID] != want {
				t.Errorf("%s: reason %q, want %q", jobID, reasons[jobID], want)
			}
			for _, secret := range []string{trueSum, "someone-else", strconv.Itoa(len(corruptObj))} {
				if strings.Contains(reasons[jobID], secret) {
					t.Errorf("%s: reason %q discloses %q", jobID, reasons[jobID], secret)
				}
			}
			chunk := map[string]int{"corrupt": 1, "malformed": 2}[jobID]
			m, ok := marker(t, p, jobID, chunk)
			if jobID == "malformed" {
				// Issue 25, item 5: a body that did not decode as work
				// marks nothing, whatever chunk it names.
				if ok {
					t.Errorf("malformed: failed marker %+v; want none", m)
				}
				continue
			}
			if !ok || m.Reason != reasons[jobID] || m.MessageID == "" || m.V != 1 || m.JobID != jobID || m.Chunk != chunk {
				t.Errorf("%s: failed marker %+v (present %v); want the DLQ reason %q", jobID, m, ok, reasons[jobID])
			}
			if _, err := time.Parse(time.RFC3339, m.At); err != nil {
				t.Errorf("%s: marker time %q: %v", jobID, m.At, err)
			}
		}
		for outcome, want := range map[string]int{"ok": 1, "missing": 1, "corrupt": 1, "invalid": 6} {
			if n := counter(h.sub.m.claimChecks.WithLabelValues(outcome)); n != want {
				t.Errorf("claim checks %s = %d, want %d", outcome, n, want)
			}
		}
		if _, ok := marker(t, p, "ok", 0); ok {
			t.Error("a failed marker for a chunk that succeeded")
		}
	})
}

func TestClaimCheckWithoutBucketDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{})
		p := newMemPayloads()
		h.sendWork(job.Work{JobID: "j", Items: []job.Item{claimChecked(t, p, job.ItemKey("j", "i0"), job.Item{ID: "i0", Text: "mb=1"})}})
		wait.For(t, time.Minute, "the dead letter", func() bool { d, _ := h.dlq.Stats(); return d == 1 })
		h.shutdown()
		reason := h.dlq.All()[0].Attributes[job.AttrReason]
		if want := `claim_check: item "i0" is claim-checked but no payload bucket is configured`; reason != want {
			t.Errorf("reason %q, want %q", reason, want)
		}
		if w := h.sub.waiting.Load(); w != 0 {
			t.Errorf("%d messages still counted as waiting", w)
		}
	})
}

// A fetch that fails for a reason that may pass (a network error, or no
// answer before the admit timeout) releases the message with backoff; it is
// fetched again on a later receive.
func TestClaimCheckTransientFailureReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		var calls atomic.Int64
		p.getHook = func(ctx context.Context, key string) error {
			switch calls.Add(1) {
			case 1:
				<-ctx.Done() // hangs until the admit timeout
				return ctx.Err()
			case 2:
				return errors.New("connection reset")
			}
			return nil
		}
		h := start(t, 64*mib, Config{Payloads: p, AdmitTimeout: 10 * time.Second, RetryDelay: time.Second})
		item := claimChecked(t, p, job.ItemKey("flaky", "i0"), job.Item{ID: "i0", Text: "mb=1"})
		h.sendWork(job.Work{JobID: "flaky", Items: []job.Item{item}})
		wait.For(t, 2*time.Minute, "the result", func() bool { r, _ := h.results.Stats(); return r == 1 })
		h.shutdown()
		got, _ := h.resultsByKey()
		if r := got[job.Key{JobID: "flaky"}]; r.Attempt != 3 {
			t.Errorf("result at attempt %d, want 3 (two failed fetches released it twice)", r.Attempt)
		}
		if n := counter(h.sub.m.claimChecks.WithLabelValues("error")); n != 2 {
			t.Errorf("%d claim checks counted as errors, want 2", n)
		}
		if d, _ := h.dlq.Stats(); d != 0 {
			t.Errorf("%d dead letters; transient failures must not dead-letter", d)
		}
	})
}

// Slow fetches happen off the poll loop: messages behind them run meanwhile.
// They are bounded in number, and count against the prefetch buffer, so the
// poller never receives more than it has room for; their leases are
// extended while they fetch.
func TestSlowFetchesDoNotBlockPolling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		gate := make(chan struct{})
		p.getHook = func(ctx context.Context, key string) error {
			if strings.HasPrefix(key, "payloads/slow") {
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
		h := start(t, 64*mib, Config{Payloads: p, Prefetch: 3, Visibility: 3 * time.Second, MaxBatch: 1})
		slow := func(jobID string) {
			var items []job.Item
			for i := range 6 {
				items = append(items, claimChecked(t, p, job.ItemKey(jobID, fmt.Sprint("i", i)), job.Item{ID: fmt.Sprint("i", i), Text: "mb=1"}))
			}
			h.sendWork(job.Work{JobID: jobID, Items: items})
		}
		slow("slow-a")
		slow("slow-b")
		for i := range 5 {
			h.send("fast", i, "mb=1 ms=10")
		}
		wait.For(t, time.Minute, "the 5 fast results", func() bool { r, _ := h.results.Stats(); return r == 5 })
		if n := p.maxInFlight(); n != maxFetches {
			t.Errorf("%d fetches at once for 12 wanted; want the bound %d", n, maxFetches)
		}

		slow("slow-c")
		slow("slow-d")
		time.Sleep(20 * time.Second) // well past the 3 s visibility
		synctest.Wait()
		if w, held := h.sub.waiting.Load(), h.sub.keeper.held.Load(); w != 3 || held != 3 {
			t.Errorf("waiting %d, held %d while fetches hang; want the prefetch of 3 for both", w, held)
		}
		close(gate)
		wait.For(t, time.Minute, "all 9 results", func() bool { r, _ := h.results.Stats(); return r == 9 })
		h.shutdown()
		got, dups := h.resultsByKey()
		for _, k := range []string{"slow-a", "slow-b", "slow-c", "slow-d"} {
			if r := got[job.Key{JobID: k}]; r.Attempt != 1 || len(r.Outputs) != 6 {
				t.Errorf("%s: attempt %d with %d outputs; want the first, with all 6", k, r.Attempt, len(r.Outputs))
			}
		}
		if dups != 0 {
			t.Errorf("%d duplicate results: a lease expired while its message was fetching", dups)
		}
		if n := p.maxInFlight(); n > maxFetches {
			t.Errorf("%d fetches at once, above the bound %d", n, maxFetches)
		}
	})
}

// Shutdown while fetches hang hands their messages straight back.
func TestShutdownDuringFetchReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		p.getHook = func(ctx context.Context, key string) error { <-ctx.Done(); return ctx.Err() }
		h := start(t, 64*mib, Config{Payloads: p})
		h.sendWork(job.Work{JobID: "j", Items: []job.Item{claimChecked(t, p, job.ItemKey("j", "i0"), job.Item{ID: "i0", Text: "mb=1"})}})
		wait.For(t, time.Minute, "the fetch", func() bool { return h.sub.waiting.Load() == 1 })
		h.shutdown()
		if live, invisible := h.work.Stats(); live != 1 || invisible != 0 {
			t.Errorf("work queue: %d live, %d invisible; want the message back and visible", live, invisible)
		}
		if d, _ := h.dlq.Stats(); d != 0 {
			t.Errorf("%d dead letters at shutdown", d)
		}
	})
}

// With a bucket, every result is also stored there; one too large for a
// message is sent as a reference to it. A redelivered chunk reuses the
// stored result, so a reference sent earlier still verifies.
func TestResultsStoredAndLargeOnesByRef(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		h := start(t, 64*mib, Config{Payloads: p, MaxMessageBytes: 2048})
		var many []string
		for range 80 {
			many = append(many, "mb=0")
		}
		h.send("large", 0, many...)
		h.send("small", 0, "mb=1")
		earlier := job.Result{V: 1, JobID: "again", Chunk: 3, Model: "test-model", Attempt: 1, WorkerMS: 7,
			Outputs: []job.Output{{ID: "i0", Embedding: []float32{4}}}}
		b, _ := json.Marshal(earlier)
		if _, err := p.Put(t.Context(), job.ResultKey("again", 3), b); err != nil {
			t.Fatal(err)
		}
		h.send("again", 3, "mb=1")
		wait.For(t, time.Minute, "3 results", func() bool { r, _ := h.results.Stats(); return r == 3 })
		h.shutdown()

		got, _ := h.resultsByKey()
		for k, msg := range got {
			b, ok := p.object(job.ResultKey(k.JobID, k.Chunk))
			if !ok {
				t.Errorf("%v: no result in the bucket", k)
				continue
			}
			var stored job.Result
			if err := json.Unmarshal(b, &stored); err != nil {
				t.Fatal(err)
			}
			if msg.Ref != nil {
				fetched, err := p.Get(t.Context(), *msg.Ref)
				if err != nil {
					t.Errorf("%v: fetching the result's reference: %v", k, err)
				}
				if string(fetched) != string(b) || msg.Outputs != nil {
					t.Errorf("%v: the reference does not stand for the stored result, or outputs came too", k)
				}
				continue
			}
			if k.JobID == "again" {
				msg.WorkerMS, msg.Attempt = stored.WorkerMS, stored.Attempt
			}
			if diff := cmp.Diff(stored, msg); diff != "" {
				t.Errorf("%v: stored result differs from the message (-stored +message):\n%s", k, diff)
			}
		}
		if r := got[job.Key{JobID: "large"}]; r.Ref == nil {
			t.Errorf("the large result came inline (%d outputs); want a reference", len(r.Outputs))
		}
		if r := got[job.Key{JobID: "small"}]; r.Ref != nil || len(r.Outputs) != 1 {
			t.Errorf("the small result: %+v; want it inline", r)
		}
		if r := got[job.Key{JobID: "again", Chunk: 3}]; r.Attempt != 1 || r.Ref != nil {
			t.Errorf("redelivered chunk: %+v", r)
		}
		if n := counter(h.sub.m.resultsStored); n != 3 {
			t.Errorf("results stored = %d, want 3", n)
		}
	})
}

// A result that cannot be stored is not sent: the message is released and
// the chunk runs again.
func TestResultStoreFailureReleasesForRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		var fails atomic.Int64
		p.putErr = func(string) error {
			if fails.Add(1) == 1 {
				return errors.New("injected")
			}
			return nil
		}
		h := start(t, 64*mib, Config{Payloads: p, RetryDelay: time.Second})
		h.send("flaky", 0, "mb=1")
		wait.For(t, time.Minute, "the result", func() bool { r, _ := h.results.Stats(); return r == 1 })
		h.shutdown()
		got, _ := h.resultsByKey()
		if r := got[job.Key{JobID: "flaky"}]; r.Attempt != 2 {
			t.Errorf("result at attempt %d, want 2", r.Attempt)
		}
		if n := counter(h.sub.m.payloadRequests.WithLabelValues("put_if_absent", "error")); n != 1 {
			t.Errorf("%d failed result writes counted, want 1", n)
		}
	})
}

// Without a bucket a result too large for a message is still poison.
func TestLargeResultWithoutBucketDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{MaxMessageBytes: 1024})
		var many []string
		for range 40 {
			many = append(many, "mb=0")
		}
		h.send("large", 0, many...)
		wait.For(t, time.Minute, "the dead letter", func() bool { d, _ := h.dlq.Stats(); return d == 1 })
		h.shutdown()
		if reason := h.dlq.All()[0].Attributes[job.AttrReason]; !strings.HasPrefix(reason, "result_too_large: ") {
			t.Errorf("reason %q", reason)
		}
	})
}

func TestChunkOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    queue.Message
		want job.Key
		ok   bool
	}{
		// Identity comes from the body only (issue 14, item 2): attributes
		// that name another job are ignored, and without a body naming one
		// there is no chunk.
		{"attributes only", queue.Message{Attributes: job.Attributes(job.Key{JobID: "a", Chunk: 2}), Body: "junk"}, job.Key{}, false},
		{"body", queue.Message{Body: `{"v":9,"job_id":"b","chunk":4,"extra":1}`}, job.Key{JobID: "b", Chunk: 4}, true},
		{"attributes of another job",
			queue.Message{Attributes: job.Attributes(job.Key{JobID: "victim", Chunk: 0}), Body: `{"job_id":"c","chunk":0}`},
			job.Key{JobID: "c"}, true},
		{"job id outside the grammar", queue.Message{Body: `{"job_id":"../x","chunk":0}`}, job.Key{}, false},
		{"long job id", queue.Message{Body: `{"job_id":"` + strings.Repeat("a", 65) + `","chunk":0}`}, job.Key{}, false},
		{"no chunk", queue.Message{Body: `{"job_id":"d"}`}, job.Key{}, false},
		{"negative chunk", queue.Message{Body: `{"job_id":"d","chunk":-1}`}, job.Key{}, false},
		{"not json", queue.Message{Body: `not json`}, job.Key{}, false},
	} {
		got, ok := chunkOf(tc.m)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: chunkOf = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// A nil *payload.Store means no bucket, not one that panics on first use.
func TestTypedNilPayloadsIsNoBucket(t *testing.T) {
	var st *payload.Store
	cfg := Config{Payloads: st}
	cfg.setDefaults()
	if cfg.Payloads != nil {
		t.Error("a nil *payload.Store was kept as a bucket")
	}
}
