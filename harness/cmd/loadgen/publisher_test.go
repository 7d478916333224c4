package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// A rate-limited request is tried again after Retry-After, not failed.
func TestDoWaitsOutRateLimits(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"code":"rate_limited"}}`, http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"job_id":"j"}`))
	}))
	defer srv.Close()
	r := &publisherRun{url: srv.URL, client: srv.Client()}
	var out struct {
		JobID string `json:"job_id"`
	}
	if err := r.do(context.Background(), http.MethodGet, "/v1/jobs/j", nil, http.StatusOK, &out); err != nil {
		t.Fatalf("do: %v", err)
	}
	if out.JobID != "j" || calls.Load() != 2 {
		t.Errorf("job %q after %d calls; want j after 2 (one 429, one retry)", out.JobID, calls.Load())
	}
}

// A status other than the one wanted (and other than 429) is an error at once.
func TestDoFailsOnOtherStatus(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "no", http.StatusBadRequest)
	}))
	defer srv.Close()
	r := &publisherRun{url: srv.URL, client: srv.Client()}
	if err := r.do(context.Background(), http.MethodGet, "/x", nil, http.StatusOK, &struct{}{}); err == nil || calls.Load() != 1 {
		t.Errorf("do: %v after %d calls; want an error after 1", err, calls.Load())
	}
}
