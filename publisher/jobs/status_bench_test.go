package jobs

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/internal/heaptest"
)

// countingWriter is a ResponseWriter that keeps only the size of the body,
// as a socket would: what the benchmark measures is the handler's heap, not
// a recorder's copy of the answer.
type countingWriter struct {
	h     http.Header
	code  int
	bytes int
}

func (w *countingWriter) Header() http.Header         { return w.h }
func (w *countingWriter) WriteHeader(code int)        { w.code = code }
func (w *countingWriter) Write(b []byte) (int, error) { w.bytes += len(b); return len(b), nil }

// settledJob stores, on the emulator's S3, the manifest and the results of a
// settled job of the size issue 25 measured: 10,000 items (the most a
// request may hold) in chunks of 100 (options.chunk_items), each item a
// 420-float embedding, 45 MiB of results in all, so that one page of 100
// chunks is every result. It returns the store, the job's id and the bytes of
// its results.
func settledJob(b *testing.B) (*payload.Store, string, int64) {
	b.Helper()
	const items, chunkItems, dims = 10_000, 100, 420
	c := sqstest.S3(b)
	store := payload.New(c, sqstest.Bucket(b, c))
	jobID := newJobID()
	m := job.Manifest{V: 1, JobID: jobID, Items: items, CreatedAt: time.Now().UTC()}
	rng := rand.New(rand.NewPCG(1, 2))
	var results [][]byte
	for first := 0; first < items; first += chunkItems {
		r := job.Result{V: 1, JobID: jobID, Chunk: m.Chunks, Model: "bench", Attempt: 1}
		for i := first; i < min(first+chunkItems, items); i++ {
			e := make([]float32, dims)
			for d := range e {
				e[d] = rng.Float32()*2 - 1
			}
			r.Outputs = append(r.Outputs, job.Output{ID: fmt.Sprintf("item-%05d", i), Embedding: e})
		}
		raw, err := json.Marshal(r)
		if err != nil {
			b.Fatal(err)
		}
		results = append(results, raw)
		m.ChunkItems = append(m.ChunkItems, len(r.Outputs))
		m.Chunks++
	}
	raw, err := json.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := store.Put(b.Context(), job.ManifestKey(jobID), raw); err != nil {
		b.Fatal(err)
	}
	var total int64
	g, ctx := errgroup.WithContext(b.Context())
	g.SetLimit(16)
	for chunk, raw := range results {
		total += int64(len(raw))
		g.Go(func() error { _, err := store.Put(ctx, job.ResultKey(jobID, chunk), raw); return err })
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	return store, jobID, total
}

// BenchmarkJobPageHeap is GET /v1/jobs/{id}?page_size=100 of a settled
// 10,000-item job with 45 MiB of results (settledJob), on the emulator's S3,
// by one client and by eight at once. It reports the peak heap above the
// idle one in MiB, the size of one page's answer, how many of the GETs were
// answered 200, and the peak over the budget of results in flight. "default"
// is the default configuration; "page=all" lifts the cut by bytes out of
// reach, so a page is every result and only streaming bounds what a GET
// holds; "budget=4MiB" is that with the budget of results in flight cut to
// 4 MiB (below what Validate allows, set here directly), so that it binds.
//
//	eval "$(localstack/emulator.sh env)"
//	go test -run '^$' -bench JobPageHeap -benchtime 3x -benchmem ./publisher/jobs
func BenchmarkJobPageHeap(b *testing.B) {
	store, jobID, total := settledJob(b)
	for _, bc := range []struct {
		name             string
		pageBytes, limit int64
	}{{"default", 0, 0}, {"page=all", 1 << 40, 0}, {"budget=4MiB", 1 << 40, 4 << 20}} {
		p, h := newTestService(b, Config{MaxPageBytes: bc.pageBytes}, store)
		budget := p.cfg.MaxResultBytesInFlight
		if bc.limit > 0 {
			// One share of all of it: the GETs here are one client's.
			p.results.total, p.results.perClient, budget = semaphore.NewWeighted(bc.limit), bc.limit, bc.limit
		}
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/clients=%d", bc.name, clients), func(b *testing.B) {
				var worst uint64
				var pageBytes, ok int
				for b.Loop() {
					var mu sync.Mutex
					ok = 0
					peak := heaptest.Peak(func() {
						var wg sync.WaitGroup
						start := make(chan struct{})
						for range clients {
							wg.Go(func() {
								req := httptest.NewRequest(http.MethodGet, "/v1/jobs/"+jobID+"?page_size=100", nil)
								w := &countingWriter{h: http.Header{}}
								<-start
								h.ServeHTTP(w, req)
								mu.Lock()
								defer mu.Unlock()
								switch w.code {
								case http.StatusOK:
									ok++
									pageBytes = w.bytes
								case http.StatusServiceUnavailable:
								default:
									b.Errorf("GET: %d", w.code)
								}
							})
						}
						close(start)
						wg.Wait()
					})
					worst = max(worst, peak)
				}
				b.ReportMetric(float64(worst)/(1<<20), "peak-heap-MiB")
				b.ReportMetric(float64(pageBytes)/(1<<20), "page-MiB")
				b.ReportMetric(float64(total)/(1<<20), "results-MiB")
				b.ReportMetric(float64(ok), "ok")
				b.ReportMetric(float64(worst)/float64(budget), "peak/budget")
			})
		}
	}
}
