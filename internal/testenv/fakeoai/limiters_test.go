package fakeoai_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// Each kind after its whole token limit is taken at once: the bucket has
// half of it back after 30 s, the sliding window none until the charge is
// 60 s old, the fixed window none until the minute turns (here also at
// 60 s: synctest's clock starts on a minute). What the headers say
// matches.
func TestKindsRefill(t *testing.T) {
	for _, tc := range []struct {
		kind                   fakeoai.LimitKind
		at30, at59, at60       string // x-ratelimit-remaining-tokens, before the request
		reset0, resetAt30      string // x-ratelimit-reset-tokens
		retryAt30, retryMsAt30 string
	}{
		{kind: fakeoai.LimitBucket, at30: "50", at59: "98", at60: "100", reset0: "1m0s", resetAt30: "30s", retryAt30: "", retryMsAt30: ""},
		{kind: fakeoai.LimitSlidingWindow, at30: "0", at59: "0", at60: "100", reset0: "1m0s", resetAt30: "30s", retryAt30: "30", retryMsAt30: "30000"},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{Kind: tc.kind, TPM: 100}})
				defer s.Close()
				res, _ := post(t, s, "/v1/completions", completionBody("a b c d", 96)) // 100 tokens
				wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": tc.reset0})
				time.Sleep(30 * time.Second)
				// 60 tokens: the bucket has 50, the window none.
				res, _ = post(t, s, "/v1/completions", completionBody("a b c d", 56))
				if res.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("60 tokens at 30 s: %d", res.StatusCode)
				}
				wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-tokens": tc.at30, "x-ratelimit-reset-tokens": tc.resetAt30})
				if tc.retryMsAt30 != "" {
					wantHeaders(t, res, map[string]string{"Retry-After": tc.retryAt30, "retry-after-ms": tc.retryMsAt30})
				}
				time.Sleep(29 * time.Second)
				res, _ = post(t, s, "/v1/completions", completionBody("a b c d", 196)) // too large: headers only
				wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-tokens": tc.at59})
				time.Sleep(time.Second)
				res, _ = post(t, s, "/v1/completions", completionBody("a b c d", 196))
				wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-tokens": tc.at60})
			})
		})
	}
}

// A sliding window frees use in lumps, as the charges that took it turn
// 60 s old: 60 tokens at 0 s and 40 at 20 s fill a limit of 100; at 30 s a
// 10-token request waits for the first lump (60 s), and a 70-token one for
// the second (80 s). The reset is until the window is empty.
func TestSlidingWindowLumps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{Kind: fakeoai.LimitSlidingWindow, TPM: 100, RPM: 10}})
		defer s.Close()
		post(t, s, "/v1/completions", completionBody("a b c d", 56))
		time.Sleep(20 * time.Second)
		res, _ := post(t, s, "/v1/completions", completionBody("a b c d", 36))
		wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1m0s",
			"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "8", "x-ratelimit-reset-requests": "1m0s"})
		time.Sleep(10 * time.Second)
		res, got := post(t, s, "/v1/completions", completionBody("a b c d", 6))
		if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(got, `"type":"tokens"`) || !strings.Contains(got, "Please try again in 30s") {
			t.Fatalf("10 tokens at 30 s: %d %s", res.StatusCode, got)
		}
		wantHeaders(t, res, map[string]string{"retry-after-ms": "30000", "Retry-After": "30", "x-ratelimit-reset-tokens": "50s"})
		res, _ = post(t, s, "/v1/completions", completionBody("a b c d", 66))
		wantHeaders(t, res, map[string]string{"retry-after-ms": "50000"})
		time.Sleep(29 * time.Second)
		if res, _ := post(t, s, "/v1/completions", completionBody("a b c d", 6)); res.StatusCode != http.StatusTooManyRequests {
			t.Errorf("10 tokens at 59 s: %d, want 429: nothing frees before the first charge is 60 s old", res.StatusCode)
		}
		time.Sleep(time.Second)
		res, _ = post(t, s, "/v1/completions", completionBody("a b c d", 6))
		if res.StatusCode != http.StatusOK {
			t.Errorf("10 tokens at 60 s: %d", res.StatusCode)
		}
		wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-tokens": "50"})
	})
}

