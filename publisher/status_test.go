package publisher_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
)

type jobStatus struct {
	JobID        string `json:"job_id"`
	Status       string `json:"status"`
	Chunks       int    `json:"chunks"`
	ChunksDone   int    `json:"chunks_done"`
	ChunksFailed int    `json:"chunks_failed"`
	// Cancel (issue 20)
	ChunksCancelled int        `json:"chunks_cancelled"`
	ChunksPending   int        `json:"chunks_pending"`
	CancelledAt     *time.Time `json:"cancelled_at"`
	Items           int        `json:"items"`
	ItemsDone       int        `json:"items_done"`
	ItemsFailed     int        `json:"items_failed"` // per-item errors (issue 20)
	Failed          []struct {
		Chunk  int    `json:"chunk"`
		Reason string `json:"reason"`
	} `json:"failed"`
	Results []struct {
		Chunk       int          `json:"chunk"`
		Model       string       `json:"model"`
		Outputs     []job.Output `json:"outputs"`
		ItemsFailed int          `json:"items_failed"`
	} `json:"results"`
	NextPageToken string `json:"next_page_token"`
}

func (s *server) status(t *testing.T, jobID, query string) jobStatus {
	t.Helper()
	r := s.do("GET", "/v1/jobs/"+jobID+query, nil, nil)
	if r.status != 200 {
		t.Fatalf("GET: %d %s", r.status, r.body)
	}
	var st jobStatus
	r.json(t, &st)
	return st
}

// putJSON writes v to key in the env's bucket.
func (e *env) putJSON(key string, v any) job.PayloadRef {
	e.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		e.t.Fatal(err)
	}
	ref, err := e.store.Put(e.t.Context(), key, b)
	if err != nil {
		e.t.Fatal(err)
	}
	return ref
}

// TestJobStatus plays the subscriber's part by hand (results, one of them
// claim-checked, and a failure marker) and reads the job's progress and its
// results a page at a time.
func TestJobStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	a := s.mustPost(jobBody(t, manyItems("s", 7, 3), 2), nil)
	if a.Chunks != 4 {
		t.Fatalf("%d chunks, want 4", a.Chunks)
	}
	works := checkWhole(t, a, e.drain(a.Chunks))

	st := s.status(t, a.JobID, "")
	if st.Status != jobs.StatusRunning || st.Chunks != 4 || st.ChunksDone != 0 || st.Items != 7 || len(st.Results) != 0 || st.Failed == nil {
		t.Errorf("before any result: %+v", st)
	}

	result := func(c int) job.Result {
		r := job.Result{V: 1, JobID: a.JobID, Chunk: c, Model: "m", Attempt: 1}
		for _, it := range works[c].Items {
			r.Outputs = append(r.Outputs, job.Output{ID: it.ID, Embedding: []float32{float32(c), 1}})
		}
		return r
	}
	e.putJSON(job.ResultKey(a.JobID, 0), result(0))
	e.putJSON(job.ResultKey(a.JobID, 1), result(1))
	e.putJSON(job.ResultKey(a.JobID, 3), result(3))
	e.putJSON(job.FailedKey(a.JobID, 2), map[string]any{"v": 1, "job_id": a.JobID, "chunk": 2, "reason": "out_of_memory: alone"})
	e.putJSON(job.ResultPrefix(a.JobID)+"stray.txt", "ignored")

	st = s.status(t, a.JobID, "?page_size=2")
	if st.Status != jobs.StatusPartial || st.ChunksDone != 3 || st.ChunksFailed != 1 || st.ItemsDone != 5 {
		t.Errorf("partial: %+v", st)
	}
	if len(st.Failed) != 1 || st.Failed[0].Chunk != 2 || st.Failed[0].Reason != "out_of_memory: alone" {
		t.Errorf("failed: %+v", st.Failed)
	}
	var pages [][]int
	outputs := map[int][]job.Output{}
	for token, n := "", 0; n < 5; n++ {
		q := "?page_size=2"
		if token != "" {
			q += "&page_token=" + token
		}
		st := s.status(t, a.JobID, q)
		var page []int
		for _, r := range st.Results {
			page = append(page, r.Chunk)
			outputs[r.Chunk] = r.Outputs
		}
		pages = append(pages, page)
		if token = st.NextPageToken; token == "" {
			break
		}
	}
	if fmt.Sprint(pages) != "[[0 1] [3]]" {
		t.Errorf("pages of chunks %v, want [[0 1] [3]]", pages)
	}
	for _, c := range []int{0, 1, 3} {
		if diff := cmp.Diff(result(c).Outputs, outputs[c]); diff != "" {
			t.Errorf("chunk %d outputs (-want +got):\n%s", c, diff)
		}
	}

	// A late result for the failed chunk completes the job.
	e.putJSON(job.ResultKey(a.JobID, 2), result(2))
	st = s.status(t, a.JobID, "?page_size=100")
	if st.Status != jobs.StatusComplete || st.ChunksDone != 4 || st.ChunksFailed != 0 || len(st.Failed) != 0 || len(st.Results) != 4 || st.NextPageToken != "" {
		t.Errorf("complete: %+v", st)
	}
}

