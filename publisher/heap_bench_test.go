package publisher

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/internal/heaptest"
	"github.com/vramq/vramq/publisher/jobs"
)

// maxSizeBody is a POST /v1/jobs body at the default limits: 10,000 items
// of text that fill 32 MiB together.
func maxSizeBody(tb testing.TB) []byte {
	const items, limit = 10_000, 32 << 20
	text := strings.Repeat("lorem ipsum ", (limit/items-40)/12)
	req := jobs.JobRequest{}
	for i := range items {
		req.Items = append(req.Items, jobs.RequestItem{ID: fmt.Sprintf("item-%05d", i), Text: text})
	}
	body, err := json.Marshal(req)
	if err != nil || len(body) > limit {
		tb.Fatalf("body of %d bytes: %v", len(body), err)
	}
	return body
}

// BenchmarkConcurrentMaxBodies posts 8 maximum-size bodies (32 MiB, 10,000
// items) at once to one publisher and reports the peak heap above the idle
// one, in MiB, and how many of the 8 were accepted. "unbounded" lifts the
// bound on bodies in flight out of reach (the publisher before it had one);
// "default" is the default bound, twice MaxBodyBytes.
//
//	go test -run '^$' -bench ConcurrentMaxBodies -benchtime 3x ./publisher
//
// On the 2-core development machine: unbounded 1155 MiB, 8 of 8 taken
// (1375-1456 MiB on 40168d0, before the bound, the exact-size chunk bodies
// and the early body hash); default 352 MiB, 2 of 8 taken and 6 answered 503
// overloaded.
func BenchmarkConcurrentMaxBodies(b *testing.B) {
	body := maxSizeBody(b)
	const clients = 8
	for _, bc := range []struct {
		name     string
		inFlight int64
	}{{"unbounded", 1 << 40}, {"default", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			p, err := New(Config{
				Queue: nopQueue{},
				Jobs:  Jobs{MaxMessageBytes: job.MaxMessageBytes},
				API: API{
					MaxBodyBytesInFlight: bc.inFlight,
					Logger:               slog.New(slog.DiscardHandler),
					Registerer:           prometheus.NewRegistry(),
				},
			})
			if err != nil {
				b.Fatal(err)
			}
			h := p.Handler()
			var worst uint64
			var accepted int
			for b.Loop() {
				var mu sync.Mutex
				accepted = 0
				peak := heaptest.Peak(func() {
					var wg sync.WaitGroup
					start := make(chan struct{})
					for i := range clients {
						wg.Go(func() {
							req := httptest.NewRequest(http.MethodPost, "/v1/jobs", bytes.NewReader(body))
							req.Header.Set("Content-Type", "application/json")
							// Clients of their own: this is the bound over
							// all of them, not one client's share.
							req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1234", i+1)
							w := httptest.NewRecorder()
							<-start
							h.ServeHTTP(w, req)
							switch w.Code {
							case http.StatusAccepted:
								mu.Lock()
								accepted++
								mu.Unlock()
							case http.StatusServiceUnavailable:
							default:
								b.Errorf("%d: %.200s", w.Code, w.Body)
							}
						})
					}
					close(start)
					wg.Wait()
				})
				worst = max(worst, peak)
			}
			b.ReportMetric(float64(worst)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(accepted), "accepted/8")
			b.ReportMetric(float64(worst)/float64(clients*len(body)), "peak/bodies")
		})
	}
}

// nopQueue takes every message at once.
type nopQueue struct{}

func (nopQueue) SendBatch(_ context.Context, entries []jobs.Entry) ([]error, error) {
	return make([]error, len(entries)), nil
}
