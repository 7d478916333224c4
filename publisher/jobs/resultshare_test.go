package jobs

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
)

// stuckWriter is a client that does not read its answer: the first Write of
// a 200 blocks until unblock is closed, so the handler holds what it charged
// for the page meanwhile. code gets the status once a Write is reached.
type stuckWriter struct {
	header  http.Header
	status  int
	code    chan int
	unblock chan struct{}
	once    sync.Once
}

func newStuckWriter(unblock chan struct{}) *stuckWriter {
	return &stuckWriter{header: http.Header{}, code: make(chan int, 1), unblock: unblock}
}

func (w *stuckWriter) Header() http.Header { return w.header }

func (w *stuckWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *stuckWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.once.Do(func() { w.code <- w.status })
	if w.status == http.StatusOK {
		<-w.unblock
	}
	return len(b), nil
}

// TestOneClientCannotHoldTheResults (issue 34, item 3): a tenant's GETs that
// do not read their answers hold results only up to its client's share of
// -max-inflight-result-bytes; the next is answered 429 too_many_results with
// Retry-After, and another tenant's GET is served from what is left. Once the
// stuck GETs end, every charge has come back.
func TestOneClientCannotHoldTheResults(t *testing.T) {
	t.Parallel()
	c := sqstest.S3(t)
	store := payload.New(c, sqstest.Bucket(t, c))
	// Two jobs of four one-item chunks, one per tenant, every result the
	// same size.
	var size int64
	putJob := func(owner string) string {
		t.Helper()
		jobID := newJobID()
		m := job.Manifest{V: 1, JobID: jobID, Owner: owner, Chunks: 4, Items: 4, ChunkItems: []int{1, 1, 1, 1}, CreatedAt: time.Now().UTC()}
		for chunk := range m.Chunks {
			raw, err := json.Marshal(job.Result{V: 1, JobID: jobID, Chunk: chunk, Model: "m",
				Outputs: []job.Output{{ID: "item", Embedding: []float32{0.5, 0.25}}}})
			if err != nil {
				t.Fatal(err)
			}
			size = int64(len(raw))
			if _, err := store.Put(t.Context(), job.ResultKey(jobID, chunk), raw); err != nil {
				t.Fatal(err)
			}
		}
		raw, _ := json.Marshal(m)
		if _, err := store.Put(t.Context(), job.ManifestKey(jobID), raw); err != nil {
			t.Fatal(err)
		}
		return jobID
	}
	jobA, jobB := putJob("acme"), putJob("globex")
	p, h := newTestService(t, Config{}, store, "acme:key-a", "globex:key-b")
	// Room for four results, two of them a client's: the shape of the
	// defaults (twice and once the largest result), at a size a test can
	// store. Validate holds the share to at least the largest result.
	p.results.total, p.results.perClient = semaphore.NewWeighted(4*size), 2*size
	get := func(w http.ResponseWriter, key, jobID string, chunk int) {
		req := httptest.NewRequest(http.MethodGet, "/v1/jobs/"+jobID+"?page_size=1&page_token="+strconv.Itoa(chunk), nil)
		req.Header.Set("Authorization", "Bearer "+key)
		h.ServeHTTP(w, req)
	}

	// Tenant A asks for each of its four results and reads none of them.
	unblock := make(chan struct{})
	var stuck sync.WaitGroup
	var codes []int
	var refused *stuckWriter
	for chunk := range 4 {
		w := newStuckWriter(unblock)
		stuck.Go(func() { get(w, "key-a", jobA, chunk) })
		code := <-w.code
		codes = append(codes, code)
		if code != http.StatusOK && refused == nil {
			refused = w
		}
	}
	if want := []int{200, 200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("tenant A's unread GETs: %v; want %v (two results are its share)", codes, want)
	}
	if refused != nil && refused.header.Get("Retry-After") != "1" {
		t.Errorf("the refused GET's Retry-After is %q; want 1", refused.header.Get("Retry-After"))
	}

	// Tenant B is served from the rest of the budget.
	w := httptest.NewRecorder()
	get(w, "key-b", jobB, 0)
	var st struct {
		Results []struct {
			Chunk int `json:"chunk"`
		} `json:"results"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != http.StatusOK || len(st.Results) != 1 {
		t.Errorf("tenant B's GET while A's are stuck: %d %s", w.Code, w.Body)
	}

	close(unblock)
	stuck.Wait()
	p.results.mu.Lock()
	held := len(p.results.clients)
	p.results.mu.Unlock()
	if held != 0 || !p.results.total.TryAcquire(4*size) {
		t.Errorf("after every GET ended, %d clients still hold results, or the budget is not whole", held)
	}
}

// TestResultShareDefaults: a client's share of the results in flight is half
// the budget, which is twice the largest result, so no client holds it all
// by default; a share below the largest result, or above the budget, is
// refused.
func TestResultShareDefaults(t *testing.T) {
	t.Parallel()
	c := Config{}
	c.SetDefaults()
	if c.MaxResultBytesInFlight != 2*job.MaxResultBytes || c.MaxResultBytesPerClient != job.MaxResultBytes {
		t.Errorf("defaults: %d in flight, %d per client; want %d and %d",
			c.MaxResultBytesInFlight, c.MaxResultBytesPerClient, 2*job.MaxResultBytes, job.MaxResultBytes)
	}
	for _, share := range []int64{job.MaxResultBytes - 1, 2*job.MaxResultBytes + 1} {
		if err := validate(Config{MaxResultBytesPerClient: share}); err == nil {
			t.Errorf("a share of %d: no error", share)
		}
	}
}