// LiteLLM's fixed window: requests counted at arrival, tokens from usage
// when answered, a request admitted while the minute's count is below the
// limit (so the count may pass it), and all of it whole again at the
// minute; retry-after is the seconds to it.
func TestFixedWindowResetsAtTheMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{Kind: fakeoai.LimitFixedWindow, TPM: 100, RPM: 3}})
		defer s.Close()
		if now := s.Now(); now.Truncate(time.Minute) != now {
			t.Fatalf("synctest's clock starts at %v, not on a minute", now)
		}
		time.Sleep(50 * time.Second)
		body := completionBody("[[len=80]] x", 200) // 2 prompt + 80 completion tokens; max_tokens is not charged
		res, _ := post(t, s, "/v1/completions", body)
		wantHeaders(t, res, map[string]string{"x-ratelimit-limit-tokens": "100", "x-ratelimit-remaining-tokens": "18", "x-ratelimit-reset-tokens": "10s",
			"x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "2", "x-ratelimit-reset-requests": "10s"})
		if res, got := post(t, s, "/v1/completions", body); res.StatusCode != http.StatusOK {
			t.Fatalf("second at 82 of 100 tokens: %d %s", res.StatusCode, got)
		}
		res, got := post(t, s, "/v1/completions", body)
		if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(got, "current tpm: 164, tpm limit: 100") || !strings.Contains(got, `"code":"429"`) {
			t.Fatalf("third at 164 of 100 tokens: %d %s", res.StatusCode, got)
		}
		wantHeaders(t, res, map[string]string{"retry-after": "10", "retry-after-ms": "", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-remaining-requests": "0"})
		time.Sleep(9*time.Second + 500*time.Millisecond)
		res, _ = post(t, s, "/v1/completions", body)
		wantHeaders(t, res, map[string]string{"retry-after": "0.5"})
		time.Sleep(500 * time.Millisecond)
		res, _ = post(t, s, "/v1/completions", body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("at the minute: %d", res.StatusCode)
		}
		wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-tokens": "18", "x-ratelimit-remaining-requests": "2", "x-ratelimit-reset-tokens": "1m0s"})
	})
}

// Azure evaluates requests over short windows: at 600 RPM and 1 s windows,
// the 11th request in a second is refused, its headers saying none is left
// in the window; the next second admits again. Tokens are
// an estimate at arrival counting best_of, against a minute's count.
func TestAzurePerSecondCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{Kind: fakeoai.LimitAzure, RPM: 600, TPM: 100_000}})
		defer s.Close()
		for i := range 10 {
			if res, got := post(t, s, "/v1/chat/completions", chatBody("hi", 5)); res.StatusCode != http.StatusOK {
				t.Fatalf("request %d in the first second: %d %s", i, res.StatusCode, got)
			}
		}
		res, got := post(t, s, "/v1/chat/completions", chatBody("hi", 5))
		if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(got, "ChatCompletions_Create Operation") ||
			!strings.Contains(got, "exceeded call rate limit") || !strings.Contains(got, `"code":"429"`) {
			t.Fatalf("11th in the first second: %d %s", res.StatusCode, got)
		}
		wantHeaders(t, res, map[string]string{"retry-after-ms": "1000", "Retry-After": "1", "x-ratelimit-remaining-requests": "0",
			"x-ratelimit-limit-requests": "", "x-ratelimit-reset-requests": "", "x-ratelimit-limit-tokens": ""})
		time.Sleep(time.Second)
		if res, _ := post(t, s, "/v1/chat/completions", chatBody("hi", 5)); res.StatusCode != http.StatusOK {
			t.Errorf("in the next second: %d", res.StatusCode)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{Kind: fakeoai.LimitAzure, RPM: 60, TPM: 100, Window: 10 * time.Second}})
		defer s.Close()
		body := `{"model":"fake-model","prompt":"a b","max_tokens":10,"best_of":5}` // 2 + 10 × 5 = 52
		res, _ := post(t, s, "/v1/completions", body)
		wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-tokens": "48", "x-ratelimit-remaining-requests": "9"})
		time.Sleep(15 * time.Second)
		res, got := post(t, s, "/v1/completions", body)
		if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(got, "exceeded token rate limit") || !strings.Contains(got, "retry after 45 seconds") {
			t.Fatalf("104 of 100 tokens: %d %s", res.StatusCode, got)
		}
		wantHeaders(t, res, map[string]string{"retry-after-ms": "45000", "Retry-After": "45"})
		if st := s.Stats(); st.AdmittedTokens != 52 {
			t.Errorf("admitted %d tokens, want best_of's 52", st.AdmittedTokens)
		}
	})
}

