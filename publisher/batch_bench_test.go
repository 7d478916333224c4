package publisher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
)

// BenchmarkBatchLifecycle makes a batch of the largest file OpenAI takes
// in lines (50,000 embeddings requests) and finalizes it: the create (read
// the file from the bucket, check every line, plan, record; the queue takes
// every chunk at once) and the first GET once every chunk has a result
// (stream the 50,000 answers into the output file), each timed and its
// heap peak above idle sampled (peakHeap). The results are written as a
// subscriber writes them (16 lines a chunk, a 384-float embedding each),
// before the timer; the bucket is the emulator's, another process.
//
// "sequential" reads one result at a time while finalizing, the baseline
// for "read-ahead" (readConcurrency at once, the publisher's way).
//
//	go test -run '^$' -bench BatchLifecycle -benchtime 1x -timeout 20m ./publisher
func BenchmarkBatchLifecycle(b *testing.B) {
	for _, c := range []struct {
		name  string
		ahead int
	}{{"sequential", 1}, {"read-ahead", readConcurrency}} {
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
	p, err := New(Config{Queue: nopQueue{}, Payloads: store, ChunkItems: 16, Logger: slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	h := p.Handler()
	var file bytes.Buffer
	for i := range lines {
		fmt.Fprintf(&file, `{"custom_id":"doc-%05d","method":"POST","url":"/v1/embeddings","body":{"model":"bge-small","input":"the text of document %d, a sentence or two long"}}`+"\n", i, i)
	}
	now := time.Now()
	fileID := newFileID(now)
	rec, _ := json.Marshal(fileRecord{V: 1, ID: fileID, Filename: "docs.jsonl", Bytes: int64(file.Len()), Lines: lines,
		Purpose: PurposeBatch, CreatedAt: now.Unix(), ExpiresAt: now.Add(time.Hour).Unix()})
	for key, body := range map[string][]byte{job.FileKey("", fileID): file.Bytes(), job.FileRecordKey("", fileID): rec} {
		if _, err := store.Put(b.Context(), key, body); err != nil {
			b.Fatal(err)
		}
	}
	emb := "[" + strings.TrimSuffix(strings.Repeat("0.0123456789,", 384), ",") + "]"
	var createS, finalS, createHeap, finalHeap float64
	for b.Loop() {
		b.StopTimer()
		req := httptest.NewRequest(http.MethodPost, "/v1/batches", strings.NewReader(
			`{"input_file_id":"`+fileID+`","endpoint":"/v1/embeddings","completion_window":"24h"}`))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		b.StartTimer()
		createS, createHeap = timedHeap(func() { h.ServeHTTP(w, req) })
		b.StopTimer()
		var bo batchObject
		if err := json.Unmarshal(w.Body.Bytes(), &bo); err != nil || bo.Status != batchInProgress {
			b.Fatalf("create: %d %s", w.Code, w.Body)
		}
		putResults(b, store, bo.ID, lines, 16, "bge-small", func(i int) string {
			return fmt.Sprintf(`{"id":"doc-%05d","response":{"status_code":200,"body":{"object":"list","data":[{"object":"embedding","index":0,"embedding":%s}],"model":"bge-small","usage":{"prompt_tokens":12,"total_tokens":12}}}}`, i, emb)
		})
		// The sweeper finalizes it (a read only shows it finalizing).
		b.StartTimer()
		finalS, finalHeap = timedHeap(func() {
			if err := p.Sweep(b.Context()); err != nil {
				b.Error(err)
			}
		})
		b.StopTimer()
		req = httptest.NewRequest(http.MethodGet, "/v1/batches/"+bo.ID, nil)
		w = httptest.NewRecorder()
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
	b.ReportMetric(float64(file.Len())/(1<<20), "file-MiB")
}
