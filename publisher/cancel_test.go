package publisher_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
)

// cancel sends DELETE /v1/jobs/{id} with header and decodes its 200 answer.
func (s *server) cancel(t *testing.T, jobID string, header map[string]string) jobStatus {
	t.Helper()
	r := s.do("DELETE", "/v1/jobs/"+jobID, header, nil)
	if r.status != 200 {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("DELETE: Content-Type %q", ct)
	}
	var st jobStatus
	r.json(t, &st)
	return st
}

// statusAs is GET /v1/jobs/{id} with header.
func (s *server) statusAs(t *testing.T, jobID string, header map[string]string) jobStatus {
	t.Helper()
	r := s.do("GET", "/v1/jobs/"+jobID, header, nil)
	if r.status != 200 {
		t.Fatalf("GET: %d %s", r.status, r.body)
	}
	var st jobStatus
	r.json(t, &st)
	return st
}

// TestCancelJob plays the subscriber's part by hand: a running job is
// cancelled once (a repeat finds the first cancel, with its time), its
// status counts the chunks done, cancelled and still pending; a finished
// job is left as it is; the key is required as on the job's other routes.
func TestCancelJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{API: publisher.API{APIKeys: []string{"k1"}}})
	auth := map[string]string{"Authorization": "Bearer k1"}
	a := s.mustPost(jobBody(t, manyItems("c", 8, 2), 2), auth)
	if a.Chunks != 4 {
		t.Fatalf("%d chunks, want 4", a.Chunks)
	}
	works := checkWhole(t, a, e.drain(a.Chunks))

	// Without the key, or with another: 401, and nothing is cancelled.
	for _, h := range []map[string]string{nil, {"Authorization": "Bearer k2"}} {
		if r := s.do("DELETE", "/v1/jobs/"+a.JobID, h, nil); r.status != 401 {
			t.Errorf("DELETE with %v: %d %s", h, r.status, r.body)
		}
	}
	if _, err := e.store.Read(t.Context(), job.CancelKey(a.JobID)); !errors.Is(err, payload.ErrMissing) {
		t.Fatalf("a refused DELETE left a cancel record: %v", err)
	}

	// Chunk 0 finished before the cancel.
	result := func(c int) job.Result {
		r := job.Result{V: 1, JobID: a.JobID, Chunk: c, Model: "m", Attempt: 1}
		for _, it := range works[c].Items {
			r.Outputs = append(r.Outputs, job.Output{ID: it.ID, Embedding: []float32{1}})
		}
		return r
	}
	e.putJSON(job.ResultKey(a.JobID, 0), result(0))

	st := s.cancel(t, a.JobID, auth)
	if st.Status != jobs.StatusCancelled || st.ChunksDone != 1 || st.ChunksCancelled != 0 || st.ChunksPending != 3 ||
		st.CancelledAt == nil || len(st.Results) != 0 {
		t.Fatalf("first DELETE: %+v", st)
	}
	first := *st.CancelledAt
	time.Sleep(1100 * time.Millisecond) // a second write would carry another time
	again := s.cancel(t, a.JobID, auth)
	if again.Status != jobs.StatusCancelled || again.CancelledAt == nil || !again.CancelledAt.Equal(first) {
		t.Errorf("repeated DELETE: %+v; want the first cancel's time %v", again, first)
	}

	// The subscriber deletes two chunks unrun; one was running and finishes.
	e.putJSON(job.CancelledKey(a.JobID, 1), job.CancelledMarker{V: 1, JobID: a.JobID, Chunk: 1})
	e.putJSON(job.CancelledKey(a.JobID, 2), job.CancelledMarker{V: 1, JobID: a.JobID, Chunk: 2})
	st = s.statusAs(t, a.JobID, auth)
	if st.Status != jobs.StatusCancelled || st.ChunksDone != 1 || st.ChunksCancelled != 2 || st.ChunksPending != 1 ||
		len(st.Results) != 0 {
		t.Errorf("GET while chunk 3 runs: %+v", st)
	}
	e.putJSON(job.ResultKey(a.JobID, 3), result(3))
	// A cancelled marker where a result is (anyone who can send to the
	// queue can have one written) does not count.
	e.putJSON(job.CancelledKey(a.JobID, 3), job.CancelledMarker{V: 1, JobID: a.JobID, Chunk: 3})
	st = s.statusAs(t, a.JobID, auth)
	if st.Status != jobs.StatusCancelled || st.ChunksDone != 2 || st.ChunksCancelled != 2 || st.ChunksPending != 0 ||
		st.ItemsDone != 4 || len(st.Results) != 2 {
		t.Errorf("GET once settled: %+v", st)
	}

	// A finished job: DELETE answers its status and writes nothing.
	b := s.mustPost(jobBody(t, manyItems("d", 2, 2), 1), auth)
	bw := checkWhole(t, b, e.drain(b.Chunks))
	for c := range b.Chunks {
		r := job.Result{V: 1, JobID: b.JobID, Chunk: c, Model: "m", Attempt: 1}
		for _, it := range bw[c].Items {
			r.Outputs = append(r.Outputs, job.Output{ID: it.ID, Embedding: []float32{1}})
		}
		e.putJSON(job.ResultKey(b.JobID, c), r)
	}
	for range 2 {
		st = s.cancel(t, b.JobID, auth)
		if st.Status != jobs.StatusComplete || st.ChunksDone != b.Chunks || st.CancelledAt != nil {
			t.Errorf("DELETE of a finished job: %+v", st)
		}
	}
	if _, err := e.store.Read(t.Context(), job.CancelKey(b.JobID)); !errors.Is(err, payload.ErrMissing) {
		t.Errorf("DELETE of a finished job wrote a cancel record: %v", err)
	}

	// An unknown job: 404, as GET.
	if r := s.do("DELETE", "/v1/jobs/0123456789abcdef0123456789abcdef", auth, nil); r.status != 404 {
		t.Errorf("DELETE of an unknown job: %d %s", r.status, r.body)
	}
}

