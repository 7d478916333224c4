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
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/jobs"
)

// The finding of issue 25: one site, given a /56, sent a request from each
// of its 256 /64s at once against a limit of burst 1, and all 256 were
// taken. Keyed by its /56 it is one client, and gets its burst; another
// site is not refused for it.
func TestOneSiteIsOneClient(t *testing.T) {
	// A rate so low that no token comes back while the test runs.
	p, err := New(Config{
		Queue: &countingQueue{},
		API: API{
			RateLimit:  0.001,
			RateBurst:  1,
			Logger:     slog.New(slog.DiscardHandler),
			Registerer: prometheus.NewRegistry(),
		},
	})
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
	p, err := New(Config{
		Queue: &countingQueue{},
		API: API{
			RateLimit:       100,
			GlobalRateLimit: 0.001,
			GlobalRateBurst: 5,
			Logger:          slog.New(slog.DiscardHandler),
			Registerer:      reg,
		},
	})
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
	want := slices.Concat(slices.Repeat([]string{"202"}, 5), slices.Repeat([]string{"429 " + api.CodeRateLimited}, 15))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("20 clients, one request each, global burst 5 (-want +got):\n%s", diff)
	}
	if n := counterValue(t, reg, "vramq_publisher_rate_limited_total", "scope", "global"); n != 15 {
		t.Errorf("rate_limited_total{scope=global} = %v, want 15", n)
	}
}

// countingQueue accepts every entry and counts them.
type countingQueue struct {
	mu      sync.Mutex
	entries int
}

func (q *countingQueue) SendBatch(_ context.Context, entries []jobs.Entry) ([]error, error) {
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
	srv, q, reg := rateTestServer(t, Config{API: API{RateLimit: 0.001, RateBurst: 3}})
	const job = `{"items":[{"id":"a","text":"x"},{"id":"b","text":"y"}],"options":{"chunk_items":1}}`
	accepted, limited := 0, 0
	for range 10 {
		resp := send(t, "POST", srv.URL+"/v1/jobs", "", job)
		switch resp.StatusCode {
		case http.StatusAccepted:
			accepted++
		case http.StatusTooManyRequests:
			limited++
			var body api.ErrorBody
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error == nil || body.Error.Code != api.CodeRateLimited || body.Error.Message == "" {
				t.Errorf("429 body: %+v, %v; want the API's JSON error with code %s", body, err, api.CodeRateLimited)
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
	if n := counterValue(t, reg, "vramq_publisher_rate_limited_total", "scope", "client"); n != 7 {
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
	srv, q, _ := rateTestServer(t, Config{API: API{RateLimit: 0.001, RateBurst: 2, APIKeys: []string{"key-one", "key-two"}}})
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

// IPv6ClientPrefix is a prefix length a site could be given (32 to 128 bits);
// any other is refused, naming the field.
func TestIPv6ClientPrefixIsChecked(t *testing.T) {
	for _, bad := range []int{-1, 16, 31, 129} {
		_, err := New(Config{Queue: &countingQueue{}, API: API{IPv6ClientPrefix: bad, Registerer: prometheus.NewRegistry()}})
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "IPv6ClientPrefix" {
			t.Errorf("IPv6ClientPrefix %d: %v, want it refused", bad, err)
		}
	}
}
