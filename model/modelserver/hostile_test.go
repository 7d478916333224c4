package modelserver

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
)

// Issue 34, item 8: a broken or hostile server must not stop the pipeline.

// One answer whose token limit is below the request it just admitted
// (x-ratelimit-limit-tokens: 1) is not believed: before, every later item
// failed as too_large and no request was sent again (10 of 11 items, one
// request).
func TestContradictoryRateLimitIsNotBelieved(t *testing.T) {
	fault := fakeoai.Fault{Kind: fakeoai.FaultHeader, Times: 1,
		Header: http.Header{"X-Ratelimit-Limit-Tokens": {"1"}, "X-Ratelimit-Remaining-Tokens": {"0"}}}
	inBubble(t, fakeoai.Config{Faults: []fakeoai.Fault{fault}}, Config{MaxConcurrency: 1}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		items := make([]job.Item, 11)
		for i := range items {
			items[i] = chatItem(fmt.Sprint("c", i), "hello", 8)
		}
		outs, err := m.Run(t.Context(), "", items)
		if err != nil {
			t.Fatal(err)
		}
		wantOK(t, outs)
		if got := s.Stats().Requests; got != 11 {
			t.Errorf("%d requests; want 11, one an item", got)
		}
	})
}

// Every wait a server asks for is cut to MaxServerWait (default an hour),
// counted and logged: before, Retry-After: 999999999, a retry-after-ms of
// years or a date in 9999 handed a batch back until decades from now.
func TestServerWaitsAreCapped(t *testing.T) {
	for _, tc := range []struct {
		header, value string
	}{
		{"Retry-After", "999999999"},
		{"Retry-After", "1e400"},
		{"retry-after-ms", "100000000000000"},
		{"Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT"},
	} {
		t.Run(tc.header+"="+tc.value, func(t *testing.T) {
			injected := fakeoai.Fault{Kind: fakeoai.FaultStatus, Status: http.StatusTooManyRequests, Times: 1,
				ErrType: "requests", ErrCode: "rate_limit_exceeded", Header: http.Header{tc.header: {tc.value}}}
			var logs strings.Builder
			var mu sync.Mutex
			log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
			inBubble(t, fakeoai.Config{Faults: []fakeoai.Fault{injected}}, Config{Logger: log}, func(t *testing.T, s *fakeoai.Server, m *Model) {
				start := time.Now()
				_, err := m.Run(t.Context(), "", []job.Item{chatItem("c", "hello", 8)})
				until, ok := fault.BackoffUntil(err)
				if !errors.Is(err, fault.ErrBackoff) || !ok || until.After(start.Add(DefaultMaxServerWait)) || until.Before(start.Add(DefaultMaxServerWait-time.Second)) {
					t.Errorf("Run: %v (until %v from now); want a backoff of the ceiling, %v", err, until.Sub(start), DefaultMaxServerWait)
				}
				if got := testutil.ToFloat64(m.waits.capped.WithLabelValues(tc.header)); got != 1 {
					t.Errorf("capped waits of %s: %v; want 1", tc.header, got)
				}
				mu.Lock()
				defer mu.Unlock()
				if !strings.Contains(logs.String(), "max-server-wait") {
					t.Errorf("logs:\n%s\nwant the capped wait said", logs.String())
				}
			})
		})
	}
}

// A reset of decades in x-ratelimit-reset-tokens would make the mirror
// refill at a token a millennium; cut to the ceiling, the next request
// waits a moment.
func TestRateLimitResetIsCapped(t *testing.T) {
	fault := fakeoai.Fault{Kind: fakeoai.FaultHeader, Times: 1, Header: http.Header{
		"X-Ratelimit-Limit-Tokens": {"1000000"}, "X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"999999999s"}}}
	inBubble(t, fakeoai.Config{Faults: []fakeoai.Fault{fault}}, Config{MaxConcurrency: 1}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		outs, err := m.Run(t.Context(), "", []job.Item{chatItem("a", "hello", 8), chatItem("b", "hello", 8)})
		if err != nil {
			t.Fatalf("Run: %v; want both answered within MaxWait", err)
		}
		wantOK(t, outs)
		if got := testutil.ToFloat64(m.waits.capped.WithLabelValues("x-ratelimit-reset-tokens")); got < 1 {
			t.Errorf("capped resets: %v; want counted", got)
		}
	})
}

// A KV usage of NaN (or ±Inf) in /metrics is no reading: before, it read
// as an empty cache, and admission filled the server.
func TestNonFiniteKVReadingRefused(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		inBubble(t, fakeoai.Config{}, Config{MetricsMaxAge: time.Second}, func(t *testing.T, s *fakeoai.Server, m *Model) {
			if !m.dev.live {
				t.Fatal("the fake's metrics are not followed")
			}
			s.SetKVUsage(&v)
			time.Sleep(2 * time.Second) // past MetricsMaxAge: the next MemInfo reads /metrics
			mem, err := m.dev.Read()
			if err == nil || !strings.Contains(err.Error(), "kv_cache_usage_perc") {
				t.Errorf("usage %v: MemInfo %+v, %v; want the reading refused", v, mem, err)
			}
		})
	}
}

