package publisher

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/internal/heaptest"
)

// heapFileBytes is the file TestUploadIsNotHeldInMemory uploads: 96 MiB,
// in lines of 2 KiB (49,152 of them, under the default limit of 50,000).
const (
	heapFileBytes = 96 << 20
	heapLineBytes = 2 << 10
)

// postLargeFile serves one POST /v1/files of a heapFileBytes file, sent by
// a goroutine as the handler reads it (no length: the body streams), and
// returns the answer.
func postLargeFile(t testing.TB, h http.Handler) *httptest.ResponseRecorder {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		line := append(bytes.Repeat([]byte("x"), heapLineBytes-1), '\n')
		err := mw.WriteField("purpose", files.PurposeBatch)
		var fw io.Writer
		if err == nil {
			fw, err = mw.CreateFormFile("file", "large.jsonl")
		}
		for i := 0; err == nil && i < heapFileBytes/heapLineBytes; i++ {
			_, err = fw.Write(line)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	req := httptest.NewRequest(http.MethodPost, "/v1/files", pr)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	pr.Close()
	return w
}

// Issue 28, files: an upload of 96 MiB streams through the publisher to
// the bucket (the emulator's, another process) without being held: the
// heap's peak above what was live before stays under a third of the file.
// Holding it whole, in any form, would take the file's size at least. The
// test is not parallel, so no other test's heap is counted.
func TestUploadIsNotHeldInMemory(t *testing.T) {
	c := sqstest.S3(t)
	store := payload.New(c, sqstest.Bucket(t, c))
	p, err := New(Config{Queue: nopQueue{}, Payloads: store, API: API{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()}})
	if err != nil {
		t.Fatal(err)
	}
	h := p.Handler()
	var w *httptest.ResponseRecorder
	peak := heaptest.Peak(func() { w = postLargeFile(t, h) })
	if w.Code != http.StatusOK {
		t.Fatalf("upload: %d %s", w.Code, w.Body)
	}
	var f struct {
		ID    string `json:"id"`
		Bytes int64  `json:"bytes"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &f); err != nil || f.Bytes != heapFileBytes {
		t.Fatalf("upload answered %s (%v)", w.Body, err)
	}
	// Stored whole: its size, as S3 has it.
	body, size, err := store.Open(t.Context(), job.FileKey("", f.ID))
	if err != nil || size != heapFileBytes {
		t.Fatalf("stored: %d bytes (%v)", size, err)
	}
	body.Close()
	t.Logf("peak heap above idle: %.1f MiB for a %d MiB file", float64(peak)/(1<<20), heapFileBytes>>20)
	if peak > heapFileBytes/3 {
		t.Errorf("the heap peaked %.1f MiB above idle during a %d MiB upload; want under a third of it",
			float64(peak)/(1<<20), heapFileBytes>>20)
	}
}

// BenchmarkUploadHeap reports the peak heap of one upload of
// heapFileBytes, in MiB, as TestUploadIsNotHeldInMemory measures it.
//
//	go test -run '^$' -bench UploadHeap -benchtime 3x ./publisher
func BenchmarkUploadHeap(b *testing.B) {
	c := sqstest.S3(b)
	store := payload.New(c, sqstest.Bucket(b, c))
	p, err := New(Config{Queue: nopQueue{}, Payloads: store, API: API{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()}})
	if err != nil {
		b.Fatal(err)
	}
	h := p.Handler()
	var worst uint64
	for b.Loop() {
		var w *httptest.ResponseRecorder
		worst = max(worst, heaptest.Peak(func() { w = postLargeFile(b, h) }))
		if w.Code != http.StatusOK {
			b.Fatalf("upload: %d %s", w.Code, w.Body)
		}
	}
	b.ReportMetric(float64(worst)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(heapFileBytes>>20), "file-MiB")
}
