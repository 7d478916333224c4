package jobs

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// watchedBudget is a budget of results in flight that keeps the most it
// ever lent at once, and, when steal is set, takes for itself the next
// charge given back, as another request would.
type watchedBudget struct {
	sem *semaphore.Weighted

	mu       sync.Mutex
	out, max int64
	steal    bool
	stolen   int64
}

func (b *watchedBudget) TryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.sem.TryAcquire(n) {
		return false
	}
	b.out += n
	b.max = max(b.max, b.out)
	return true
}

func (b *watchedBudget) Release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sem.Release(n)
	b.out -= n
	if b.steal && b.sem.TryAcquire(n) {
		b.steal, b.stolen = false, n
	}
}

// giveBack returns what steal took.
func (b *watchedBudget) giveBack() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sem.Release(b.stolen)
	b.stolen = 0
}

// TestResultsInFlightAreBounded (issue 25, item 2): GET /v1/jobs/{id} holds
// no more results at once than it reads ahead, however long its page; a
// GET whose first result the budget cannot take is answered 503 overloaded
// with Retry-After, and one that finds the budget taken by others after it
// has written results ends its page there, next_page_token naming the result
// it could not take; every charge comes back.
func TestResultsInFlightAreBounded(t *testing.T) {
	t.Parallel()
	const chunks = 12
	c := sqstest.S3(t)
	store := payload.New(c, sqstest.Bucket(t, c))
	jobID := newJobID()
	m := job.Manifest{V: 1, JobID: jobID, Chunks: chunks, Items: chunks, CreatedAt: time.Now().UTC()}
	var size int64
	for chunk := range chunks {
		m.ChunkItems = append(m.ChunkItems, 1)
		raw, err := json.Marshal(job.Result{V: 1, JobID: jobID, Chunk: chunk, Model: "m",
			Outputs: []job.Output{{ID: fmt.Sprintf("item-%02d", chunk), Embedding: []float32{float32(chunk), 0.5}}}})
		if err != nil {
			t.Fatal(err)
		}
		size = max(size, int64(len(raw))) // the largest, within a few bytes of the smallest
		if _, err := store.Put(t.Context(), job.ResultKey(jobID, chunk), raw); err != nil {
			t.Fatal(err)
		}
	}
	raw, _ := json.Marshal(m)
	if _, err := store.Put(t.Context(), job.ManifestKey(jobID), raw); err != nil {
		t.Fatal(err)
	}
	p, h := newTestService(t, Config{}, store)
	const budget = 1 << 20
	b := &watchedBudget{sem: semaphore.NewWeighted(budget)}
	p.results.total = b
	get := func(query string) (*httptest.ResponseRecorder, []int, string) {
		t.Helper()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/jobs/"+jobID+query, nil))
		var st struct {
			Status  string `json:"status"`
			Results []struct {
				Chunk   int          `json:"chunk"`
				Outputs []job.Output `json:"outputs"`
			} `json:"results"`
			NextPageToken string `json:"next_page_token"`
		}
		if w.Code == http.StatusOK {
			if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
				t.Fatalf("GET%s: %v: %s", query, err, w.Body)
			}
		}
		var got []int
		for _, r := range st.Results {
			got = append(got, r.Chunk)
			if len(r.Outputs) != 1 || r.Outputs[0].ID != fmt.Sprintf("item-%02d", r.Chunk) {
				t.Errorf("GET%s: chunk %d outputs %+v", query, r.Chunk, r.Outputs)
			}
		}
		b.mu.Lock()
		out := b.out
		b.mu.Unlock()
		if out != 0 {
			t.Fatalf("GET%s left %d bytes charged", query, out)
		}
		return w, got, st.NextPageToken
	}

	// A page of every chunk: the GET holds at most the result it writes
	// and those it reads ahead.
	if _, got, next := get("?page_size=100"); fmt.Sprint(got) != "[0 1 2 3 4 5 6 7 8 9 10 11]" || next != "" {
		t.Errorf("whole page: chunks %v, next %q", got, next)
	}
	if b.max == 0 || b.max > (resultsAhead+1)*size || b.max >= chunks*size {
		t.Errorf("the GET held %d bytes of results at once; want at most %d (%d results of %d bytes)",
			b.max, (resultsAhead+1)*size, resultsAhead+1, size)
	}

	// Others hold the whole budget: 503 overloaded, and nothing was read.
	if !b.sem.TryAcquire(budget) {
		t.Fatal("budget not free")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/jobs/"+jobID, nil))
	var e api.ErrorBody
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || w.Code != http.StatusServiceUnavailable ||
		e.Error.Code != api.CodeOverloaded || w.Header().Get("Retry-After") != "1" {
		t.Errorf("GET with the budget spent: %d %s (Retry-After %q)", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	b.sem.Release(budget)

	// Another request takes the budget as this one gives its first result
	// back: the page ends there, and the next one goes on from it.
	b.sem.TryAcquire(budget - size) // room for one result at a time, not two
	b.steal = true
	if _, got, next := get("?page_size=100"); fmt.Sprint(got) != "[0]" || next != "1" {
		t.Errorf("page cut by the budget: chunks %v, next %q; want [0] and 1", got, next)
	}
	b.giveBack()
	if _, got, next := get("?page_size=100&page_token=1"); fmt.Sprint(got) != "[1 2 3 4 5 6 7 8 9 10 11]" || next != "" {
		t.Errorf("the page after: chunks %v, next %q", got, next)
	}
	b.sem.Release(budget - size)
}
