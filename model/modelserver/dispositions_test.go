package modelserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
)

// One case per row of the disposition table, each against the fake server
// giving that row's answer: what Run returns, what the server saw, and
// which row took the answer.
type dispositionCase struct {
	row   string
	fake  fakeoai.Config
	cfg   Config
	items []job.Item
	// check looks at Run's outputs and error, the server and the model.
	check func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error)
}

func status(code int, times int, paths ...string) fakeoai.Fault {
	return fakeoai.Fault{Kind: fakeoai.FaultStatus, Status: code, Times: times, Paths: paths}
}

// wantRetriedThenOK: the first answer took the row, a retry went through.
func wantRetriedThenOK(requests int64) func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
	return func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("Run: %v; want the retry to succeed", err)
		}
		wantOK(t, outs)
		if got := s.Stats().Requests; got != requests {
			t.Errorf("%d requests; want %d", got, requests)
		}
	}
}

// wantHalvedThenOK: an overload answer, a wait, fewer requests in flight,
// and the retry went through.
func wantHalvedThenOK(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
	t.Helper()
	wantRetriedThenOK(2)(t, s, m, outs, err)
	if got := m.conc.now(); got != 4 {
		t.Errorf("concurrency %d after an overload answer; want 4, halved from 8", got)
	}
}

// wantTimedOut: every try timed out, and the item's output is the error
// request_timeout, with no error for the run.
func wantTimedOut(requests int64) func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
	return func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("Run: %v; want the item's error, not the run's", err)
		}
		for _, o := range outs {
			if o.Error == nil || o.Error.Code != job.ItemRequestTimeout || o.Response != nil {
				t.Errorf("output %+v; want the error request_timeout", o)
			}
		}
		if got := s.Stats().Requests; got != requests {
			t.Errorf("%d requests; want %d", got, requests)
		}
	}
}

func wantOperator(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
	t.Helper()
	if !errors.Is(err, fault.ErrNeedsOperator) || outs != nil {
		t.Fatalf("Run: %v, %d outputs; want an ErrNeedsOperator error", err, len(outs))
	}
	if got := s.Stats().Requests; got != 1 {
		t.Errorf("%d requests; want 1, never retried", got)
	}
	// Until someone acts, the backend does not ask the server again.
	if _, err := m.Run(context.Background(), "", []job.Item{chatItem("again", "x", 2)}); !errors.Is(err, fault.ErrNeedsOperator) {
		t.Errorf("the next Run: %v; want ErrNeedsOperator at once", err)
	}
	if got := s.Stats().Requests; got != 1 {
		t.Errorf("%d requests after a second Run; want still 1", got)
	}
}

// wantRefused: the item's own error, with the server's answer, never retried.
func wantRefused(code int) func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
	return func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("Run: %v; want the item's error in its output", err)
		}
		o := outs[0]
		if o.Error == nil || o.Error.Code != job.ItemRequestRefused || o.Response == nil || o.Response.StatusCode != code ||
			!json.Valid(o.Response.Body) || !strings.Contains(o.Error.Message, fmt.Sprint(code)) {
			t.Errorf("output %+v (response %+v); want request_refused with the %d answer", o, o.Response, code)
		}
		if got := s.Stats().Requests; got != 1 {
			t.Errorf("%d requests; want 1, never retried", got)
		}
	}
}

