package batches

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/publisher/jobs"
)

// A client creates one batch at a time: while one of its creates is in
// progress (standing in: its key in batchCreators), another is 429
// batch_busy with Retry-After, and another client's is not held back.
func TestOneBatchCreateAtATimePerClient(t *testing.T) {
	c := sqstest.S3(t)
	p := newStack(t, payload.New(c, sqstest.Bucket(t, c)), jobs.Config{}, nopQueue{})
	h := p.Handler()
	post := func(addr string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/batches", strings.NewReader(
			`{"input_file_id":"file-0193a1b2c3d4e5f60718293a4b5c6d7e","endpoint":"/v1/embeddings","completion_window":"24h"}`))
		r.Header.Set("Content-Type", "application/json")
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	busy := httptest.NewRequest(http.MethodPost, "/v1/batches", nil)
	busy.RemoteAddr = "192.0.2.1:1000"
	p.batchCreators.add(p.gate.ClientKey(busy))
	if w := post("192.0.2.1:2000"); w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), `"code":"batch_busy"`) ||
		w.Header().Get("Retry-After") == "" {
		t.Errorf("a second create of the same client: %d %s", w.Code, w.Body)
	}
	// Another client gets as far as the file, which does not exist.
	if w := post("198.51.100.7:1000"); w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), `"param":"input_file_id"`) {
		t.Errorf("another client's create: %d %s", w.Code, w.Body)
	}
	p.batchCreators.remove(p.gate.ClientKey(busy))
	if w := post("192.0.2.1:2000"); w.Code != http.StatusNotFound {
		t.Errorf("once the first create ends: %d %s", w.Code, w.Body)
	}
}
