package publisher

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Behind a load balancer only its own addresses are trusted to name the
// client. A client inside the same network (the VPC) that is not one of
// them cannot mint fresh rate-limit buckets by sending its own
// X-Forwarded-For, neither directly nor through the balancer, which appends
// the client's real address on the right.
func TestForwardedForTrustsOnlyTheProxies(t *testing.T) {
	albs := []netip.Prefix{netip.MustParsePrefix("10.0.1.10/32"), netip.MustParsePrefix("10.0.2.10/32")}
	p, err := New(Config{
		Queue: &countingQueue{},
		API: API{
			RateLimit:      0.001,
			RateBurst:      2,
			TrustedProxies: albs,
			Logger:         slog.New(slog.DiscardHandler),
			Registerer:     prometheus.NewRegistry(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := p.Handler()
	post := func(remote, xff string) int {
		r := httptest.NewRequest("POST", "/v1/jobs", strings.NewReader(`{"items":[{"id":"a","text":"x"}]}`))
		r.Header.Set("Content-Type", "application/json")
		r.RemoteAddr = remote
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	var direct, viaALB []int
	for i := range 4 {
		// Straight from 10.0.5.6, a fresh forged address each time.
		direct = append(direct, post("10.0.5.6:40000", fmt.Sprintf("198.51.100.%d", i)))
	}
	for i := range 2 {
		// Through the balancer: the forged entry is on the left, the
		// balancer's record of 10.0.5.6 on the right.
		viaALB = append(viaALB, post(fmt.Sprintf("10.0.%d.10:3000", i%2+1), fmt.Sprintf("198.51.100.%d, 10.0.5.6", 50+i)))
	}
	if got := fmt.Sprint(direct, viaALB); got != "[202 202 429 429] [429 429]" {
		t.Errorf("one client at 10.0.5.6 with forged X-Forwarded-For: %s; want its burst of 2, then 429 whichever way it comes", got)
	}
	// Another client through the balancer has its own bucket.
	if c := post("10.0.1.10:3000", "203.0.113.9"); c != http.StatusAccepted {
		t.Errorf("another client through the balancer: %d", c)
	}
}

// Trusting every address would let every client name itself: a block of
// length 0 is refused.
func TestTrustingEveryAddressIsRefused(t *testing.T) {
	for _, s := range []string{"0.0.0.0/0", "::/0"} {
		c := Config{Queue: &countingQueue{}, API: API{TrustedProxies: []netip.Prefix{netip.MustParsePrefix(s)}}}
		c.setDefaults()
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "every address") {
			t.Errorf("trusted proxies %s: %v, want refused", s, err)
		}
	}
}

// Idempotency keys are scoped by API key: two tenants using the same
// Idempotency-Key get two jobs, and neither learns of the other's (no 422).
// Without auth there is one scope: the same key with another body is 422
// whoever sends it (documented in docs/security.md; clients should use random
// keys).
func TestIdempotencyKeysAreScopedPerAPIKey(t *testing.T) {
	srv, _, _ := rateTestServer(t, Config{API: API{APIKeys: []string{"tenant-a", "tenant-b"}}})
	post := func(key, idem, body string) (int, string) {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/v1/jobs", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", idem)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var a struct {
			JobID string `json:"job_id"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&a)
		return resp.StatusCode, a.JobID
	}
	const bodyA, bodyB = `{"items":[{"id":"a","text":"x"}]}`, `{"items":[{"id":"b","text":"y"}]}`
	ca, jobA := post("tenant-a", "order-1", bodyA)
	cb, jobB := post("tenant-b", "order-1", bodyB)
	if ca != 202 || cb != 202 || jobA == jobB {
		t.Errorf("two tenants, one Idempotency-Key: %d %s and %d %s; want two jobs", ca, jobA, cb, jobB)
	}
	if c, j := post("tenant-a", "order-1", bodyA); c != 202 || j != jobA {
		t.Errorf("tenant a's retry: %d %s, want its job %s", c, j, jobA)
	}
	if c, _ := post("tenant-a", "order-1", bodyB); c != http.StatusUnprocessableEntity {
		t.Errorf("tenant a, its key with another body: %d, want 422", c)
	}

	open, _, _ := rateTestServer(t, Config{})
	srv = open
	if c, _ := post("", "order-1", bodyA); c != 202 {
		t.Fatalf("without auth: %d", c)
	}
	if c, _ := post("", "order-1", bodyB); c != http.StatusUnprocessableEntity {
		t.Errorf("without auth, another client's key with another body: %d, want 422 (one namespace)", c)
	}
}
