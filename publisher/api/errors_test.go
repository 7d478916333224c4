package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A handler's error must reach both the client and the request's log line
// (Observe logs ri.Code), whichever handler answers it.
func TestFailWithAnswersAndRecordsTheCode(t *testing.T) {
	ri := &RequestInfo{}
	r := httptest.NewRequest(http.MethodGet, "/v1/files", nil)
	r = r.WithContext(context.WithValue(r.Context(), reqInfoKey{}, ri))
	w := httptest.NewRecorder()
	FailWith(w, r)(Err(http.StatusNotImplemented, CodeStatusUnavailable, "files need a bucket"))
	if w.Code != http.StatusNotImplemented || ri.Code != CodeStatusUnavailable {
		t.Fatalf("status %d, logged code %q; want %d and %q", w.Code, ri.Code, http.StatusNotImplemented, CodeStatusUnavailable)
	}
}
