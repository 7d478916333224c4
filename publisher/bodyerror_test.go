package publisher

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Every refusal of a body that passes with time says so three ways: the
// status and code, Retry-After, and the sentence a person reads; and it is
// counted under its reason.
func TestBodyErrorRetryLater(t *testing.T) {
	p, err := New(Config{Queue: nopQueue{}, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err     error
		status  int
		code    string
		message string
		counter prometheus.Counter
	}{
		{errOverloaded, http.StatusServiceUnavailable, CodeOverloaded,
			"the publisher is holding as many request bodies as it may; nothing was sent, retry after the time in Retry-After",
			p.m.overloaded},
		{errUploads, http.StatusServiceUnavailable, CodeOverloaded,
			"the publisher is holding as many uploads as it may; nothing was kept, retry after the time in Retry-After",
			p.m.overloaded},
		{errClientBodies, http.StatusTooManyRequests, CodeTooManyBodies,
			fmt.Sprintf("this client has %d request bodies in flight, as many as it may; nothing was sent, retry after the time in Retry-After",
				p.cfg.MaxBodiesPerClient),
			p.m.bodyRefusals.WithLabelValues(refusedClientBodies)},
		{errClientBytes, http.StatusTooManyRequests, CodeTooManyBodies,
			fmt.Sprintf("this client's request bodies in flight would be over its share of %d bytes; nothing was sent, retry after the time in Retry-After",
				p.cfg.MaxBodyBytesPerClient),
			p.m.bodyRefusals.WithLabelValues(refusedClientBytes)},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			before := testutil.ToFloat64(tc.counter)
			w := httptest.NewRecorder()
			e := p.bodyError(w, tc.err)
			if e.Status != tc.status || e.Code != tc.code || e.Message != tc.message || w.Header().Get("Retry-After") != "1" {
				t.Errorf("bodyError = %d %s %q, Retry-After %q; want %d %s %q, Retry-After 1",
					e.Status, e.Code, e.Message, w.Header().Get("Retry-After"), tc.status, tc.code, tc.message)
			}
			if got := testutil.ToFloat64(tc.counter) - before; got != 1 {
				t.Errorf("counted %v times; want once", got)
			}
		})
	}
}