func dispositionCases() []dispositionCase {
	chat := []job.Item{chatItem("c", "hello", 4)}
	return []dispositionCase{
		{row: "no_answer", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultDrop, Times: 1}}},
			items: chat, check: wantRetriedThenOK(2)},
		{row: "no_answer", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultDrop}}}, cfg: Config{MaxRetries: 2},
			items: chat, check: func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
				// Past its retries, a plain error: the subscriber releases
				// the message for later.
				if !errors.Is(err, errTransient) || errors.Is(err, fault.ErrBackoff) || errors.Is(err, fault.ErrNeedsOperator) ||
					errors.Is(err, gpu.ErrOutOfMemory) || errors.Is(err, fault.ErrInvalidInput) {
					t.Errorf("Run: %v; want a transient error, none of the sentinels", err)
				}
				if got := s.Stats().Requests; got != 3 {
					t.Errorf("%d requests; want 3 (2 retries)", got)
				}
			}},
		{row: "timeout", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultSlowBody, Delay: time.Hour, Times: 1}}},
			cfg: Config{RequestTimeout: time.Minute, MaxWait: 5 * time.Minute}, items: chat, check: wantRetriedThenOK(2)},
		// A request that times out on every try is its item's error,
		// request_timeout, and no other item's: the batch goes on.
		{row: "timeout", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultSlowBody, Delay: time.Hour}}},
			cfg: Config{RequestTimeout: time.Minute, MaxWait: time.Hour, MaxRetries: 1}, items: chat, check: wantTimedOut(2)},
		{row: "ok", items: chat, check: wantRetriedThenOK(1)},
		{row: "ok_not_endpoint_json", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultNotJSON}}},
			items: chat, check: wantRefused(200)},
		{row: "insufficient_quota", items: chat, check: wantOperator},
		{row: "unauthorized", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(401, 0)}}, items: chat, check: wantOperator},
		{row: "unauthorized", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(403, 0)}}, items: chat, check: wantOperator},
		{row: "not_found", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(404, 0)}}, items: chat, check: wantOperator},
		{row: "out_of_memory", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultStatus, Status: 500, Times: 1,
			Message: "CUDA out of memory. Tried to allocate 2.00 GiB"}}}, cfg: Config{EmbedBatch: 8}, items: embedItems(4),
			check: func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
				// The request of 4 is sent again in halves.
				wantRetriedThenOK(3)(t, s, m, outs, err)
			}},
		{row: "out_of_memory", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultStatus, Status: 500,
			Message: "CUDA out of memory"}}}, items: embedItems(1),
			check: func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
				if !errors.Is(err, gpu.ErrOutOfMemory) {
					t.Errorf("Run: %v; want ErrOutOfMemory for one item the server cannot hold", err)
				}
			}},
		{row: "out_of_memory", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultStatus, Status: 424, Times: 1,
			Message: "Request failed during generation: CUDA out of memory"}}}, cfg: Config{MaxConcurrency: 8}, items: chat,
			check: func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
				wantRetriedThenOK(2)(t, s, m, outs, err)
				if got := m.conc.now(); got != 4 {
					t.Errorf("concurrency %d after a generation ran out of memory; want 4, halved", got)
				}
			}},
		{row: "payload_too_large", fake: fakeoai.Config{MaxClientBatch: 2}, cfg: Config{EmbedBatch: 8}, items: embedItems(4),
			check: func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
				wantRetriedThenOK(3)(t, s, m, outs, err)
				if got := m.embedCap.Load(); got != 2 {
					t.Errorf("inputs per request %d after a 413 for 4; want 2", got)
				}
			}},
		{row: "payload_too_large", fake: fakeoai.Config{PayloadLimit: 100},
			items: []job.Item{embedItem("big", strings.Repeat("long ", 40))}, check: wantRefused(413)},
		{row: "too_large_for_rate_limit", fake: fakeoai.Config{Limits: fakeoai.RateLimits{TPM: 50}},
			items: []job.Item{chatItem("c", "hello", 100)}, check: wantRefused(429)},
		{row: "overloaded_429", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(429, 1)}}, cfg: Config{MaxConcurrency: 8},
			items: chat, check: wantHalvedThenOK},
		{row: "rate_limited", items: chat}, // rateLimitedCase: two models on one limit
		{row: "overloaded", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(503, 1)}}, cfg: Config{MaxConcurrency: 8}, items: chat,
			check: wantHalvedThenOK},
		{row: "overloaded", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(529, 1)}}, cfg: Config{MaxConcurrency: 8}, items: chat,
			check: wantHalvedThenOK},
		{row: "overloaded", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultStatus, Status: 503, RetryAfter: 2 * time.Hour}}},
			cfg: Config{MaxServerWait: 3 * time.Hour}, items: chat, check: func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
				// A wait past MaxWait (within MaxServerWait): Run returns
				// with when to come back.
				until, ok := fault.BackoffUntil(err)
				if !errors.Is(err, fault.ErrBackoff) || !ok || until.Before(time.Now().Add(119*time.Minute)) {
					t.Errorf("Run: %v (until %v); want ErrBackoff until two hours from now", err, until)
				}
			}},
		{row: "retryable_4xx", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(409, 1)}}, items: chat, check: wantRetriedThenOK(2)},
		{row: "server_timeout", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(408, 1)}}, items: chat, check: wantRetriedThenOK(2)},
		{row: "server_timeout", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(504, 0)}}, cfg: Config{MaxRetries: 1}, items: chat,
			check: wantTimedOut(2)},
		{row: "refused", items: []job.Item{chatItem("long", strings.Repeat("w ", 8000), 1000)}, check: wantRefused(422)},
		{row: "refused", fake: fakeoai.Config{ContextLengthStatus: 400},
			items: []job.Item{chatItem("long", strings.Repeat("w ", 8000), 1000)}, check: wantRefused(400)},
		{row: "refused", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(400, 0)}}, cfg: Config{EmbedBatch: 8}, items: embedItems(3),
			check: func(t *testing.T, s *fakeoai.Server, m *Model, outs []job.Output, err error) {
				// Refused together, items are sent in halves to find whose
				// it is; alone, each is refused once.
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range outs {
					if o.Error == nil || o.Error.Code != job.ItemRequestRefused {
						t.Errorf("output %+v; want request_refused", o)
					}
				}
				if got := s.Stats().Requests; got != 5 {
					t.Errorf("%d requests; want 5 (3, then 1 and 2, then 1 and 1)", got)
				}
			}},
		{row: "server_error", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(500, 1)}}, items: chat, check: wantRetriedThenOK(2)},
		{row: "server_error", fake: fakeoai.Config{Faults: []fakeoai.Fault{status(424, 1)}}, items: chat, check: wantRetriedThenOK(2)},
		{row: "server_error", fake: fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultNotJSON, Status: 502, Times: 1}}},
			items: chat, check: wantRetriedThenOK(2)},
	}
}