// countingModel records the items its model was asked to run.
type countingModel struct {
	gpu.Model
	mu  sync.Mutex
	ran map[string]int // by item id without its number (manyItems' prefix)
}

func (m *countingModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	m.mu.Lock()
	for _, it := range items {
		m.ran[strings.TrimRight(it.ID, "0123456789")]++
	}
	m.mu.Unlock()
	return m.Model.Run(ctx, items)
}

func (m *countingModel) runs(prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ran[prefix]
}

// TestCancelEndToEnd: a job of many chunks is posted while no subscriber
// runs, then cancelled; a subscriber started after deletes every chunk
// without running it (the model never sees its items), GET reports it
// cancelled with every chunk counted, and nothing is left on the queues.
// Another job, not cancelled, on the same queue runs as usual.
func TestCancelEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	gone := s.mustPost(jobBody(t, manyItems("gone", 40, 3), 1), nil)
	kept := s.mustPost(jobBody(t, manyItems("kept", 6, 3), 1), nil)
	if gone.Chunks != 40 || kept.Chunks != 6 {
		t.Fatalf("chunks %d and %d, want 40 and 6", gone.Chunks, kept.Chunks)
	}
	if st := s.cancel(t, gone.JobID, nil); st.Status != jobs.StatusCancelled || st.ChunksPending != 40 {
		t.Fatalf("DELETE: %+v", st)
	}

	m := &countingModel{ran: map[string]int{}}
	e.runSubscriberWith(func(inner gpu.Model) gpu.Model { m.Model = inner; return m })

	settled := func(id string) jobStatus {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			st := s.status(t, id, "?page_size=1")
			if st.ChunksPending == 0 {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: %+v after 60s", id, st)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	st := settled(gone.JobID)
	if st.Status != jobs.StatusCancelled || st.ChunksCancelled != 40 || st.ChunksDone != 0 || st.ChunksFailed != 0 ||
		st.Chunks != st.ChunksCancelled+st.ChunksDone+st.ChunksFailed+st.ChunksPending {
		t.Errorf("cancelled job: %s, %d chunks: %d done, %d cancelled, %d failed, %d pending",
			st.Status, st.Chunks, st.ChunksDone, st.ChunksCancelled, st.ChunksFailed, st.ChunksPending)
	}
	if st := settled(kept.JobID); st.Status != jobs.StatusComplete || st.ChunksDone != 6 {
		t.Errorf("the other job: %+v", st)
	}
	if n := m.runs("gone"); n != 0 {
		t.Errorf("the model ran %d items of the cancelled job", n)
	}
	if n := m.runs("kept"); n < 6 {
		t.Errorf("the model ran %d items of the other job, want its 6", n)
	}
	for name, url := range map[string]string{"work": e.urls.Work, "DLQ": e.urls.DLQ} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			visible, inflight, err := jobq.Counts(t.Context(), e.client, url)
			if err != nil {
				t.Fatal(err)
			}
			if visible+inflight == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s queue: %d visible, %d in flight; want none", name, visible, inflight)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}
