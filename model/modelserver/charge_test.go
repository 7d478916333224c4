package modelserver

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

// Issue 33: LiteLLM's fixed minute counts usage (prompt + completion
// tokens), not prompt + max_tokens; with outputs of 40–100% of max_tokens
// a subscriber that reserves max_tokens used 0.92–0.94 of the limit by
// LiteLLM's own measure. It learns from the server's remaining count that
// the limiter counts usage, reserves its expected output instead, and
// reaches at least 0.95 of that measure over minutes 1–5, with no 429,
// learned or configured. Each request is delivered sendDelay after its
// reservation, as on a loaded machine.
func TestLearnsALimiterThatCountsUsage(t *testing.T) {
	for _, configured := range []bool{false, true} {
		t.Run(fmt.Sprintf("configured=%v", configured), func(t *testing.T) {
			r := loneCallers(t, fakeoai.RateLimits{TPM: 60000, RPM: 600, Kind: fakeoai.LimitFixedWindow}, configured, 0)
			if !r.byUsage {
				t.Error("the Model did not learn that the limiter counts usage")
			}
			if r.used < 0.95 {
				t.Errorf("%.3f of TPM used (prompt + completion) over minutes 1-5; want at least 0.95", r.used)
			}
			if r.limited > 0 {
				t.Errorf("%d 429s after minute 0; want none", r.limited)
			}
		})
	}
}

// Issue 33: the limiters that charge prompt + max_tokens at arrival
// (OpenAI's bucket, a sliding window, Azure's minute) must never be taken
// for one that counts usage: a subscriber that did would send about 1.4
// times their limit of charges and meet 429s. Alone on each, learned or
// configured, it keeps its reservation, no 429 after minute 0, and at least
// 0.95 of TPM admitted over minutes 1–5; its requests delivered sendDelay
// late (their arrival known only from their answers), it still never takes
// the limiter for one that counts usage (the delay itself costs some of
// the limit, TestLoneModelBatchesAgainstASlidingWindow).
func TestArrivalChargeKept(t *testing.T) {
	for _, kind := range []fakeoai.LimitKind{fakeoai.LimitBucket, fakeoai.LimitSlidingWindow, fakeoai.LimitAzure} {
		for _, c := range []struct {
			configured bool
			delay      time.Duration
		}{{false, 0}, {true, 0}, {false, sendDelay}} {
			configured, delay := c.configured, c.delay
			t.Run(fmt.Sprintf("%s,configured=%v,delay=%v", kind, configured, delay), func(t *testing.T) {
				r := loneCallers(t, fakeoai.RateLimits{TPM: 60000, RPM: 600, Kind: kind}, configured, delay)
				if r.byUsage || r.tookUsage {
					t.Error("the Model took a limiter that charges at arrival for one that counts usage")
				}
				if least := 0.95; r.admitted < least && delay == 0 {
					t.Errorf("%.3f of TPM admitted over minutes 1-5; want at least %.2f", r.admitted, least)
				}
				if r.limited > 0 {
					t.Errorf("%d 429s after minute 0; want none", r.limited)
				}
			})
		}
	}
}

type loneResult struct {
	admitted, used float64 // of TPM over minutes 1-5: charged at arrival, prompt + completion
	limited        int64   // 429s after minute 0
	byUsage        bool    // what the Model learned at the end
	tookUsage      bool    // whether it took the limit for one counting usage at any time
}

// loneCallers runs one Model, 16 callers of the benchmark's items
// (benchItems), each request delivered delay after its reservation, against a server of limits for six minutes, its limits
// configured too when configured.
func loneCallers(t *testing.T, limits fakeoai.RateLimits, configured bool, delay time.Duration) loneResult {
	const minutes = 6
	var r loneResult
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: limits, TokenLatency: 5 * time.Millisecond})
		defer s.Close()
		end := s.Now().Add(minutes*time.Minute + 30*time.Second)
		cfg := Config{}
		if configured {
			cfg.TPM, cfg.RPM = limits.TPM, limits.RPM
		}
		var logs strings.Builder
		var mu sync.Mutex
		cfg.BaseURL, cfg.Models = s.URL(), []string{"fake-model"}
		cfg.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
		cfg.HTTPClient = httpClient(lateTransport{s.Client().Transport, delay})
		m, err := Open(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		item := benchItems(rand.New(rand.NewPCG(33, uint64(len(limits.Kind)))))
		var wg sync.WaitGroup
		runCallers(t, &wg, m, s, end, func(w, i int) job.Item { return item(fmt.Sprintf("w%di%d", w, i)) }, func([]job.Output) {})
		wg.Wait()
		r.byUsage = m.rates.countsUsage()
		mu.Lock()
		r.tookUsage = strings.Contains(logs.String(), "taken to charge usage")
		mu.Unlock()
		var admitted, used int64
		for i, mn := range s.Stats().Minutes[1:minutes] {
			r.limited += mn.RateLimited
			admitted += mn.Tokens
			used += mn.PromptTokens + mn.CompletionTokens
			t.Logf("minute %d: %d requests, %.3f of TPM admitted, %.3f used, %d 429s", i+1, mn.Requests,
				float64(mn.Tokens)/float64(limits.TPM), float64(mn.PromptTokens+mn.CompletionTokens)/float64(limits.TPM), mn.RateLimited)
		}
		r.admitted = float64(admitted) / float64(limits.TPM*(minutes-1))
		r.used = float64(used) / float64(limits.TPM*(minutes-1))
	})
	return r
}

