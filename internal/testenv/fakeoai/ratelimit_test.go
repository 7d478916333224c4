package fakeoai_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// start serves a double with cfg until the test ends.
func start(t *testing.T, cfg fakeoai.Config) *fakeoai.Server {
	t.Helper()
	s := fakeoai.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// post sends body to path and reads the whole answer.
func post(t *testing.T, s *fakeoai.Server, path, body string) (*http.Response, string) {
	t.Helper()
	return postCtx(t, context.Background(), s, path, body)
}

func postCtx(t *testing.T, ctx context.Context, s *fakeoai.Server, path, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := s.Client().Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", path, err)
		return nil, ""
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("POST %s: reading the body: %v", path, err)
	}
	return res, string(b)
}

// completionBody is a /v1/completions request of prompt with max_tokens.
func completionBody(prompt string, maxTokens int) string {
	return fmt.Sprintf(`{"model":"fake-model","prompt":%q,"max_tokens":%d}`, prompt, maxTokens)
}

func wantHeaders(t *testing.T, res *http.Response, want map[string]string) {
	t.Helper()
	if res == nil {
		return
	}
	for k, v := range want {
		if got := res.Header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
}

// The buckets refill continuously: one request of 6 RPM comes back in 10s,
// which is what x-ratelimit-reset-requests says, and what a 429 says to wait.
func TestRequestsPerMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{RPM: 6, TPM: 1000}})
		defer s.Close()
		body := completionBody("one two", 3) // costs 2 + 3 tokens

		res, _ := post(t, s, "/v1/completions", body)
		wantHeaders(t, res, map[string]string{
			"x-ratelimit-limit-requests": "6", "x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "10s",
			"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "995", "x-ratelimit-reset-tokens": "300ms",
		})
		for range 5 {
			post(t, s, "/v1/completions", body)
		}
		res, got := post(t, s, "/v1/completions", body)
		if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(got, `"type":"requests"`) || !strings.Contains(got, `"code":"rate_limit_exceeded"`) {
			t.Fatalf("7th request: %d %s", res.StatusCode, got)
		}
		wantHeaders(t, res, map[string]string{"Retry-After": "10", "retry-after-ms": "10000",
			"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m0s"})

		time.Sleep(10 * time.Second)
		if res, got := post(t, s, "/v1/completions", body); res.StatusCode != http.StatusOK {
			t.Errorf("after the wait it said: %d %s", res.StatusCode, got)
		}
		st := s.Stats()
		if st.Admitted != 7 || st.AdmittedTokens != 35 || st.RateLimited != 1 || st.ByStatus[200] != 7 || st.ByStatus[429] != 1 {
			t.Errorf("stats: admitted %d (%d tokens), rate limited %d, by status %v", st.Admitted, st.AdmittedTokens, st.RateLimited, st.ByStatus)
		}
		if m := st.Minutes[0]; m.Requests != 7 || m.Tokens != 35 || m.RateLimited != 1 || m.Answers != 8 || m.PromptTokens != 14 || m.CompletionTokens != 21 {
			t.Errorf("ledger: %+v", m)
		}
	})
}

// max_tokens × n counts against TPM up front; a 429 on tokens still takes a
// request from RPM ("unsuccessful requests contribute to your per-minute
// limit"), unless FreeRejections.
func TestTokensPerMinute(t *testing.T) {
	for _, free := range []bool{false, true} {
		t.Run(fmt.Sprint("free rejections ", free), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{RPM: 600, TPM: 60, FreeRejections: free}})
				defer s.Close()
				body := `{"model":"fake-model","prompt":"a b c d","max_tokens":8,"n":5}` // 4 + 8 × 5 = 44
				if res, got := post(t, s, "/v1/completions", body); res.StatusCode != http.StatusOK {
					t.Fatalf("first: %d %s", res.StatusCode, got)
				}
				res, got := post(t, s, "/v1/completions", body)
				if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(got, `"type":"tokens"`) ||
					!strings.Contains(got, "Limit 60, Used 44, Requested 44") {
					t.Fatalf("second: %d %s", res.StatusCode, got)
				}
				// 28 more tokens at 1 per second.
				wantHeaders(t, res, map[string]string{"retry-after-ms": "28000", "Retry-After": "28", "x-ratelimit-remaining-tokens": "16"})
				wantRemaining := "598"
				if free {
					wantRemaining = "599"
				}
				wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-requests": wantRemaining})
			})
		})
	}
}