func TestDispositions(t *testing.T) {
	covered := map[string]bool{}
	for i, tc := range dispositionCases() {
		covered[tc.row] = true
		if tc.check == nil {
			continue // a test of its own below
		}
		t.Run(fmt.Sprintf("%s/%d", tc.row, i), func(t *testing.T) {
			inBubble(t, tc.fake, tc.cfg, func(t *testing.T, s *fakeoai.Server, m *Model) {
				if tc.row == "insufficient_quota" {
					s.SetQuotaExhausted(true)
				}
				outs, err := m.Run(t.Context(), "", tc.items)
				tc.check(t, s, m, outs, err)
				wantNothingHeld(t, m)
				if got := m.answered(tc.row); got == 0 {
					t.Errorf("no answer took row %s; rows: %v", tc.row, m.answers)
				}
			})
		})
	}
	covered["unexpected"] = true // TestUnexpectedStatus
	for _, d := range dispositions {
		if !covered[d.name] {
			t.Errorf("row %s has no case", d.name)
		}
	}
}

// wantNothingHeld checks that every request's turn was given back, on
// whichever path its try ended: no concurrency slot taken, no probe in
// flight at the gate, no KV charge counted in flight.
func wantNothingHeld(t *testing.T, m *Model) {
	t.Helper()
	m.conc.mu.Lock()
	inflight := m.conc.inflight
	m.conc.mu.Unlock()
	m.gate.mu.Lock()
	probing := m.gate.probing
	m.gate.mu.Unlock()
	if inflight != 0 || probing || m.held.Load() != 0 {
		t.Errorf("after Run: %d concurrency slots taken, probe in flight %v, %d KV tokens held; want none", inflight, probing, m.held.Load())
	}
}

