package batches

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/internal/heaptest"
	"github.com/vramq/vramq/publisher/jobs"
)

// putBatchFile stores a batch input file of n lines, line(i) each (without
// its newline), streamed into store as it is written, never held, and its
// record; it returns the file's id and size.
func putBatchFile(tb testing.TB, store *payload.Store, n int, line func(i int) string) (string, int64) {
	tb.Helper()
	now := time.Now()
	id := files.NewID(now)
	pr, pw := io.Pipe()
	go func() {
		var err error
		for i := 0; err == nil && i < n; i++ {
			_, err = io.WriteString(pw, line(i)+"\n")
		}
		pw.CloseWithError(err)
	}()
	size, err := store.Upload(tb.Context(), job.FileKey("", id), "application/jsonl", pr)
	if err != nil {
		tb.Fatal(err)
	}
	rec, _ := json.Marshal(files.Record{V: 1, ID: id, Filename: "input.jsonl", Bytes: size, Lines: n,
		Purpose: files.PurposeBatch, CreatedAt: now.Unix(), ExpiresAt: now.Add(time.Hour).Unix()})
	if _, err := store.Put(tb.Context(), job.FileRecordKey("", id), rec); err != nil {
		tb.Fatal(err)
	}
	return id, size
}

// paddedLine is an embeddings request of about size bytes.
func paddedLine(size int) func(i int) string {
	return func(i int) string {
		head := fmt.Sprintf(`{"custom_id":"doc-%05d","method":"POST","url":"/v1/embeddings","body":{"model":"bge-small","input":"`, i)
		return head + strings.Repeat("x", size-len(head)-4) + `"}}`
	}
}

// createAndValidate posts a batch of fileID to p and runs the sweep that
// validates it, returning the peak heap above idle over both, and the batch.
func createAndValidate(tb testing.TB, p *stack, fileID string) (uint64, batchObject) {
	tb.Helper()
	h := p.Handler()
	req := httptest.NewRequest(http.MethodPost, "/v1/batches", strings.NewReader(
		`{"input_file_id":"`+fileID+`","endpoint":"/v1/embeddings","completion_window":"24h"}`))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	var bo batchObject
	peak := heaptest.Peak(func() {
		h.ServeHTTP(w, req)
		if err := json.Unmarshal(w.Body.Bytes(), &bo); err != nil {
			tb.Errorf("create: %d %s", w.Code, w.Body)
			return
		}
		if err := p.Sweep(tb.Context()); err != nil {
			tb.Error(err)
		}
	})
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/batches/"+bo.ID, nil))
	if err := json.Unmarshal(w.Body.Bytes(), &bo); err != nil {
		tb.Fatalf("get: %d %s", w.Code, w.Body)
	}
	return peak, bo
}

func heapPublisher(tb testing.TB) (*stack, *payload.Store) {
	c := sqstest.S3(tb)
	store := payload.New(c, sqstest.Bucket(tb, c))
	p := newStack(tb, store, jobs.Config{}, nopQueue{})
	return p, store
}

// Issue 32, item 5: a batch's create and its validation read the input file
// line by line and send it a window of chunks at a time: for a 48 MiB file
// of 6,144 requests, the heap's peak above idle, over the create and the
// sweep that validates and sends the batch, stays under half the file
// (12.5 MiB here at GOGC 10; 26 MiB for a 191 MiB file at the default:
// BenchmarkBatchCreateHeap). Before, the create held every line, the plan
// and the custom ids: 3.1 times the file. The test is not parallel, so no
// other test's heap is counted.
func TestBatchCreateIsNotHeldInMemory(t *testing.T) {
	p, store := heapPublisher(t)
	// A small file would hide in the garbage the collector's default pacing
	// lets grow (up to the live heap again): collect at a tenth instead, so
	// the peak is close to what the create holds and a 24 MiB file shows it.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	const lines, lineBytes = 6_144, 8 << 10
	fileID, size := putBatchFile(t, store, lines, paddedLine(lineBytes-1))
	peak, bo := createAndValidate(t, p, fileID)
	if bo.Status != batchInProgress || bo.RequestCounts.Total != lines {
		t.Fatalf("the batch is %s with %d requests; want in_progress with %d", bo.Status, bo.RequestCounts.Total, lines)
	}
	t.Logf("peak heap above idle: %.1f MiB for a %.0f MiB file", float64(peak)/(1<<20), float64(size)/(1<<20))
	if peak > uint64(size)/2 {
		t.Errorf("the heap peaked %.1f MiB above idle making a batch of a %.0f MiB file; want under half of it",
			float64(peak)/(1<<20), float64(size)/(1<<20))
	}
}

// BenchmarkBatchCreateHeap reports the peak heap above idle of a batch's
// create and validation (TestBatchCreateIsNotHeldInMemory's measure) for a
// file at OpenAI's limits: 50,000 requests of 4,000 bytes, 200 MB.
//
//	go test -run '^$' -bench BatchCreateHeap -benchtime 1x -timeout 20m ./publisher/batches
func BenchmarkBatchCreateHeap(b *testing.B) {
	p, store := heapPublisher(b)
	fileID, size := putBatchFile(b, store, 50_000, paddedLine(3_999))
	var worst uint64
	for b.Loop() {
		peak, bo := createAndValidate(b, p, fileID)
		if bo.Status != batchInProgress {
			b.Fatalf("the batch is %s", bo.Status)
		}
		worst = max(worst, peak)
	}
	b.ReportMetric(float64(worst)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(size)/(1<<20), "file-MiB")
}