// A stored result that refers to another object instead of holding the
// result is refused, not followed (issue 14, item 9): the subscriber never
// writes one, and following it would serve whatever object the reference
// names, in this bucket or another, of any size.
func TestJobStatusRefusesStoredReference(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	a := s.mustPost(jobBody(t, manyItems("r", 2, 3), 0), nil)
	e.drain(a.Chunks)
	// Someone else's object, shaped as this chunk's result so that only
	// the reference itself can give it away.
	elsewhere := job.Result{V: 1, JobID: a.JobID, Chunk: 0, Model: "m", Outputs: []job.Output{{ID: "secret", Embedding: []float32{1}}}}
	for _, key := range []string{"jobs/elsewhere.json", job.ResultKey(a.JobID, 0)} {
		ref := e.putJSON(key, elsewhere)
		e.putJSON(job.ResultKey(a.JobID, 0), job.Result{V: 1, JobID: a.JobID, Chunk: 0, Ref: &ref})
		r := s.do("GET", "/v1/jobs/"+a.JobID, nil, nil)
		if r.status != 503 || strings.Contains(string(r.body), "secret") {
			t.Errorf("a stored result referring to %s: %d %s; want 503 without its content", key, r.status, r.body)
		}
	}
}

// Issue 20, item 3: a chunk whose result carries item errors is done; the
// job counts its refused items as failed, not done, from the subscriber's
// item-error markers, and the results show each refused item's error. A
// marker claiming more items than its chunk holds, or for a chunk with no
// result, counts nothing.
func TestJobStatusItemErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	a := s.mustPost(jobBody(t, manyItems("s", 5, 3), 2), nil)
	works := checkWhole(t, a, e.drain(a.Chunks))
	if a.Chunks != 3 {
		t.Fatalf("%d chunks, want 3", a.Chunks)
	}
	for c, w := range works {
		r := job.Result{V: 1, JobID: a.JobID, Chunk: c, Model: "m", Attempt: 1}
		for i, it := range w.Items {
			o := job.Output{ID: it.ID, Embedding: []float32{1}}
			if c == 0 && i == 1 {
				o = job.Output{ID: it.ID, Error: job.NewItemError(job.ItemInvalidInput, "too many tokens")}
				r.ItemsFailed = 1
			}
			r.Outputs = append(r.Outputs, o)
		}
		if c < 2 {
			e.putJSON(job.ResultKey(a.JobID, c), r)
		}
	}
	e.putJSON(job.ItemErrorsKey(a.JobID, 0), job.ItemErrorsMarker{V: 1, JobID: a.JobID, Chunk: 0, ItemsFailed: 1})
	e.putJSON(job.ItemErrorsKey(a.JobID, 1), job.ItemErrorsMarker{V: 1, JobID: a.JobID, Chunk: 1, ItemsFailed: 99})
	e.putJSON(job.ItemErrorsKey(a.JobID, 2), job.ItemErrorsMarker{V: 1, JobID: a.JobID, Chunk: 2, ItemsFailed: 1})
	st := s.status(t, a.JobID, "")
	if st.Status != jobs.StatusRunning || st.ItemsDone != 3 || st.ItemsFailed != 1 {
		t.Errorf("running: %+v; want 3 items done, 1 failed", st)
	}
	e.putJSON(job.ResultKey(a.JobID, 2), job.Result{V: 1, JobID: a.JobID, Chunk: 2, Model: "m",
		Outputs: []job.Output{{ID: works[2].Items[0].ID, Embedding: []float32{1}}}})
	st = s.status(t, a.JobID, "")
	if st.Status != jobs.StatusComplete || st.ItemsDone != 3 || st.ItemsFailed != 2 || len(st.Results) != 3 {
		t.Fatalf("complete: %+v; want 3 items done, 2 failed (the marker of chunk 2 counts now)", st)
	}
	bad := st.Results[0].Outputs[1]
	if st.Results[0].ItemsFailed != 1 || bad.Error == nil || bad.Error.Code != "invalid_input" ||
		bad.Error.Message != "too many tokens" || bad.Embedding != nil {
		t.Errorf("chunk 0: %d failed, refused item %+v (error %+v)", st.Results[0].ItemsFailed, bad, bad.Error)
	}
}

// Issue 25, item 7: only the keys a subscriber writes count. results/j/01.json,
// results/j/+1.json and their kin under failed/, cancelled/ and itemerrors/
// look like chunk 1 to strconv.Atoi but are no chunk's (job.ChunkOfKey), so
// the job stays running with one chunk done, as its completion event counts it.
func TestJobStatusCountsOnlyChunkKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	a := s.mustPost(jobBody(t, manyItems("k", 2, 3), 1), nil)
	works := checkWhole(t, a, e.drain(a.Chunks))
	if a.Chunks != 2 {
		t.Fatalf("%d chunks, want 2", a.Chunks)
	}
	r := job.Result{V: 1, JobID: a.JobID, Chunk: 0, Model: "m", Attempt: 1,
		Outputs: []job.Output{{ID: works[0].Items[0].ID, Embedding: []float32{1}}}}
	e.putJSON(job.ResultKey(a.JobID, 0), r)
	for _, name := range []string{"01.json", "+1.json", "1.json.bak", "1.JSON", " 1.json", "2.json"} {
		e.putJSON(job.ResultPrefix(a.JobID)+name, r)
		e.putJSON(job.FailedPrefix(a.JobID)+name, job.FailedMarker{V: 1, JobID: a.JobID, Chunk: 1, Reason: "forged"})
		e.putJSON(job.CancelledPrefix(a.JobID)+name, job.CancelledMarker{V: 1, JobID: a.JobID, Chunk: 1})
	}
	e.putJSON(job.ItemErrorsPrefix(a.JobID)+"00.json", job.ItemErrorsMarker{V: 1, JobID: a.JobID, Chunk: 0, ItemsFailed: 1})
	st := s.status(t, a.JobID, "")
	if st.Status != jobs.StatusRunning || st.ChunksDone != 1 || st.ChunksFailed != 0 || st.ChunksCancelled != 0 ||
		st.ChunksPending != 1 || st.ItemsDone != 1 || st.ItemsFailed != 0 || len(st.Failed) != 0 {
		t.Errorf("status %+v; want running, 1 chunk done, 1 pending, 1 item done", st)
	}
}
