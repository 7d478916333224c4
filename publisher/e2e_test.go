package publisher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/promsum"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/jobs"
)

// words makes a deterministic text of n words.
func words(seed, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "w%d", (seed*7919+i*31)%5000)
	}
	return b.String()
}

func manyItems(prefix string, n, wordsEach int) []jobs.RequestItem {
	out := make([]jobs.RequestItem, n)
	for i := range out {
		out[i] = jobs.RequestItem{ID: fmt.Sprintf("%s%03d", prefix, i), Text: words(i, wordsEach)}
	}
	return out
}

// TestPublishWholeJob: a job of 200 items is cut by count and by size, the
// large items go through S3, and the queue holds every chunk exactly once,
// items in order, with the right attributes; the claim-checked objects
// verify and hold the items.
func TestPublishWholeJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{MaxMessageBytes: 8 << 10, MaxItemBytes: 4 << 10}})
	items := manyItems("doc-", 200, 20)
	for i := range 40 { // some items long enough to cut chunks by size
		items[i*5].Text = words(i, 550)
	}
	items[17] = jobs.RequestItem{ID: "big-text", Text: words(99, 2000)}
	items[101] = jobs.RequestItem{ID: "big-data", Data: []byte(strings.Repeat("\x00\x01\xfe\xff", 3000))}
	a := s.mustPost(jobBody(t, items, 16), nil)
	if a.Items != 200 || a.ClaimChecked != 2 || a.StatusURL != "/v1/jobs/"+a.JobID || len(a.JobID) != 32 {
		t.Errorf("accepted %+v", a)
	}
	works := checkWhole(t, a, e.drain(a.Chunks))
	var got []job.Item
	sizeCut := false
	for _, w := range works {
		if w == nil {
			t.FailNow()
		}
		if len(w.Items) < 16 && w.Chunk < a.Chunks-1 {
			sizeCut = true
		}
		got = append(got, w.Items...)
	}
	if !sizeCut || a.Chunks <= 200/16 {
		t.Errorf("%d chunks, none cut by size", a.Chunks)
	}
	for i, it := range got {
		want := items[i]
		if it.ID != want.ID {
			t.Fatalf("item %d is %q, want %q: order not kept", i, it.ID, want.ID)
		}
		if it.Ref == nil {
			if it.Text != want.Text || string(it.Data) != string(want.Data) {
				t.Errorf("item %q changed on the way", it.ID)
			}
			continue
		}
		if it.ID != "big-text" && it.ID != "big-data" {
			t.Errorf("item %q claim-checked", it.ID)
		}
		b, err := e.store.Get(t.Context(), *it.Ref)
		if err != nil {
			t.Fatalf("claim-checked %q: %v", it.ID, err)
		}
		var stored job.Item
		if err := json.Unmarshal(b, &stored); err != nil || stored.ID != want.ID || stored.Text != want.Text || string(stored.Data) != string(want.Data) {
			t.Errorf("claim-checked %q holds something else (%v)", it.ID, err)
		}
		if it.Ref.Key != job.ItemKey(a.JobID, it.ID) {
			t.Errorf("claim-checked %q at %s", it.ID, it.Ref.Key)
		}
	}
	if _, err := e.store.Read(t.Context(), job.ManifestKey(a.JobID)); err != nil {
		t.Errorf("manifest: %v", err)
	}
	if n := promsum.Sum(t, s.reg, "vramq_publisher_chunks_sent_total"); n != float64(a.Chunks) {
		t.Errorf("chunks_sent_total %v, want %d", n, a.Chunks)
	}
}

// TestIdempotentRetry: a POST retried with the same Idempotency-Key gets the
// same job and sends nothing more, with the records in the bucket and in
// memory; concurrent duplicates make one job.
func TestIdempotentRetry(t *testing.T) {
	t.Parallel()
	for _, bucket := range []bool{true, false} {
		t.Run(fmt.Sprintf("bucket=%v", bucket), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, bucket)
			s := e.serve(publisher.Config{})
			body := jobBody(t, manyItems("i", 50, 5), 10)
			h := map[string]string{"Idempotency-Key": "retry-me-1"}
			first := s.post(body, h)
			second := s.post(body, h)
			if first.status != 202 || second.status != 202 || string(first.body) != string(second.body) {
				t.Fatalf("first %d %s, retry %d %s", first.status, first.body, second.status, second.body)
			}
			if first.header.Get("Idempotent-Replayed") != "" || second.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("Idempotent-Replayed: first %q, retry %q", first.header.Get("Idempotent-Replayed"), second.header.Get("Idempotent-Replayed"))
			}
			var a accepted
			first.json(t, &a)
			checkWhole(t, a, e.drain(a.Chunks))

			// The same body under another key is another job.
			other := s.mustPost(body, map[string]string{"Idempotency-Key": "retry-me-2"})
			if other.JobID == a.JobID {
				t.Error("another key gave the same job")
			}
			checkWhole(t, other, e.drain(other.Chunks))

			if bucket {
				return // the emulator's S3 ignores If-None-Match: no atomic claim to test there
			}
			// Concurrent duplicates: one job, the others replay it or are told to wait.
			var wg sync.WaitGroup
			replies := make([]reply, 6)
			for i := range replies {
				wg.Go(func() { replies[i] = s.post(body, map[string]string{"Idempotency-Key": "concurrent"}) })
			}
			wg.Wait()
			var jobID string
			for _, r := range replies {
				switch r.status {
				case 202:
					var a accepted
					r.json(t, &a)
					if jobID != "" && a.JobID != jobID {
						t.Errorf("two jobs for one key: %s and %s", jobID, a.JobID)
					}
					jobID = a.JobID
				case 409:
					if r.header.Get("Retry-After") == "" {
						t.Error("409 without Retry-After")
					}
				default:
					t.Errorf("concurrent duplicate: %d %s", r.status, r.body)
				}
			}
			msgs := e.drain(5)
			checkWhole(t, accepted{JobID: jobID, Chunks: 5, Items: 50}, msgs)
		})
	}
}