// A request larger than the bucket can ever hold is refused with no hint to
// come back.
func TestRequestTooLarge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{TPM: 100}})
		defer s.Close()
		res, got := post(t, s, "/v1/completions", completionBody("x", 200))
		if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(got, "Request too large") || res.Header.Get("Retry-After") != "" {
			t.Errorf("%d %s, Retry-After %q", res.StatusCode, got, res.Header.Get("Retry-After"))
		}
		if st := s.Stats(); st.TooLarge != 1 || st.RateLimited != 0 {
			t.Errorf("too large %d, rate limited %d", st.TooLarge, st.RateLimited)
		}
	})
}

// Burst enforces a limit over a shorter period: 60 RPM over 1s is one
// request a second.
func TestBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{RPM: 60, Burst: time.Second}})
		defer s.Close()
		post(t, s, "/v1/completions", completionBody("x", 1))
		res, _ := post(t, s, "/v1/completions", completionBody("x", 1))
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("second request at once: %d", res.StatusCode)
		}
		wantHeaders(t, res, map[string]string{"retry-after-ms": "1000", "x-ratelimit-reset-requests": "1s"})
	})
}

// At Speed 60 a server minute is a real second: the limits are per server
// minute, the durations sent are real ones, and the ledger counts server
// minutes.
func TestSpeed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Speed: 60, Limits: fakeoai.RateLimits{RPM: 6}})
		defer s.Close()
		start := s.Now()
		for range 6 {
			post(t, s, "/v1/completions", completionBody("x", 1))
		}
		res, _ := post(t, s, "/v1/completions", completionBody("x", 1))
		// 10 server seconds are 166.67 real milliseconds.
		wantHeaders(t, res, map[string]string{"retry-after-ms": "167", "Retry-After": "1", "x-ratelimit-reset-requests": "1s"})
		time.Sleep(167 * time.Millisecond)
		if res, _ := post(t, s, "/v1/completions", completionBody("x", 1)); res.StatusCode != http.StatusOK {
			t.Errorf("after the wait: %d", res.StatusCode)
		}
		time.Sleep(time.Second)
		for range 6 {
			post(t, s, "/v1/completions", completionBody("x", 1))
		}
		st := s.Stats()
		if len(st.Minutes) != 2 || st.Minutes[0].Requests != 7 || st.Minutes[0].RateLimited != 1 || st.Minutes[1].Requests != 6 {
			t.Errorf("ledger over %v of server time: %+v", s.Now().Sub(start), st.Minutes)
		}
		if got := st.Minutes[1].Start.Sub(st.Minutes[0].Start); got != time.Minute {
			t.Errorf("minutes %v apart", got)
		}
	})
}

// SetRateLimits lowers a limit while running; what was used stays used.
func TestSetRateLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{RPM: 100}})
		defer s.Close()
		for range 5 {
			post(t, s, "/v1/completions", completionBody("x", 1))
		}
		if err := s.SetRateLimits(fakeoai.RateLimits{RPM: 6}); err != nil {
			t.Fatal(err)
		}
		res, _ := post(t, s, "/v1/completions", completionBody("x", 1))
		wantHeaders(t, res, map[string]string{"x-ratelimit-limit-requests": "6", "x-ratelimit-remaining-requests": "0"})
		if res, _ := post(t, s, "/v1/completions", completionBody("x", 1)); res.StatusCode != http.StatusTooManyRequests {
			t.Errorf("past the lowered limit: %d", res.StatusCode)
		}
	})
}