// Against a limit that counts usage a request reserves its prompt + the
// 0.9 quantile of its cohort's output lengths (each capped at its
// max_tokens), never more than prompt + max_tokens; against one that
// charges at arrival, prompt + max_tokens.
func TestUsageReservationIsTheCohortsQuantile(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		r, refused := m.parse("", chatItem("a", "hello there", 100))
		if refused != nil {
			t.Fatal(refused)
		}
		worst := m.tokens(r)
		prompt := worst - 100
		for i := range 10 {
			seq := m.outputs.begin(r.kind(), cohort(r))
			m.outputs.end(seq, int64(20*(i+1)), 1) // 20, 40, ... 200: above 100 capped
		}
		if got := m.tokens(r); got != worst {
			t.Errorf("charged at arrival: %d tokens reserved; want prompt + max_tokens, %d", got, worst)
		}
		m.rates.mu.Lock()
		m.rates.basis.byUsage = true
		m.rates.mu.Unlock()
		if got := m.tokens(r); got != worst {
			t.Errorf("by usage, the 0.9 quantile over max_tokens: %d tokens reserved; want %d", got, worst)
		}
		r2, _ := m.parse("", chatItem("b", "hello there", 400))
		if got, want := m.tokens(r2), prompt+180; got != want {
			t.Errorf("by usage: %d tokens reserved; want prompt + the 0.9 quantile, %d", got, want)
		}
	})
}

// The learning rule on its own: five requests sent at once to a limiter
// that counts usage (LiteLLM's), answered a second apart, each answer's
// remaining count less its usage. Between two answers nothing of this
// process arrives, yet the count falls: usage, once the answers date the
// arrivals (openai-processing-ms, or LiteLLM's
// x-litellm-response-duration-ms, "LiteLLM measures latency from when its
// handler starts", docs.litellm.ai/docs/troubleshoot/latency_overhead).
// Without either, an answer's arrival is known only to precede it, and
// each fall is what that arrival could have charged: nothing is learned.
func TestUsageLearnedFromTheAnswersAlone(t *testing.T) {
	for _, took := range []string{"openai-processing-ms", "x-litellm-response-duration-ms", ""} {
		t.Run("header="+took, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRates(0, 0, time.Now(), newWaits(time.Hour, quiet()))
				fixedMinute{r: r, remaining: 60000}.learn(t, took)
				if got, want := r.countsUsage(), took != ""; got != want {
					t.Errorf("learned by usage: %v; want %v", got, want)
				}
			})
		})
	}
}

// A request that generates more than it reserved, against a limit that
// counts usage, is counted at what it used: its excess is taken from the
// lone mirror's room (its floor) and from a configured limit's bucket,
// which the next requests wait for.
func TestUsageOvershootTakenFromTheRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRates(60000, 0, time.Now(), newWaits(time.Hour, quiet()))
		f := fixedMinute{r: r, remaining: 60000}
		f.learn(t, "openai-processing-ms")
		if !r.countsUsage() {
			t.Fatal("not learned")
		}
		now := time.Now()
		r.mu.Lock()
		r.own[kindTokens].refill(now, false)
		floor, level := r.srv[kindTokens].floor(now), r.own[kindTokens].level
		r.mu.Unlock()
		const reserved, used = 600, 1500
		v := f.take(t, reserved)
		f.answer(v, now, used, "openai-processing-ms")
		r.mu.Lock()
		defer r.mu.Unlock()
		if got := r.srv[kindTokens].floor(now); got != floor-used {
			t.Errorf("the mirror's floor: %v after a request reserved %d used %d; want %v", got, reserved, used, floor-used)
		}
		if got := r.own[kindTokens].level; got != level-used {
			t.Errorf("the configured bucket: %v after a request reserved %d used %d; want %v", got, reserved, used, level-used)
		}
	})
}

// fixedMinute answers requests as LiteLLM's fixed minute does: each
// answer's remaining count less its own usage.
type fixedMinute struct {
	r         *rates
	remaining int
}

func (f *fixedMinute) take(t *testing.T, tokens int64) reservation {
	t.Helper()
	v, err := f.r.take(t.Context(), tokens, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// answer answers v, sent at sentAt, with used tokens, its processing time
// in header took (none for "").
func (f *fixedMinute) answer(v reservation, sentAt time.Time, used int, took string) {
	const prompt, maxOut = 500, 500
	f.remaining -= used
	h := header("limit-tokens", "60000", "remaining-tokens", fmt.Sprint(f.remaining), "reset-tokens", "30s")
	if took != "" {
		h.Set(took, fmt.Sprint(time.Since(sentAt).Milliseconds()))
	}
	f.r.sync(h, time.Now(), true, maxOut, v.at)
	f.r.charged(v, prompt, maxOut, int64(used), h)
	f.r.settle(v, int64(used))
}

// learn sends five requests of prompt 500 and max_tokens 500 at once and
// answers them a second apart, 800 tokens each, after a first answer that
// sets the mirror up.
func (f fixedMinute) learn(t *testing.T, took string) {
	f.answer(f.take(t, 1000), time.Now(), 800, took)
	sentAt := time.Now()
	var res []reservation
	for range 5 {
		res = append(res, f.take(t, 1000))
	}
	for i, v := range res {
		time.Sleep(time.Second)
		f.answer(v, sentAt, 800, took)
		t.Logf("answer %d: learned by usage: %v", i, f.r.countsUsage())
	}
}