// A server's error type and code of megabytes are cut before they reach an
// error (which /healthz shows), a log line or an item error.
func TestServerStringsBounded(t *testing.T) {
	huge := strings.Repeat("x", 4<<20)
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	faults := []fakeoai.Fault{
		{Kind: fakeoai.FaultStatus, Status: http.StatusUnauthorized, ErrType: huge, ErrCode: huge, Message: huge, Paths: []string{"/v1/chat/completions"}},
		{Kind: fakeoai.FaultStatus, Status: http.StatusBadRequest, ErrType: huge, ErrCode: huge, Message: huge, Paths: []string{"/v1/completions"}},
	}
	inBubble(t, fakeoai.Config{Faults: faults}, Config{Logger: log}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		outs, err := m.Run(t.Context(), "", []job.Item{completionItem("p", "hello", 8)})
		if err != nil {
			t.Fatal(err)
		}
		if e := outs[0].Error; e == nil || e.Code != job.ItemRequestRefused || len(e.Message) > job.MaxItemErrorLen {
			t.Errorf("item error %.200v; want request_refused within %d bytes", e, job.MaxItemErrorLen)
		}
		_, err = m.Run(t.Context(), "", []job.Item{chatItem("c", "hello", 8)})
		if !errors.Is(err, fault.ErrNeedsOperator) || len(err.Error()) > 1024 {
			t.Errorf("Run: an error of %d bytes (%.200v…); want ErrNeedsOperator within 1 KiB", len(err.Error()), err)
		}
		mu.Lock()
		defer mu.Unlock()
		if n := logs.Len(); n > 16<<10 {
			t.Errorf("%d bytes of logs; want the server's strings cut", n)
		}
	})
}

// A run keeps at most Config.ResultBytes of answers: the items past it fail
// (too_large) rather than take the result past what may be stored.
func TestRunAnswersBoundedByResultLimit(t *testing.T) {
	const limit = 4 << 10
	inBubble(t, fakeoai.Config{}, Config{ResultBytes: limit, MaxConcurrency: 1}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		items := make([]job.Item, 40)
		for i := range items {
			items[i] = chatItem(fmt.Sprint("c", i), "hello", 8)
		}
		outs, err := m.Run(t.Context(), "", items)
		if err != nil {
			t.Fatal(err)
		}
		kept, ok, over := 0, 0, 0
		for _, o := range outs {
			switch {
			case o.Response != nil && o.Error == nil:
				kept += len(o.Response.Body)
				ok++
			case o.Error != nil && o.Error.Code == job.ItemTooLarge && o.Response == nil:
				over++
			default:
				t.Errorf("output %+v; want an answer or too_large", o)
			}
		}
		if kept > limit || ok == 0 || over == 0 || ok+over != len(items) {
			t.Errorf("%d bytes kept of %d answered, %d too_large; want at most %d bytes, the rest too_large", kept, ok, over, limit)
		}
	})
}

// A limit learned from a refusal's headers that is below a request does not
// fail it as too_large: the server judges it, and its answer sets the
// mirror again. Before, one 429 with x-ratelimit-limit-tokens: 1 failed
// every later item without a request.
func TestLearnedLimitBelowARequestIsAskedAgain(t *testing.T) {
	fault := fakeoai.Fault{Kind: fakeoai.FaultStatus, Status: http.StatusTooManyRequests, Times: 1,
		ErrType: "tokens", ErrCode: "rate_limit_exceeded",
		Header: http.Header{"X-Ratelimit-Limit-Tokens": {"1"}, "X-Ratelimit-Remaining-Tokens": {"0"}, "Retry-After": {"1"}}}
	inBubble(t, fakeoai.Config{Faults: []fakeoai.Fault{fault}}, Config{MaxConcurrency: 1}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		items := make([]job.Item, 5)
		for i := range items {
			items[i] = chatItem(fmt.Sprint("c", i), "hello", 8)
		}
		outs, err := m.Run(t.Context(), "", items)
		if err != nil {
			t.Fatal(err)
		}
		wantOK(t, outs)
		if got := s.Stats().Requests; got != 6 {
			t.Errorf("%d requests; want 6: the 429, then one an item", got)
		}
	})
}

// A transport's error that quotes megabytes of the server's (a malformed
// status line) is cut; a short one is kept as it is, for errors.Is.
func TestClipErr(t *testing.T) {
	long := errors.New(strings.Repeat("é", 2<<20))
	if got := clipErr(long).Error(); len(got) > maxServerMessage+len("…") {
		t.Errorf("clipErr: %d bytes; want at most %d", len(got), maxServerMessage)
	}
	short := fmt.Errorf("dial: %w", errors.ErrUnsupported)
	if got := clipErr(short); !errors.Is(got, errors.ErrUnsupported) {
		t.Errorf("clipErr(%v) = %v; want it unchanged", short, got)
	}
	if got := clip("a\xffb", 10); got != "a\uFFFDb" {
		t.Errorf("clip: %q; want valid UTF-8", got)
	}
}
