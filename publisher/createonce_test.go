package publisher

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vramq/vramq/publisher/api"
)

// TestCreateOnceStates (issue 34, item 1): what a create with an
// Idempotency-Key finds of an earlier request with the key. A failed create
// leaves the key to a retry, which creates; one at work is 409 with
// Retry-After until stale, then taken over; one answered 200 is replayed, to
// the same request only; the key of another kind of create is 422.
func TestCreateOnceStates(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Queue: nopQueue{}, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	p.now = func() time.Time { return now }
	req := httptest.NewRequest(http.MethodPost, "/v1/batches", nil)
	req.Header.Set("Idempotency-Key", "k-1")
	const stale = time.Hour
	claim := func(kind, sum string) (*createOnce, *httptest.ResponseRecorder, int, *api.Error) {
		t.Helper()
		c, e := p.newCreateOnce(req, stale)
		if c == nil || e != nil {
			t.Fatalf("newCreateOnce: %v, %v", c, e)
		}
		w := httptest.NewRecorder()
		got, e := c.claim(req, w, kind, sum)
		return c, w, got, e
	}
	wantCode := func(what string, e *api.Error, code string) {
		t.Helper()
		if e == nil || e.Code != code {
			t.Errorf("%s: %v; want %s", what, e, code)
		}
	}

	c, _, got, e := claim(kindBatch, "a")
	if got != claimNew || e != nil {
		t.Fatalf("first claim: %d, %v", got, e)
	}
	c.fail(t.Context())
	// This one is left at work.
	_, _, got, e = claim(kindBatch, "a")
	if got != claimNew || e != nil {
		t.Errorf("claim after a failed create: %d, %v; want to create", got, e)
	}
	_, w, _, e := claim(kindBatch, "a")
	wantCode("claim while the first is at work", e, api.CodeIdempotencyBusy)
	if w.Header().Get("Retry-After") != "1" {
		t.Errorf("409's Retry-After: %q", w.Header().Get("Retry-After"))
	}
	now = now.Add(stale)
	c, _, got, e = claim(kindBatch, "a")
	if got != claimNew || e != nil {
		t.Errorf("claim once the first is stale: %d, %v; want to take it over", got, e)
	}
	w = httptest.NewRecorder()
	c.answer(t.Context(), w, "a", map[string]string{"id": "batch_1"})
	c.fail(t.Context()) // deferred by the handler: a no-op once answered
	first := w.Body.String()

	c, _, got, e = claim(kindBatch, "a")
	if got != claimReplay || e != nil {
		t.Fatalf("claim after a 200: %d, %v; want a replay", got, e)
	}
	w = httptest.NewRecorder()
	if e := c.replay(w, "a"); e != nil || w.Code != http.StatusOK || w.Body.String() != first ||
		w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %v %d %q (Idempotent-Replayed %q); want 200 %q", e, w.Code, w.Body, w.Header().Get("Idempotent-Replayed"), first)
	}
	_, _, _, e = claim(kindBatch, "b")
	wantCode("the key with another request", e, api.CodeIdempotencyReused)
	c, _, got, e = claim(kindFile, "")
	if e == nil && got == claimReplay {
		e = c.replay(httptest.NewRecorder(), "a")
	}
	wantCode("the key on another route", e, api.CodeIdempotencyReused)
}