// rate_limited: a subscriber that has not seen the limit's headers yet is
// answered 429 rate_limit_exceeded with a retry hint; it waits as long as
// it says and goes through, or, when that is past MaxWait, Run returns
// ErrBackoff with the time to come back.
func TestDispositionRateLimited(t *testing.T) {
	for _, maxWait := range []time.Duration{2 * time.Minute, 10 * time.Second} {
		t.Run(maxWait.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{RPM: 1}})
				defer s.Close()
				first := openOn(t, s, Config{})
				if _, err := first.Run(t.Context(), "", []job.Item{chatItem("a", "x", 2)}); err != nil {
					t.Fatal(err)
				}
				m := openOn(t, s, Config{MaxWait: maxWait})
				start := time.Now()
				outs, err := m.Run(t.Context(), "", []job.Item{chatItem("b", "y", 2)})
				if m.answered("rate_limited") != 1 {
					t.Errorf("rows %v; want one rate_limited", m.answers)
				}
				if maxWait > time.Minute {
					wantRetriedThenOK(3)(t, s, m, outs, err) // the other model's, then this one's, refused, and again
					if waited := time.Since(start); waited < 59*time.Second {
						t.Errorf("went through after %v; the server asked for a minute", waited)
					}
					if m.rates.marginK <= marginMin {
						t.Errorf("margin %v after a 429 of the limiter; want it widened", m.rates.marginK)
					}
					return
				}
				until, ok := fault.BackoffUntil(err)
				if !ok || until.Before(start.Add(59*time.Second)) || until.After(start.Add(61*time.Second)) {
					t.Errorf("Run: %v (until %v after start); want ErrBackoff a minute from now", err, until.Sub(start))
				}
				if time.Since(start) > time.Second {
					t.Errorf("Run waited %v before giving up", time.Since(start))
				}
			})
		})
	}
}

// unexpected: a status no model server answers (a redirect) is the item's
// error. The fake answers none, so a handler in front of it does.
func TestUnexpectedStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{})
		defer s.Close()
		redirect := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				http.Redirect(w, r, "/elsewhere", http.StatusFound)
				return
			}
			s.ServeHTTP(w, r)
		})
		client := &http.Client{Transport: handlerTransport{redirect},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		m, err := Open(t.Context(), Config{BaseURL: s.URL(), HTTPClient: client, Models: []string{"fake-model"}, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		outs, err := m.Run(t.Context(), "", []job.Item{chatItem("c", "x", 2)})
		if err != nil || outs[0].Error == nil || outs[0].Error.Code != job.ItemRequestRefused || outs[0].Response.StatusCode != 302 {
			t.Errorf("Run: %+v, %v; want request_refused with the 302", outs, err)
		}
		if m.answered("unexpected") != 1 {
			t.Errorf("rows %v; want one unexpected", m.answers)
		}
	})
}

// A request whose context ends in flight, never answered, gives back its
// turn too (the probe's passes on), as one that waited for its turn and
// was given up while the gate was closed.
func TestUnansweredTryGivesBackItsTurn(t *testing.T) {
	inBubble(t, fakeoai.Config{TokenLatency: time.Second}, Config{}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
		defer cancel()
		items := []job.Item{chatItem("a", "x", 8), chatItem("b", "y", 8), chatItem("c", "z", 8)}
		if _, err := m.Run(ctx, "", items); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run under a context that ends in flight: %v; want its deadline", err)
		}
		wantNothingHeld(t, m)
		if m.answered("ok") != 0 {
			t.Fatalf("rows %v; want no answer read", m.answers)
		}
	})
}
