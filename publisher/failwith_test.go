package publisher

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A handler's error must reach both the client and the request's log line
// (observe logs ri.code), whichever handler answers it.
func TestFailWithAnswersAndRecordsTheCode(t *testing.T) {
	ri := &reqInfo{}
	r := httptest.NewRequest(http.MethodGet, "/v1/files", nil)
	r = r.WithContext(context.WithValue(r.Context(), reqInfoKey{}, ri))
	w := httptest.NewRecorder()
	failWith(w, r)(noFileStore())
	if w.Code != http.StatusNotImplemented || ri.code != CodeStatusUnavailable {
		t.Fatalf("status %d, logged code %q; want %d and %q", w.Code, ri.code, http.StatusNotImplemented, CodeStatusUnavailable)
	}
}
