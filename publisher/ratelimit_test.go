package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func TestClientAddr(t *testing.T) {
	vpc := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("fd00::/8")}
	for _, tc := range []struct {
		name    string
		remote  string
		xff     []string
		trusted []netip.Prefix
		want    string
	}{
		{"direct client", "203.0.113.7:51000", nil, nil, "203.0.113.7"},
		{"forwarded-for ignored without trusted proxies", "203.0.113.7:51000", []string{"198.51.100.1"}, nil, "203.0.113.7"},
		{"forwarded-for ignored from an untrusted peer", "203.0.113.7:51000", []string{"198.51.100.1"}, vpc, "203.0.113.7"},
		{"behind the load balancer", "10.0.3.4:40000", []string{"198.51.100.1"}, vpc, "198.51.100.1"},
		// The client sent its own X-Forwarded-For; the balancer appended the
		// real address: the forged entry on the left is never reached.
		{"forged entry on the left", "10.0.3.4:40000", []string{"192.0.2.66, 198.51.100.1"}, vpc, "198.51.100.1"},
		{"two trusted hops", "10.0.3.4:40000", []string{"198.51.100.1, 10.0.9.9"}, vpc, "198.51.100.1"},
		{"headers joined in order", "10.0.3.4:40000", []string{"192.0.2.66", "198.51.100.1"}, vpc, "198.51.100.1"},
		{"every hop trusted", "10.0.3.4:40000", []string{"10.0.1.1, 10.0.2.2"}, vpc, "10.0.1.1"},
		{"no header from a trusted peer", "10.0.3.4:40000", nil, vpc, "10.0.3.4"},
		{"garbage stops the walk", "10.0.3.4:40000", []string{"198.51.100.1, not-an-ip"}, vpc, "10.0.3.4"},
		{"entry with a port", "10.0.3.4:40000", []string{"198.51.100.1:4711"}, vpc, "198.51.100.1"},
		{"Lambda source IP", "198.51.100.23:0", nil, nil, "198.51.100.23"},
		{"IPv4-mapped IPv6", "[::ffff:203.0.113.7]:51000", nil, nil, "203.0.113.7"},
		{"IPv6 behind the balancer", "[fd00::5]:40000", []string{"2001:db8:1:2:3:4:5:6"}, vpc, "2001:db8:1:2:3:4:5:6"},
		{"no peer address", "", nil, vpc, "invalid IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := clientAddr(tc.remote, tc.xff, tc.trusted); got.String() != tc.want {
				t.Errorf("clientAddr(%q, %q) = %s, want %s", tc.remote, tc.xff, got, tc.want)
			}
		})
	}
}

