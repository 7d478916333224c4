package batches

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/internal/heaptest"
	"github.com/vramq/vramq/publisher/jobs"
)

// BenchmarkBatchLifecycle makes a batch of the largest file OpenAI takes
// in lines (50,000 embeddings requests) and finalizes it: the create and
// its validation (the sweep that reads the file from the bucket twice,
// checks every line, and sends it; the queue takes every chunk at once) and the first GET once every chunk has a result
// (stream the 50,000 answers into the output file), each timed and its
// heap peak above idle sampled (heaptest.Peak). The results are written as a
// subscriber writes them (16 lines a chunk, a 384-float embedding each),
// before the timer; the bucket is the emulator's, another process.
//
// "sequential" reads one result at a time while finalizing, the baseline
// for "read-ahead" (api.ReadConcurrency at once, the publisher's way).
//
//	go test -run '^$' -bench BatchLifecycle -benchtime 1x -timeout 20m ./publisher/batches
func BenchmarkBatchLifecycle(b *testing.B) {
	for _, c := range []struct {
		name  string
		ahead int
	}{{"sequential", 1}, {"read-ahead", api.ReadConcurrency}} {
		b.Run(c.name, func(b *testing.B) {
			defer func(old int) { finalizeReadAhead = old }(finalizeReadAhead)
			finalizeReadAhead = c.ahead
			benchmarkBatchLifecycle(b)
		})
	}
}

func benchmarkBatchLifecycle(b *testing.B) {
	const lines = 50_000
	c := sqstest.S3(b)
	store := payload.New(c, sqstest.Bucket(b, c))
	p := newStack(b, store, jobs.Config{ChunkItems: 16}, nopQueue{})
	h := p.Handler()
	fileID, fileBytes := putBatchFile(b, store, lines, func(i int) string {
		return fmt.Sprintf(`{"custom_id":"doc-%05d","method":"POST","url":"/v1/embeddings","body":{"model":"bge-small","input":"the text of document %d, a sentence or two long"}}`, i, i)
	})
	emb := "[" + strings.TrimSuffix(strings.Repeat("0.0123456789,", 384), ",") + "]"
	var createS, finalS, createHeap, finalHeap float64
	for b.Loop() {
		t0 := time.Now()
		peak, bo := createAndValidate(b, p, fileID)
		createHeap, createS = float64(peak)/(1<<20), time.Since(t0).Seconds()
		b.StopTimer()
		if bo.Status != batchInProgress {
			b.Fatalf("create: %s", bo.Status)
		}
		putResults(b, store, bo.ID, lines, 16, "bge-small", func(i int) string {
			return fmt.Sprintf(`{"id":"doc-%05d","response":{"status_code":200,"body":{"object":"list","data":[{"object":"embedding","index":0,"embedding":%s}],"model":"bge-small","usage":{"prompt_tokens":12,"total_tokens":12}}}}`, i, emb)
		})
		// The sweeper finalizes it (a read only shows it finalizing).
		b.StartTimer()
		finalS, finalHeap = heaptest.Timed(func() {
			if err := p.Sweep(b.Context()); err != nil {
				b.Error(err)
			}
		})
		b.StopTimer()
		req := httptest.NewRequest(http.MethodGet, "/v1/batches/"+bo.ID, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if err := json.Unmarshal(w.Body.Bytes(), &bo); err != nil || bo.Status != batchCompleted || bo.RequestCounts.Completed != lines {
			b.Fatalf("finalize: %d %s", w.Code, w.Body)
		}
		b.StartTimer()
	}
	b.ReportMetric(createS, "create-s")
	b.ReportMetric(finalS, "finalize-s")
	b.ReportMetric(createHeap, "create-heap-MiB")
	b.ReportMetric(finalHeap, "finalize-heap-MiB")
	b.ReportMetric(float64(fileBytes)/(1<<20), "file-MiB")
}