// Anthropic's bucket answers with its own headers: resets as RFC 3339
// times of when the bucket is full again, retry-after in whole seconds,
// and its error body.
func TestAnthropicHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{Kind: fakeoai.LimitAnthropic, RPM: 6, TPM: 1000}})
		defer s.Close()
		start := time.Now().UTC()
		at := func(d time.Duration) string { return start.Add(d).Format(time.RFC3339) }
		body := completionBody("one two", 3) // 5 tokens
		res, _ := post(t, s, "/v1/completions", body)
		wantHeaders(t, res, map[string]string{
			"anthropic-ratelimit-requests-limit": "6", "anthropic-ratelimit-requests-remaining": "5", "anthropic-ratelimit-requests-reset": at(10 * time.Second),
			// 300 ms, rounded up to the second.
			"anthropic-ratelimit-tokens-limit": "1000", "anthropic-ratelimit-tokens-remaining": "995", "anthropic-ratelimit-tokens-reset": at(time.Second),
			"x-ratelimit-limit-requests": "", "x-ratelimit-remaining-tokens": ""})
		for range 5 {
			post(t, s, "/v1/completions", body)
		}
		res, got := post(t, s, "/v1/completions", body)
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal([]byte(got), &e); err != nil || res.StatusCode != http.StatusTooManyRequests || e.Type != "error" ||
			e.Error.Type != "rate_limit_error" || !strings.Contains(e.Error.Message, "6 requests per minute") {
			t.Fatalf("7th: %d %s (%v)", res.StatusCode, got, err)
		}
		wantHeaders(t, res, map[string]string{"retry-after": "10", "retry-after-ms": "", "anthropic-ratelimit-requests-remaining": "0",
			"anthropic-ratelimit-requests-reset": at(time.Minute)})
	})
}

// A kind, burst or window that makes no sense is refused with the reason.
func TestRateLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		limits fakeoai.RateLimits
		want   string
	}{
		{fakeoai.RateLimits{Kind: "leaky"}, `kind "leaky"`},
		{fakeoai.RateLimits{Kind: fakeoai.LimitAzure, Window: 7 * time.Second}, "window 7s: want a divisor of a minute"},
		{fakeoai.RateLimits{Kind: fakeoai.LimitSlidingWindow, Window: time.Second}, "only azure has one"},
		{fakeoai.RateLimits{Kind: fakeoai.LimitFixedWindow, Burst: time.Second}, "only a bucket has one"},
		{fakeoai.RateLimits{TPM: -1}, "want 0 or more"},
	} {
		err := fakeoai.Config{Limits: tc.limits}.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.limits, err, tc.want)
		}
	}
	s := fakeoai.NewUnstarted(fakeoai.Config{})
	defer s.Close()
	if err := s.SetRateLimits(fakeoai.RateLimits{Kind: "leaky"}); err == nil {
		t.Error("SetRateLimits took kind leaky")
	}
}

func chatBody(content string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{"model": "fake-model", "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

// Changing the kind keeps what was used: 60 tokens of a sliding window
// stay used in the bucket that replaces it.
func TestSetRateLimitsKind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{Kind: fakeoai.LimitSlidingWindow, TPM: 100}})
		defer s.Close()
		post(t, s, "/v1/completions", completionBody("a b c d", 56))
		if err := s.SetRateLimits(fakeoai.RateLimits{Kind: fakeoai.LimitBucket, TPM: 100}); err != nil {
			t.Fatal(err)
		}
		res, _ := post(t, s, "/v1/completions", completionBody("a b c d", 196)) // too large: headers only
		wantHeaders(t, res, map[string]string{"x-ratelimit-remaining-tokens": "40", "x-ratelimit-reset-tokens": "36s"})
	})
}

// The ledger by second holds what the minutes hold, each in the second it
// was admitted or answered: the most any 60 s held is read from it.
func TestLedgerBySecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{RPM: 600, TPM: 100_000}})
		defer s.Close()
		for range 3 {
			if res, got := post(t, s, "/v1/chat/completions", chatBody("[[len=4]] hi", 5)); res.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", res.StatusCode, got)
			}
			time.Sleep(1500 * time.Millisecond)
		}
		st := s.Stats()
		var tokens, used int64
		busy := 0
		for _, sec := range st.Seconds {
			tokens += sec.Tokens
			used += sec.Used
			if sec.Tokens > 0 {
				busy++
			}
		}
		m := st.Minutes[0]
		if tokens != m.Tokens || used != m.PromptTokens+m.CompletionTokens || busy != 3 {
			t.Errorf("seconds hold %d tokens, %d used, in %d seconds; want the minute's %d and %d, in 3", tokens, used, busy, m.Tokens,
				m.PromptTokens+m.CompletionTokens)
		}
	})
}