// failFirst fails the first attempt of every entry whose chunk % every == 1,
// as SQS does when it lists entries in Failed, and counts what got through.
type failFirst struct {
	jobs.Queue
	every     int
	mu        sync.Mutex
	attempts  map[string]int
	permanent bool // fail those entries every time
}

// set makes the injected failures permanent or not, and starts counting
// attempts afresh.
func (f *failFirst) set(permanent bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.permanent = permanent
	clear(f.attempts)
}

func (f *failFirst) SendBatch(ctx context.Context, entries []jobs.Entry) ([]error, error) {
	f.mu.Lock()
	var pass []jobs.Entry
	var idx []int
	errs := make([]error, len(entries))
	for i, e := range entries {
		k := e.JobID + "/" + strconv.Itoa(e.Chunk)
		f.attempts[k]++
		if e.Chunk%f.every == 1 && (f.attempts[k] == 1 || f.permanent) {
			errs[i] = &jobs.EntryError{Code: "InternalError", Message: "injected"}
			continue
		}
		pass = append(pass, e)
		idx = append(idx, i)
	}
	f.mu.Unlock()
	if len(pass) > 0 {
		perr, err := f.Queue.SendBatch(ctx, pass)
		if err != nil {
			return nil, err
		}
		for j, e := range perr {
			errs[idx[j]] = e
		}
	}
	return errs, nil
}

// TestInjectedSendFailures: entries SQS lists in Failed are sent again and
// the job is whole, each chunk once. When they keep failing the answer is a
// 503 that says how much was sent, and a retry with the same key sends the
// job again under the same id.
func TestInjectedSendFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	q := &failFirst{Queue: jobs.NewSQSQueue(e.client, e.urls.Work), every: 4, attempts: map[string]int{}}
	s := e.serve(publisher.Config{Queue: q, Jobs: publisher.Jobs{SendBackoff: 10 * time.Millisecond}})

	a := s.mustPost(jobBody(t, manyItems("f", 100, 5), 5), nil)
	if a.Chunks != 20 {
		t.Fatalf("%d chunks, want 20", a.Chunks)
	}
	checkWhole(t, a, e.drain(a.Chunks))
	if n := promsum.Sum(t, s.reg, "vramq_publisher_sqs_send_retries_total"); n != 5 {
		t.Errorf("sqs_send_retries_total %v, want 5", n)
	}

	q.set(true)
	body := jobBody(t, manyItems("g", 100, 5), 5)
	r := s.post(body, map[string]string{"Idempotency-Key": "flaky"})
	var failed struct {
		Error  api.Error `json:"error"`
		JobID  string    `json:"job_id"`
		Chunks int       `json:"chunks"`
		Sent   *int      `json:"sent"`
	}
	r.json(t, &failed)
	if r.status != 503 || failed.Error.Code != api.CodeEnqueueFailed || failed.Sent == nil || failed.Chunks != 20 || *failed.Sent >= 20 {
		t.Fatalf("with entries failing for good: %d %s", r.status, r.body)
	}
	partial := e.drain(*failed.Sent)
	if len(partial) != *failed.Sent {
		t.Errorf("503 says %d sent, the queue has %d", *failed.Sent, len(partial))
	}
	q.set(false) // every injected entry fails once more, then passes
	a = s.mustPost(body, map[string]string{"Idempotency-Key": "flaky"})
	if a.JobID != failed.JobID {
		t.Errorf("retry after 503 made job %s, want %s", a.JobID, failed.JobID)
	}
	// The chunks sent before are sent again: at-least-once, collapsed downstream.
	seen := map[int]int{}
	for _, m := range append(partial, e.drain(20)...) {
		if m.work.JobID != a.JobID {
			t.Errorf("message of job %s", m.work.JobID)
		}
		seen[m.work.Chunk]++
	}
	for c := range 20 {
		if seen[c] == 0 {
			t.Errorf("chunk %d never reached the queue", c)
		}
	}
}
