package publisher_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
)

// Issue 25, item 2: a page of results is cut by bytes as well as by chunks,
// so that a job whose results are large answers in pages that each fit
// Lambda's 6 MB response, and next_page_token goes on from where the cut
// stopped: every result comes back once, in order, over the pages. Six
// results of 1.5 MiB, with a failed chunk among them, asked for 100 chunks
// a page.
func TestJobPagesAreCutByBytes(t *testing.T) {
	t.Parallel()
	const lambdaMaxResponse = 6 << 20
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	a := s.mustPost(jobBody(t, manyItems("p", 7, 2), 1), nil)
	works := checkWhole(t, a, e.drain(a.Chunks))
	want := map[int][]job.Output{}
	for c, w := range works {
		if c == 4 {
			e.putJSON(job.FailedKey(a.JobID, c), job.FailedMarker{V: 1, JobID: a.JobID, Chunk: c, Reason: "out_of_memory: alone"})
			continue
		}
		r := job.Result{V: 1, JobID: a.JobID, Chunk: c, Model: "m", Attempt: 1}
		for _, it := range w.Items {
			// 1.5 MiB of JSON: 150,000 floats of about 10 bytes each.
			e := make([]float32, 150_000)
			for i := range e {
				e[i] = float32(c) + float32(i)/1e6
			}
			r.Outputs = append(r.Outputs, job.Output{ID: it.ID, Embedding: e})
		}
		want[c] = r.Outputs
		e.putJSON(job.ResultKey(a.JobID, c), r)
	}

	got := map[int][]job.Output{}
	var order []int
	pages := 0
	for token := ""; ; {
		q := "?page_size=100"
		if token != "" {
			q += "&page_token=" + token
		}
		r := s.do("GET", "/v1/jobs/"+a.JobID+q, nil, nil)
		if r.status != 200 {
			t.Fatalf("GET %s: %d %.300s", q, r.status, r.body)
		}
		pages++
		if len(r.body) > lambdaMaxResponse {
			t.Errorf("page %d (%s) is %d bytes, over Lambda's %d", pages, q, len(r.body), lambdaMaxResponse)
		}
		var st jobStatus
		r.json(t, &st)
		if st.Status != jobs.StatusPartial || st.ChunksDone != 6 || len(st.Failed) != 1 {
			t.Errorf("page %d: %s, %d done, failed %+v", pages, st.Status, st.ChunksDone, st.Failed)
		}
		last := -1
		for _, res := range st.Results {
			order = append(order, res.Chunk)
			got[res.Chunk] = res.Outputs
			last = res.Chunk
		}
		if st.NextPageToken == "" {
			break
		}
		// The next page starts right after this one's last result (or at
		// the failed chunk after it, which has none).
		if n, err := strconv.Atoi(st.NextPageToken); err != nil || n <= last || n > last+2 {
			t.Fatalf("page %d ends with chunk %d; next_page_token %q", pages, last, st.NextPageToken)
		}
		token = st.NextPageToken
		if pages > a.Chunks {
			t.Fatal("more pages than chunks")
		}
	}
	if fmt.Sprint(order) != "[0 1 2 3 5 6]" || pages < 2 {
		t.Errorf("results of chunks %v over %d pages; want [0 1 2 3 5 6], in more than one page", order, pages)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outputs (-want +got):\n%s", diff)
	}
}

// A result that cannot be read once the answer has begun ends the page
// before it, so a 200 is always whole JSON; the next page starts with it
// and is answered 503 while it still cannot be read. Here chunk 1's stored
// result refers to another object, which is never followed.
func TestJobPageEndsBeforeAnUnreadableResult(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	a := s.mustPost(jobBody(t, manyItems("u", 3, 2), 1), nil)
	works := checkWhole(t, a, e.drain(a.Chunks))
	for c, w := range works {
		r := job.Result{V: 1, JobID: a.JobID, Chunk: c, Model: "m", Outputs: []job.Output{{ID: w.Items[0].ID, Embedding: []float32{1}}}}
		if c == 1 {
			ref := e.putJSON("jobs/elsewhere.json", r)
			r = job.Result{V: 1, JobID: a.JobID, Chunk: c, Ref: &ref}
		}
		e.putJSON(job.ResultKey(a.JobID, c), r)
	}
	st := s.status(t, a.JobID, "?page_size=100")
	if len(st.Results) != 1 || st.Results[0].Chunk != 0 || st.NextPageToken != "1" {
		t.Errorf("first page: %+v; want chunk 0's result and next_page_token 1", st)
	}
	if r := s.do("GET", "/v1/jobs/"+a.JobID+"?page_size=100&page_token=1", nil, nil); r.status != 503 {
		t.Errorf("the page from the unreadable result: %d %s; want 503", r.status, r.body)
	}
}
