package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestCreateOnceStates (issue 34, item 1): what a create with an
// Idempotency-Key finds of an earlier request with the key. A failed create
// leaves the key to a retry, which creates; one at work is 409 with
// Retry-After until stale, then taken over; one answered 200 is replayed, to
// the same request only; the key of another kind of create is 422.
func TestCreateOnceStates(t *testing.T) {
	t.Parallel()
	p, err := NewGate(testConfig(Config{Idem: NewMemIdem(time.Hour, 100)}))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	p.now = func() time.Time { return now }
	req := httptest.NewRequest(http.MethodPost, "/v1/batches", nil)
	req.Header.Set("Idempotency-Key", "k-1")
	const stale = time.Hour
	claim := func(kind, sum string) (*CreateOnce, *httptest.ResponseRecorder, int, *Error) {
		t.Helper()
		c, e := p.NewCreateOnce(req, stale)
		if c == nil || e != nil {
			t.Fatalf("newCreateOnce: %v, %v", c, e)
		}
		w := httptest.NewRecorder()
		got, e := c.Claim(req, w, kind, sum)
		return c, w, got, e
	}
	wantCode := func(what string, e *Error, code string) {
		t.Helper()
		if e == nil || e.Code != code {
			t.Errorf("%s: %v; want %s", what, e, code)
		}
	}

	c, _, got, e := claim(KindBatch, "a")
	if got != ClaimNew || e != nil {
		t.Fatalf("first claim: %d, %v", got, e)
	}
	c.Fail(t.Context())
	// This one is left at work.
	_, _, got, e = claim(KindBatch, "a")
	if got != ClaimNew || e != nil {
		t.Errorf("claim after a failed create: %d, %v; want to create", got, e)
	}
	_, w, _, e := claim(KindBatch, "a")
	wantCode("claim while the first is at work", e, CodeIdempotencyBusy)
	if w.Header().Get("Retry-After") != "1" {
		t.Errorf("409's Retry-After: %q", w.Header().Get("Retry-After"))
	}
	now = now.Add(stale)
	c, _, got, e = claim(KindBatch, "a")
	if got != ClaimNew || e != nil {
		t.Errorf("claim once the first is stale: %d, %v; want to take it over", got, e)
	}
	w = httptest.NewRecorder()
	c.Answer(t.Context(), w, "a", map[string]string{"id": "batch_1"})
	c.Fail(t.Context()) // deferred by the handler: a no-op once answered
	first := w.Body.String()

	c, _, got, e = claim(KindBatch, "a")
	if got != ClaimReplay || e != nil {
		t.Fatalf("claim after a 200: %d, %v; want a replay", got, e)
	}
	w = httptest.NewRecorder()
	if e := c.Replay(w, "a"); e != nil || w.Code != http.StatusOK || w.Body.String() != first ||
		w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %v %d %q (Idempotent-Replayed %q); want 200 %q", e, w.Code, w.Body, w.Header().Get("Idempotent-Replayed"), first)
	}
	_, _, _, e = claim(KindBatch, "b")
	wantCode("the key with another request", e, CodeIdempotencyReused)
	c, _, got, e = claim(KindFile, "")
	if e == nil && got == ClaimReplay {
		e = c.Replay(httptest.NewRecorder(), "a")
	}
	wantCode("the key on another route", e, CodeIdempotencyReused)
}

func TestMemIdemBounded(t *testing.T) {
	m := NewMemIdem(time.Hour, 3)
	now := time.Unix(1e9, 0)
	m.now = func() time.Time { return now }
	ctx := t.Context()
	for i := range 5 {
		if old, _ := m.Claim(ctx, fmt.Sprint(i), IdemRecord{JobID: fmt.Sprint("job", i)}); old != nil {
			t.Fatalf("claim %d found %+v", i, old)
		}
	}
	if len(m.recs) != 3 {
		t.Errorf("%d records, want 3", len(m.recs))
	}
	if old, _ := m.Claim(ctx, "4", IdemRecord{JobID: "other"}); old == nil || old.JobID != "job4" {
		t.Errorf("claim of a held key found %+v, want job4", old)
	}
	if old, _ := m.Claim(ctx, "0", IdemRecord{JobID: "again"}); old != nil {
		t.Errorf("evicted key still held: %+v", old)
	}
	now = now.Add(2 * time.Hour)
	if old, _ := m.Claim(ctx, "4", IdemRecord{JobID: "later"}); old != nil {
		t.Errorf("expired key still held: %+v", old)
	}
	if len(m.recs) != 1 {
		t.Errorf("%d records after expiry, want 1", len(m.recs))
	}
}