// An IPv6 client is its prefix of IPv6ClientPrefix bits, a /56 unless set;
// an IPv4 client is its address.
func TestAddrKey(t *testing.T) {
	key := func(prefix int, remote string) string {
		t.Helper()
		p, err := New(Config{Queue: &countingQueue{}, IPv6ClientPrefix: prefix, Logger: slog.New(slog.DiscardHandler),
			Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		return p.addrKey(r)
	}
	for _, tc := range []struct {
		name   string
		prefix int // 0: the default
		a, b   string
		same   bool
	}{
		{"two /64s of one /56, by default", 0, "[2001:db8:1:200::1]:1", "[2001:db8:1:2ff:ffff::9]:2", true},
		{"two /56s, by default", 0, "[2001:db8:1:200::1]:1", "[2001:db8:1:300::1]:1", false},
		{"two /56s of one /48, by /48", 48, "[2001:db8:1:200::1]:1", "[2001:db8:1:ff00::1]:1", true},
		{"two /48s, by /48", 48, "[2001:db8:1::1]:1", "[2001:db8:2::1]:1", false},
		{"two /64s of one /56, by /64", 64, "[2001:db8:1:200::1]:1", "[2001:db8:1:201::1]:1", false},
		{"two addresses of one /64, by /64", 64, "[2001:db8:1:2::1]:1", "[2001:db8:1:2:ffff::9]:2", true},
		{"two IPv4 addresses", 0, "203.0.113.7:1", "203.0.113.8:1", false},
	} {
		a, b := key(tc.prefix, tc.a), key(tc.prefix, tc.b)
		if (a == b) != tc.same {
			t.Errorf("%s: keys %q and %q, want the same: %v", tc.name, a, b, tc.same)
		}
	}
	if got := key(0, "[2001:db8:1:2ff:ffff::9]:2"); got != "addr:2001:db8:1:200::/56" {
		t.Errorf("key %q, want the address's /56", got)
	}
	for _, bad := range []int{-1, 16, 31, 129} {
		_, err := New(Config{Queue: &countingQueue{}, IPv6ClientPrefix: bad, Registerer: prometheus.NewRegistry()})
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "IPv6ClientPrefix" {
			t.Errorf("IPv6ClientPrefix %d: %v, want it refused", bad, err)
		}
	}
}

// The finding of issue 25: one site, given a /56, sent a request from each
// of its 256 /64s at once against a limit of burst 1, and all 256 were
// taken. Keyed by its /56 it is one client, and gets its burst; another
// site is not refused for it.
func TestOneSiteIsOneClient(t *testing.T) {
	// A rate so low that no token comes back while the test runs.
	p, err := New(Config{Queue: &countingQueue{}, RateLimit: 0.001, RateBurst: 1, Logger: slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	h := p.Handler()
	post := func(remote string) int {
		r := httptest.NewRequest("POST", "/v1/jobs", strings.NewReader(`{"items":[{"id":"a","text":"x"}]}`))
		r.Header.Set("Content-Type", "application/json")
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	codes := map[int]int{}
	for i := range 256 {
		codes[post(fmt.Sprintf("[2001:db8:0:ab%02x::1]:4000", i))]++
	}
	if codes[http.StatusAccepted] != 1 || codes[http.StatusTooManyRequests] != 255 {
		t.Errorf("one /56, a request from each of its /64s: %v, want its burst of 1 taken and 255 answered 429", codes)
	}
	if c := post("[2001:db8:0:ac00::1]:4000"); c != http.StatusAccepted {
		t.Errorf("the next /56: %d, want 202", c)
	}
}

// The global limit holds over all clients together: clients each well
// within their own limit are refused once the process has taken its burst,
// told so, and counted under scope global.
func TestGlobalLimitHoldsAcrossClients(t *testing.T) {
	reg := prometheus.NewRegistry()
	p, err := New(Config{Queue: &countingQueue{}, RateLimit: 100, GlobalRateLimit: 0.001, GlobalRateBurst: 5,
		Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	h := p.Handler()
	var got []string
	for i := range 20 {
		r := httptest.NewRequest("POST", "/v1/jobs", strings.NewReader(`{"items":[{"id":"a","text":"x"}]}`))
		r.Header.Set("Content-Type", "application/json")
		r.RemoteAddr = fmt.Sprintf("198.51.100.%d:4000", i+1)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		s := fmt.Sprint(w.Code)
		if w.Code != http.StatusAccepted {
			e := errorOf(t, w.Code, w.Header(), w.Body.Bytes())
			s += " " + e.Code
			if !strings.Contains(e.Message, "the publisher is taking too many requests") {
				t.Errorf("client %d: %q, want the global limit named", i, e.Message)
			}
		}
		got = append(got, s)
	}
	want := slices.Concat(slices.Repeat([]string{"202"}, 5), slices.Repeat([]string{"429 " + CodeRateLimited}, 15))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("20 clients, one request each, global burst 5 (-want +got):\n%s", diff)
	}
	if n := counterValue(t, reg, "vramq_publisher_rate_limited_total", "scope", scopeGlobal); n != 15 {
		t.Errorf("rate_limited_total{scope=global} = %v, want 15", n)
	}
}

func TestClientBuckets(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	allowed := func(c *clientBuckets, key string, at time.Time) bool {
		r, _, _ := c.reserve(key, at)
		if r.DelayFrom(at) > 0 {
			r.CancelAt(at)
			return false
		}
		return true
	}

	t.Run("burst, then the rate", func(t *testing.T) {
		c := newClientBuckets(2, 4, 100) // 2/s, burst 4
		for i := range 4 {
			if !allowed(c, "a", t0) {
				t.Fatalf("request %d of the burst refused", i+1)
			}
		}
		if allowed(c, "a", t0) {
			t.Error("a fifth request at once allowed over a burst of 4")
		}
		if !allowed(c, "b", t0) {
			t.Error("another client refused: buckets are per client")
		}
		// A refused request costs nothing: half a second later one token is back.
		if !allowed(c, "a", t0.Add(500*time.Millisecond)) {
			t.Error("refused half a second later at 2/s")
		}
		if allowed(c, "a", t0.Add(500*time.Millisecond)) {
			t.Error("two requests allowed half a second after an empty bucket at 2/s")
		}
	})

	t.Run("idle buckets are dropped once full again", func(t *testing.T) {
		c := newClientBuckets(2, 4, 100) // full again after 2s
		for i := range 50 {
			allowed(c, fmt.Sprintf("10.0.0.%d", i), t0)
		}
		if n := c.lru.Len(); n != 50 {
			t.Fatalf("%d buckets, want 50", n)
		}
		allowed(c, "late", t0.Add(2*time.Second))
		if n := c.lru.Len(); n != 1 {
			t.Errorf("%d buckets kept after 2s idle (the refill time), want only the new one", n)
		}
	})

	t.Run("a flood of addresses stays bounded", func(t *testing.T) {
		c := newClientBuckets(1, 2, 1000)
		for range 2 {
			allowed(c, "steady", t0)
		}
		evictions := 0
		for i := range 100_000 {
			at := t0.Add(time.Duration(i) * time.Microsecond) // all within the idle time
			_, kept, evicted := c.reserve(fmt.Sprintf("flood-%d", i), at)
			if kept > 1000 {
				t.Fatalf("%d buckets after %d distinct clients; the bound is 1000", kept, i+1)
			}
			if evicted {
				evictions++
			}
			if i%100 == 0 && allowed(c, "steady", at) {
				t.Fatalf("the steady client got a token at flood request %d: its empty bucket was dropped while in use", i)
			}
		}
		if len(c.byKey) != c.lru.Len() || c.lru.Len() != 1000 {
			t.Errorf("map %d, list %d; want both at the bound 1000", len(c.byKey), c.lru.Len())
		}
		if evictions < 90_000 {
			t.Errorf("%d evictions for 100,000 clients in a table of 1,000", evictions)
		}
	})
}

// A request refused by the global limit does not use up its client's token.
func TestGlobalLimitKeepsTheClientsToken(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(&Config{RateLimit: 1, RateBurst: 2, GlobalRateLimit: 1, GlobalRateBurst: 1, RateLimitClients: 10}, m)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if s, _ := l.allow("a", t0); s != "" {
		t.Fatalf("first request refused by %s", s)
	}
	if s, wait := l.allow("a", t0); s != scopeGlobal || wait <= 0 {
		t.Fatalf("second request: refused by %q after %v, want the global limit", s, wait)
	}
	if got := l.clients.byKey["a"].Value.(*bucket).lim.TokensAt(t0); got < 0.99 {
		t.Errorf("client a has %.2f tokens after a global refusal, want its second token back", got)
	}
}

// countingQueue accepts every entry and counts them.
type countingQueue struct {
	mu      sync.Mutex
	entries int
}

func (q *countingQueue) SendBatch(_ context.Context, entries []Entry) ([]error, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.entries += len(entries)
	return make([]error, len(entries)), nil
}

func (q *countingQueue) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.entries
}

func rateTestServer(t *testing.T, cfg Config) (*httptest.Server, *countingQueue, *prometheus.Registry) {
	t.Helper()
	q := &countingQueue{}
	reg := prometheus.NewRegistry()
	cfg.Queue, cfg.Registerer = q, reg
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return srv, q, reg
}

func send(t *testing.T, method, url, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// A burst beyond the limit: the requests within the burst are accepted and
// enqueued, every one beyond it is a JSON 429 with Retry-After, counted, and
// nothing of theirs reaches the queue. Probes are never limited.
func TestRateLimitedRequestsEnqueueNothing(t *testing.T) {
	// A rate so low that no token comes back while the test runs: exactly
	// the burst is accepted, whatever the machine's speed.
	srv, q, reg := rateTestServer(t, Config{RateLimit: 0.001, RateBurst: 3})
	const job = `{"items":[{"id":"a","text":"x"},{"id":"b","text":"y"}],"options":{"chunk_items":1}}`
	accepted, limited := 0, 0
	for range 10 {
		resp := send(t, "POST", srv.URL+"/v1/jobs", "", job)
		switch resp.StatusCode {
		case http.StatusAccepted:
			accepted++
		case http.StatusTooManyRequests:
			limited++
			var body errorBody
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error == nil || body.Error.Code != CodeRateLimited || body.Error.Message == "" {
				t.Errorf("429 body: %+v, %v; want the API's JSON error with code %s", body, err, CodeRateLimited)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("429 Content-Type %q", ct)
			}
			// 1 token at 0.001/s comes in 1000 s.
			if ra := resp.Header.Get("Retry-After"); ra != "1000" {
				t.Errorf("Retry-After %q, want 1000", ra)
			}
		default:
			t.Errorf("status %d", resp.StatusCode)
		}
	}
	if accepted != 3 || limited != 7 {
		t.Errorf("%d accepted and %d limited, want the burst of 3 and 7", accepted, limited)
	}
	if n := q.count(); n != 2*accepted {
		t.Errorf("%d messages enqueued, want %d: 2 chunks for each accepted job and none for a limited one", n, 2*accepted)
	}
	if n := counterValue(t, reg, "vramq_publisher_rate_limited_total", "scope", scopeClient); n != 7 {
		t.Errorf("rate_limited_total{scope=client} = %v, want 7", n)
	}
	// The status route shares the client's bucket; probes are not limited.
	if resp := send(t, "GET", srv.URL+"/v1/jobs/0123456789abcdef0123456789abcdef", "", ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("GET /v1/jobs/{id} with an empty bucket: %d, want 429", resp.StatusCode)
	}
	for range 5 {
		if resp := send(t, "GET", srv.URL+"/healthz", "", ""); resp.StatusCode != http.StatusOK {
			t.Errorf("GET /healthz: %d; probes must not be limited", resp.StatusCode)
		}
	}
}

// With auth, each key has its own bucket, and requests with a wrong key are
// charged to their source address: guessing keys is limited too.
func TestRateLimitPerKeyAndOnFailedAuth(t *testing.T) {
	srv, q, _ := rateTestServer(t, Config{RateLimit: 0.001, RateBurst: 2, APIKeys: []string{"key-one", "key-two"}})
	const job = `{"items":[{"id":"a","text":"x"}]}`
	codes := func(key string, n int) []int {
		var out []int
		for range n {
			out = append(out, send(t, "POST", srv.URL+"/v1/jobs", key, job).StatusCode)
		}
		return out
	}
	if got := fmt.Sprint(codes("key-one", 3)); got != "[202 202 429]" {
		t.Errorf("key-one: %s, want [202 202 429]", got)
	}
	if got := fmt.Sprint(codes("key-two", 2)); got != "[202 202]" {
		t.Errorf("key-two, same address: %s, want its own burst: [202 202]", got)
	}
	if got := fmt.Sprint(codes("guess", 3)); got != "[401 401 429]" {
		t.Errorf("wrong keys: %s, want [401 401 429]", got)
	}
	if got := fmt.Sprint(codes("", 1)); got != "[429]" {
		t.Errorf("no key after the guesses, same address: %s, want [429]", got)
	}
	if n := q.count(); n != 4 {
		t.Errorf("%d messages enqueued, want 4", n)
	}
}

// counterValue is the value of the counter name{label=value} in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}
