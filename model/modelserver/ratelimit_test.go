package modelserver

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
)

// Issue 27, item 5: three subscribers sharing one endpoint's limits see
// each other only through the server's x-ratelimit headers, and still
// converge under the limit: after the first minute, every minute of the
// server's ledger uses at least 0.9 of the tokens-per-minute limit, and at
// most 1% of the answers are 429s. The clock is synctest's, so the six
// minutes take as long as the work does.
func TestThreeModelsShareOneLimit(t *testing.T) {
	const tpm, minutes = 40000, 6
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{
			Limits:       fakeoai.RateLimits{TPM: tpm, RPM: 2000},
			TokenLatency: 20 * time.Millisecond,
		})
		defer s.Close()
		end := s.Now().Add(minutes*time.Minute + 30*time.Second)
		var models []*Model
		for range 3 {
			models = append(models, openOn(t, s, Config{MaxConcurrency: 16}))
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		for mi, m := range models {
			for w := range 16 {
				wg.Go(func() {
					for i := 0; s.Now().Before(end); i++ {
						item := chatItem(fmt.Sprintf("m%dw%di%d", mi, w, i), fmt.Sprintf("tell me about %d and %d", w, i), 64)
						outs, err := m.Run(context.Background(), "", []job.Item{item})
						if until, ok := fault.BackoffUntil(err); ok {
							// More workers than the limit serves: this one
							// waited its MaxWait out, and comes back when
							// told, as the subscriber hands a message back.
							time.Sleep(time.Until(until))
							continue
						}
						if err == nil && outs[0].Error != nil {
							err = fmt.Errorf("item error %+v", outs[0].Error)
						}
						if err != nil {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
							return
						}
					}
				})
			}
		}
		wg.Wait()
		for _, err := range errs {
			t.Errorf("Run: %v", err)
		}
		st := s.Stats()
		var answers, limited int64
		for i, mn := range st.Minutes[1:minutes] {
			answers += mn.Answers
			limited += mn.RateLimited
			if used := float64(mn.Tokens) / tpm; used < 0.9 {
				t.Errorf("minute %d: %d tokens admitted, %.2f of the limit; want at least 0.9", i+1, mn.Tokens, used)
			}
			t.Logf("minute %d: %d requests, %d tokens (%.3f of the limit), %d answers, %d 429s", i+1, mn.Requests, mn.Tokens,
				float64(mn.Tokens)/tpm, mn.Answers, mn.RateLimited)
		}
		if answers == 0 || float64(limited) > 0.01*float64(answers) {
			t.Errorf("after the first minute, %d of %d answers were 429s; want at most 1%%", limited, answers)
		}
		t.Logf("minute 0: %d answers, %d 429s; all: %v", st.Minutes[0].Answers, st.Minutes[0].RateLimited, st.ByStatus)
	})
}

// A limit configured here paces requests on its own, without any header,
// and gets back what usage shows a request did not use. Requests go at
// most a second's share of the RPM in any second (paceSpan): a bucket of a
// minute would send 60 at once, which Azure's 1 s windows refuse.
func TestOwnLimitsPaceAndRefund(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{})
		defer s.Close()
		m := openOn(t, s, Config{RPM: 60, TPM: 100000})
		start := time.Now()
		for i := range 3 {
			if _, err := m.Run(t.Context(), "", []job.Item{chatItem(fmt.Sprint(i), "x", 10)}); err != nil {
				t.Fatal(err)
			}
		}
		// 60 RPM: one a second (and a transit), never three at once.
		if d := time.Since(start); d < 2*paceSpan || d > 3*time.Second {
			t.Errorf("3 requests under 60 RPM took %v; want them a second apart, %v in all", d, 2*paceSpan)
		}
		b := m.rates.own[kindTokens]
		m.rates.mu.Lock()
		b.refill(time.Now(), false)
		level := b.level
		m.rates.mu.Unlock()
		if level < 100000-3*20 {
			t.Errorf("the own token bucket is at %.0f after 3 small answers; want what usage used given back", level)
		}
	})
}

func TestRateHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("x-ratelimit-limit-tokens", "1000")
	h.Set("x-ratelimit-remaining-tokens", "400")
	h.Set("x-ratelimit-reset-tokens", "36s")
	h.Set("x-ratelimit-limit-requests", "60")
	h.Set("x-ratelimit-remaining-requests", "59")
	h.Set("x-ratelimit-reset-requests", "1s")
	now := time.Now()
	r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
	r.sync(h, now, true, 1, time.Time{})
	tok, req := r.srv[kindTokens], r.srv[kindRequests]
	if tok == nil || tok.capacity != 1000 || tok.level != 400 || tok.perSec < 16.66 || tok.perSec > 16.67 {
		t.Errorf("tokens mirror %+v; want capacity 1000, level 400, 600 tokens in 36s", tok)
	}
	if req == nil || req.level != 59 || req.perSec != 1 {
		t.Errorf("requests mirror %+v; want level 59, one a second", req)
	}
	// LiteLLM's fixed minute, a second into it: the reset is the time to the
	// next minute, not to a full bucket, and (limit − remaining) / reset
	// would read as 34 tokens a second, a 20-minute wait for 40,000 tokens.
	// The refill is never read below the limit a minute.
	h = http.Header{}
	h.Set("x-ratelimit-limit-tokens", "60000")
	h.Set("x-ratelimit-remaining-tokens", "58000")
	h.Set("x-ratelimit-reset-tokens", "59s")
	r = newRates(0, 0, now, newWaits(time.Hour, quiet()))
	r.sync(h, now, true, 1, time.Time{})
	if tok := r.srv[kindTokens]; tok == nil || tok.perSec < 1000 {
		t.Errorf("tokens mirror %+v early in a fixed minute; want a refill of at least 1,000 a second (60,000 a minute)", tok)
	}
	for v, want := range map[string]time.Duration{"12ms": 12 * time.Millisecond, "6m0s": 6 * time.Minute, "1.5": 1500 * time.Millisecond} {
		if got, ok := parseReset(v); !ok || got != want {
			t.Errorf("parseReset(%q) = %v, %v", v, got, ok)
		}
	}
	h = http.Header{}
	h.Set("retry-after-ms", "1500")
	h.Set("Retry-After", "9")
	if d, _, ok := retryAfter(h, now); !ok || d != 1500*time.Millisecond {
		t.Errorf("retryAfter: %v, %v; want retry-after-ms first", d, ok)
	}
	h.Del("retry-after-ms")
	if d, _, ok := retryAfter(h, now); !ok || d != 9*time.Second {
		t.Errorf("retryAfter: %v, %v; want Retry-After's seconds", d, ok)
	}
}

// A success whose x-ratelimit-limit-* is below what its own request took
// contradicts itself: that limit is not followed, and a mirror it had is
// dropped; a later answer with a limit that holds sets it again.
func TestContradictoryLimitDropsTheMirror(t *testing.T) {
	now := time.Now()
	r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
	h := http.Header{}
	h.Set("x-ratelimit-limit-tokens", "1000")
	h.Set("x-ratelimit-remaining-tokens", "900")
	r.sync(h, now, true, 100, time.Time{})
	if r.srv[kindTokens] == nil {
		t.Fatal("no mirror from a limit that holds")
	}
	h.Set("x-ratelimit-limit-tokens", "1")
	h.Set("x-ratelimit-remaining-tokens", "0")
	r.sync(h, now, true, 100, time.Time{})
	if b := r.srv[kindTokens]; b != nil {
		t.Errorf("mirror %+v after a success of 100 tokens under a limit of 1; want none", b)
	}
	// A refusal's limit is not contradicted by what it refused.
	r.sync(h, now, false, 100, time.Time{})
	if b := r.srv[kindTokens]; b == nil || b.capacity != 1 {
		t.Errorf("mirror %+v after a refusal under a limit of 1; want it followed", b)
	}
}

// Issue 33, Build item 2: a lone subscriber against a strict sliding 60 s
// window (the server's headers alone tell it the limit) must not read the
// window's lumpy refill as other consumers and stall itself: every minute
// after the first uses at least 0.9 of the limit, with at most 1% 429s. A
// guard, not a reproduction: these single-item requests did not stall
// before bucket.estimate's evidence rule either; the stall was seen in
// real time with 32-item messages (bench/modelserver.md, "Against each
// limiter kind").
func TestOneModelAgainstASlidingWindow(t *testing.T) {
	oneModelAgainst(t, fakeoai.RateLimits{TPM: 40000, RPM: 2000, Kind: fakeoai.LimitSlidingWindow}, false, 0.95)
}

// Issue 33, Build item 1: Azure OpenAI evaluates requests over 1 s or 10 s
// windows (10 a second at 600 RPM) and charges each its estimate at
// arrival against a count reset every minute; its headers give remaining
// counts (tokens of the minute, requests of the window) and no limit or
// window length. Sixteen callers of single small requests would send past
// both; a lone subscriber holds at most 1% 429s after the first minute and
// uses at least 0.95 of the binding limit (requests here), configured or
// learned from a 10 s window's counts, as Azure's answers show them.
// Learned from a 1 s window's, it spreads a tenth of the window's count a
// second (perSecond), a tenth of the RPM: no 429, and no figure asked.
func TestOneModelAgainstAzure(t *testing.T) {
	for _, c := range []struct {
		window     time.Duration
		configured bool
		least      float64
	}{{10 * time.Second, false, 0.95}, {10 * time.Second, true, 0.95}, {time.Second, true, 0.95}, {time.Second, false, 0}} {
		t.Run(fmt.Sprintf("window=%v,configured=%v", c.window, c.configured), func(t *testing.T) {
			oneModelAgainst(t, fakeoai.RateLimits{TPM: 40000, RPM: 600, Kind: fakeoai.LimitAzure, Window: c.window}, c.configured, c.least)
		})
	}
}

// Issue 33, Build item 2: LiteLLM's fixed minute (tokens counted from
// usage, a request admitted while the count is below the limit) with at
// most 1% 429s after the first minute.
//
// A lone subscriber counts each request at what a limiter charging at
// arrival takes (prompt + max_tokens), which LiteLLM's usage falls short
// of by the output not generated: here outputs are max_tokens less 4.
func TestOneModelAgainstAFixedWindow(t *testing.T) {
	oneModelSends(t, fakeoai.RateLimits{TPM: 40000, RPM: 2000, Kind: fakeoai.LimitFixedWindow}, false, 0.9, func(w, i int) job.Item {
		return chatItem(fmt.Sprintf("w%di%d", w, i), fmt.Sprintf("[[len=60]] tell me about %d and %d", w, i), 64)
	})
}

// oneModelAgainst runs 16 callers of one Model against a server of limits
// for six minutes, its limits configured too when configured, and wants at
// least least of the binding limit used in every minute after the first
// (none asked for 0), with at most 1% 429s.
func oneModelAgainst(t *testing.T, limits fakeoai.RateLimits, configured bool, least float64) {
	oneModelSends(t, limits, configured, least, func(w, i int) job.Item {
		return chatItem(fmt.Sprintf("w%di%d", w, i), fmt.Sprintf("tell me about %d and %d", w, i), 64)
	})
}

// Issue 33: the benchmark's requests (prompts of 50 to 2,000 tokens,
// max_tokens 16 to 512, outputs 40 to 100% of it) pass about 47 a minute
// under 60,000 TPM, so one refused request a minute is 2% of them: a
// lone subscriber that sent into a window's end once a minute (its refill
// counted between answers, where a window gives nothing back) met that
// against every window kind. Now none, learned or configured.
func TestOneModelAgainstEachWindowLargeRequests(t *testing.T) {
	for _, kind := range []fakeoai.LimitKind{fakeoai.LimitSlidingWindow, fakeoai.LimitFixedWindow, fakeoai.LimitAzure} {
		for _, configured := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s,configured=%v", kind, configured), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(33, uint64(len(kind))))
				var mu sync.Mutex
				oneModelSends(t, fakeoai.RateLimits{TPM: 60000, RPM: 600, Kind: kind}, configured, 0.9, func(w, i int) job.Item {
					mu.Lock()
					prompt, maxTokens := 50+rng.IntN(1951), 16+rng.IntN(497)
					out := max(1, int(float64(maxTokens)*(0.4+0.6*rng.Float64())))
					mu.Unlock()
					return chatItem(fmt.Sprintf("w%di%d", w, i), fmt.Sprintf("[[len=%d]] w%di%d%s", out, w, i, strings.Repeat(" w", prompt-10)), maxTokens)
				})
			})
		}
	}
}

// oneModelSends is oneModelAgainst with the items of item(caller, i).
func oneModelSends(t *testing.T, limits fakeoai.RateLimits, configured bool, least float64, item func(w, i int) job.Item) {
	const minutes = 6
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{
			Limits:       limits,
			TokenLatency: 20 * time.Millisecond,
		})
		defer s.Close()
		end := s.Now().Add(minutes*time.Minute + 30*time.Second)
		cfg := Config{MaxConcurrency: 16}
		if configured {
			cfg.TPM, cfg.RPM = limits.TPM, limits.RPM
		}
		m := openOn(t, s, cfg)
		var wg sync.WaitGroup
		runCallers(t, &wg, m, s, end, item, func([]job.Output) {})
		wg.Wait()
		st := s.Stats()
		var answers, limited int64
		for i, mn := range st.Minutes[1:minutes] {
			answers += mn.Answers
			limited += mn.RateLimited
			tokens := mn.Tokens
			if limits.Kind == fakeoai.LimitFixedWindow {
				tokens = mn.PromptTokens + mn.CompletionTokens // what LiteLLM counts
			}
			used := max(float64(tokens)/float64(limits.TPM), float64(mn.Requests)/float64(limits.RPM))
			t.Logf("minute %d: %d requests, %d tokens (%.3f of the binding limit), %d answers, %d 429s", i+1, mn.Requests, tokens, used,
				mn.Answers, mn.RateLimited)
			if used < least {
				t.Errorf("minute %d: %.3f of the binding limit; want at least %.2f", i+1, used, least)
			}
		}
		if answers == 0 || float64(limited) > 0.01*float64(answers) {
			t.Errorf("after the first minute, %d of %d answers were 429s; want at most 1%%", limited, answers)
		}
	})
}

// Issue 33: against a limit of one request a minute, learned from the
// server's headers, a lone subscriber sends one a minute; before, it took
// its own last request for another consumer's and waited about two.
func TestOneRequestAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{RPM: 1, TPM: 100000}})
		defer s.Close()
		m := openOn(t, s, Config{MaxWait: 5 * time.Minute})
		start := time.Now()
		sent := 0
		for i := 0; time.Since(start) < 7*time.Minute; i++ {
			outs, err := m.Run(context.Background(), "", []job.Item{chatItem(fmt.Sprintf("r%d", i), "hello", 4)})
			if until, ok := fault.BackoffUntil(err); ok {
				time.Sleep(time.Until(until))
				continue
			}
			if err != nil || outs[0].Error != nil {
				t.Fatalf("Run: %v %+v", err, outs)
			}
			sent++
		}
		if sent < 6 {
			t.Errorf("%d requests answered in 7 minutes at one a minute; want at least 6", sent)
		}
		t.Logf("%d requests answered in 7 minutes; the server's answers: %v", sent, s.Stats().ByStatus)
	})
}

// The evidence of others' use weighs the server's deficit against all this
// process sent in the limit's minute, whatever refill the last headers
// implied: near a window's boundary they imply many times the limit, and a
// span read from that took this process's sends of a few seconds ago for
// others' use (a stall of minutes in the real-time benchmark).
func TestOthersWeighedOverTheMinute(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newBucket(60000, now, true)
	b.estimate(60000, now, false, time.Time{}) // the first reading
	b.charge(25000, now.Add(10*time.Second), 1)
	b.charge(25000, now.Add(20*time.Second), 2)
	b.perSec = 20000 // (limit − remaining) / reset with a reset of seconds
	b.estimate(8000, now.Add(30*time.Second), false, time.Time{})
	// Deficit 52,000, of which this process sent 50,000: 2,000 a minute
	// are others', 33 a second, weighed in at 0.3.
	if got := b.othersPerSec; got > 20 {
		t.Errorf("others' use %v a second; want about 10 (0.3 of 33): this process's own sends are not others'", got)
	}
}

// A fixed minute's reset near its end is seconds, and (limit − remaining)
// / reset reads as many times the limit: the mirror refills at the least
// rate read within the minute, here the limit a minute, not at the
// reading that would send the next minute's limit at once.
func TestRefillIsTheMinutesLeastReading(t *testing.T) {
	now := time.Now()
	r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
	r.sync(header("limit-tokens", "60000", "remaining-tokens", "59000", "reset-tokens", "59s"), now, true, 1000, time.Time{})
	h := header("limit-tokens", "60000", "remaining-tokens", "2000", "reset-tokens", "2s")
	r.sync(h, now.Add(57*time.Second), true, 1000, time.Time{})
	if got := r.srv[kindTokens].perSec; got > 1001 {
		t.Errorf("refill %.0f tokens a second two seconds before a fixed minute's end; want 1,000 (60,000 a minute)", got)
	}
	// A bucket's readings agree, a faster one (a test server's clock) included.
	h.Set("x-ratelimit-remaining-tokens", "50000")
	h.Set("x-ratelimit-reset-tokens", "1s")
	for i := range 3 {
		r.sync(h, now.Add(time.Duration(3+i)*time.Minute), true, 1000, time.Time{})
	}
	if got := r.srv[kindTokens].perSec; got != 10000 {
		t.Errorf("refill %.0f tokens a second after a minute of readings of 10,000; want 10,000", got)
	}
}

// Azure sends x-ratelimit-remaining-* and no limit: the mirrors follow the
// remaining counts, each limit at least what remains plus what the
// answered request took, the most any answer has shown, where that
// request is in the count: not the first answer's (nothing shows whether
// the count restarted since its send) nor one's sent before the count
// last rose (a request charged to the last minute, its cost counted twice
// over).
func TestLimitInferredFromRemaining(t *testing.T) {
	now := time.Now()
	r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
	at := func(d time.Duration) time.Time { return now.Add(d) }
	r.sync(header("remaining-tokens", "58000", "remaining-requests", "90"), now, true, 1000, at(-time.Second))
	if tok := r.srv[kindTokens]; tok == nil || tok.capacity != 58000 {
		t.Fatalf("tokens mirror %+v after the first answer; want capacity 58,000", tok)
	}
	// Sent in the last minute, answered in this one: 59,000 + 1,000 is
	// no limit.
	r.sync(header("remaining-tokens", "59000", "remaining-requests", "99"), at(time.Minute), true, 1000, at(59*time.Second))
	if tok := r.srv[kindTokens]; tok.capacity != 59000 {
		t.Errorf("capacity %.0f from a request sent before the count rose; want 59,000 (not its 1,000 again)", tok.capacity)
	}
	r.sync(header("remaining-tokens", "59000", "remaining-requests", "99"), at(time.Minute+2*time.Second), true, 1000, at(time.Minute+time.Second))
	h := header("remaining-tokens", "10000", "remaining-requests", "99")
	r.sync(h, now.Add(time.Minute+30*time.Second), true, 1000, time.Time{})
	tok, req := r.srv[kindTokens], r.srv[kindRequests]
	if tok == nil || tok.capacity != 60000 || tok.level != 10000 || tok.perSec != 1000 {
		t.Errorf("tokens mirror %+v; want capacity 60,000 (59,000 + 1,000), level 10,000, 1,000 a second", tok)
	}
	// The requests count is a window's, 1 s or 10 s long: a tenth of it a
	// second, no mirror of a minute.
	if req != nil {
		t.Errorf("requests mirror %+v; want none", req)
	}
	if n, _ := r.perSecond(); n != 10 {
		t.Errorf("%d requests a second; want 10", n)
	}
	// A request sent before the count rose, answered after an answer
	// that showed the rise, and whose count is below that one's: still
	// charged to the last minute, not to the count its answer shows.
	r = newRates(0, 0, now, newWaits(time.Hour, quiet()))
	r.sync(header("remaining-tokens", "58000"), now, true, 1000, at(-time.Second))
	r.sync(header("remaining-tokens", "59000"), at(61*time.Second), true, 1000, at(60500*time.Millisecond))
	r.sync(header("remaining-tokens", "58500"), at(62*time.Second), true, 1000, at(59*time.Second))
	if tok := r.srv[kindTokens]; tok.capacity != 59000 {
		t.Errorf("capacity %.0f from a request sent before another's answer showed the count rise; want 59,000", tok.capacity)
	}
	// Configured limits are the limits the remaining counts count down from.
	r = newRates(30000, 0, now, newWaits(time.Hour, quiet()))
	r.sync(h, now, true, 1000, time.Time{})
	if tok := r.srv[kindTokens]; tok == nil || tok.capacity != 30000 {
		t.Errorf("tokens mirror %+v; want the configured 30,000", tok)
	}
}

// Issue 33, Build item 2: a pause this process imposes on itself by its
// own reckoning is at most a minute, whatever its estimate of others' use,
// is logged with its reason when long, and is counted.
func TestSelfPauseBoundedLoggedCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs strings.Builder
		log := slog.New(slog.NewTextHandler(&logs, nil))
		now := time.Now()
		r := newRates(0, 0, now, newWaits(time.Hour, log))
		b := newBucket(60000, now, true)
		b.level, b.othersPerSec = 0, othersShare*b.perSec // a refill of 50 a second left to this process
		r.srv[kindTokens], r.answered, r.typical = b, true, 1000
		_, err := r.take(t.Context(), 30000, now)
		until, ok := fault.BackoffUntil(err)
		if !ok || until.Sub(now) > limitSpan {
			t.Fatalf("take: %v; want a backoff of at most %v (the estimate alone says 10 minutes)", err, limitSpan)
		}
		if !strings.Contains(logs.String(), "requests wait for room under the rate limit") || !strings.Contains(logs.String(), "limit=\"tokens per minute\"") {
			t.Errorf("log %q; want the pause and its reason", logs.String())
		}
		// A wait taken is counted by the limit that held it.
		r = newRates(600, 0, now, newWaits(time.Hour, quiet()))
		for range 2 {
			if _, err := r.take(t.Context(), 300, now.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		if n := testutil.CollectAndCount(r.paused); n != 0 {
			t.Errorf("%d series after two requests that fit; want none", n)
		}
		if _, err := r.take(t.Context(), 300, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(now); d < 30*time.Second {
			t.Errorf("the third request of 300 under 600 a minute went after %v; want 30 s", d)
		}
		var m dto.Metric
		if err := r.paused.WithLabelValues("configured_tokens").(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		if n, sum := m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum(); n != 1 || sum < 30 {
			t.Errorf("pauses counted: %d, %.1f s; want 1 of 30 s", n, sum)
		}
	})
}

// header is x-ratelimit-* headers from name, value pairs, the names
// without the prefix.
func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set("x-ratelimit-"+kv[i], kv[i+1])
	}
	return h
}

// Issue 33, Build item 3: three subscribers that share one limit, seeing
// each other only through its headers, meet at most 1% 429s after the
// first minute against every limiter kind, and none starves: each gets
// its items answered within 20% of the three's mean. The requests are the
// benchmark's (about 47 a minute pass 60,000 TPM), so one request sent
// into room another took is 2% of a minute's answers.
func TestThreeModelsShareEachLimiterKind(t *testing.T) {
	for _, kind := range []fakeoai.LimitKind{fakeoai.LimitBucket, fakeoai.LimitSlidingWindow, fakeoai.LimitFixedWindow, fakeoai.LimitAzure} {
		t.Run(string(kind), func(t *testing.T) {
			threeShare(t, fakeoai.RateLimits{TPM: 60000, RPM: 600, Kind: kind}, shareShape{minutes: 30, callers: 16, chunk: 1, want: true})
		})
	}
}

// shareShape is how many Models threeShare runs (models; 3 if 0) and how
// each runs its work: callers batches of chunk items at once (a single
// item's Models take callers as their MaxConcurrency), for minutes, each
// request delivered delay after it is sent; messages: as the subscriber
// runs them (runMessages), else each backoff drops its batch for the next
// (runBatches). want: fail the test where the bounds are missed.
type shareShape struct {
	minutes, callers, chunk int
	models                  int
	delay                   time.Duration
	messages, want          bool
}

// shareResult is what threeShare measured after minute 0: 429s of
// answers, tokens admitted over the limit's, and each Model's items
// answered.
type shareResult struct {
	limited, answers int64
	admitted         float64
	ok               []int
}

// threeShare runs three Models (or the shape's models) of the shape's
// callers against one server of limits for the shape's minutes of
// synctest's clock (the items' spread of costs makes shorter runs' shares
// noisy), and, if the shape wants, wants at most 1% 429s after minute 0
// and each Model's items within 20% of the mean. For the fixed minute,
// admitted counts usage, as LiteLLM does.
func threeShare(t *testing.T, limits fakeoai.RateLimits, shape shareShape) (res shareResult) {
	minutes := shape.minutes
	span := time.Duration(minutes) * time.Minute
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: limits, TokenLatency: 5 * time.Millisecond})
		defer s.Close()
		end := s.Now().Add(span + 30*time.Second)
		from := s.Now().Add(time.Minute)
		item := benchItems(rand.New(rand.NewPCG(33, uint64(len(limits.Kind)))))
		var mu sync.Mutex
		models := cmp.Or(shape.models, 3)
		ok := make([]int, models)
		okBy := make([][]int, models)
		for mi := range okBy {
			okBy[mi] = make([]int, minutes+1)
		}
		var wg sync.WaitGroup
		for mi := range models {
			cfg := Config{Logger: quiet()}
			if shape.chunk == 1 {
				cfg.MaxConcurrency = shape.callers
			}
			cfg.BaseURL, cfg.Models, cfg.HTTPClient = s.URL(), []string{"fake-model"}, s.Client()
			if shape.delay > 0 {
				cfg.HTTPClient = httpClient(lateTransport{s.Client().Transport, shape.delay})
			}
			m, err := Open(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			batch := func(w, i int) []job.Item {
				items := make([]job.Item, shape.chunk)
				for j := range items {
					items[j] = item(fmt.Sprintf("m%dw%di%dj%d", mi, w, i, j))
				}
				return items
			}
			run := runBatches
			if shape.messages {
				run = runMessages
			}
			run(t, &wg, m, s, end, shape.callers, batch, func(outs []job.Output) {
				if s.Now().Before(from) {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for _, o := range outs {
					if o.Error == nil {
						ok[mi]++
						okBy[mi][min(minutes, int(s.Now().Sub(from)/time.Minute)+1)]++
					}
				}
			})
		}
		wg.Wait()
		st := s.Stats()
		var answers, limited, tokens int64
		for i, mn := range st.Minutes[1:minutes] {
			answers += mn.Answers
			limited += mn.RateLimited
			tokens += mn.Tokens
			if shape.want {
				t.Logf("minute %d: %d answers, %d 429s, %d tokens admitted", i+1, mn.Answers, mn.RateLimited, mn.Tokens)
			}
			if limits.Kind == fakeoai.LimitFixedWindow {
				tokens += mn.PromptTokens + mn.CompletionTokens - mn.Tokens // what LiteLLM counts
			}
		}
		for m0 := 1; m0 < minutes; m0 += 5 {
			n := make([]int, models)
			for mi := range models {
				for _, c := range okBy[mi][m0:min(minutes+1, m0+5)] {
					n[mi] += c
				}
			}
			t.Logf("minutes %d-%d: items ok per model %v", m0, m0+4, n)
		}
		mean := meanItems(ok)
		t.Logf("after minute 0: %d of %d answers 429 (%.1f%%), %.3f of TPM admitted; items ok per model %v",
			limited, answers, 100*float64(limited)/float64(max(1, answers)), float64(tokens)/float64(minutes-1)/float64(limits.TPM), ok)
		res = shareResult{limited, answers, float64(tokens) / float64(minutes-1) / float64(limits.TPM), ok}
		if !shape.want {
			return
		}
		if answers == 0 || float64(limited) > 0.01*float64(answers) {
			t.Errorf("after the first minute, %d of %d answers were 429s; want at most 1%%", limited, answers)
		}
		for mi, n := range ok {
			if d := float64(n)/mean - 1; d > 0.2 || d < -0.2 {
				t.Errorf("model %d: %d items answered after minute 0, %+.0f%% of the mean %.0f; want within 20%%", mi, n, 100*d, mean)
			}
		}
	})
	return res
}

// meanItems is the mean of the Models' items answered.
func meanItems(ok []int) float64 {
	sum := 0
	for _, n := range ok {
		sum += n
	}
	return float64(sum) / float64(len(ok))
}

// A fixed minute's end is read from answers whose resets end at one
// instant while the count falls; a sliding window's, whose reset is its
// newest charge's, moves with each charge and is not one. Azure sends no
// reset: its minute starts between the answer before its count jumped
// back up and that answer, taken at the earlier; past the end so read,
// the minute is not read as started again until a jump shows it.
func TestFixedMinuteEndFromAnswers(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	fixed := newBucket(60000, t0, true)
	fixed.observeWindow(50000, 50*time.Second, true, t0, t0)
	fixed.observeWindow(48000, 47*time.Second, true, t0.Add(3*time.Second), t0.Add(3*time.Second))
	if left, ok := fixed.windowLeft(t0.Add(10 * time.Second)); !ok || left != 40*time.Second {
		t.Errorf("fixed minute: %v left (%v) 10 s in; want 40s", left, ok)
	}
	sliding := newBucket(60000, t0, true)
	sliding.observeWindow(50000, time.Minute, true, t0, t0)
	sliding.observeWindow(48000, time.Minute, true, t0.Add(3*time.Second), t0.Add(3*time.Second))
	// Two requests sent together, the later one the window's newest.
	sliding.observeWindow(47000, time.Minute, true, t0.Add(4*time.Second), t0.Add(4*time.Second))
	sliding.observeWindow(46000, time.Minute-time.Millisecond, true, t0.Add(4*time.Second+time.Millisecond), t0.Add(4*time.Second+time.Millisecond))
	if left, ok := sliding.windowLeft(t0.Add(10 * time.Second)); ok {
		t.Errorf("sliding window: read as a fixed minute with %v left", left)
	}
	azure := newBucket(60000, t0, true)
	azure.observeWindow(3000, 0, false, t0, t0)
	azure.observeWindow(58000, 0, false, t0.Add(2*time.Second), t0.Add(2*time.Second))
	if left, ok := azure.windowLeft(t0.Add(30 * time.Second)); !ok || left != 30*time.Second {
		t.Errorf("Azure's minute: %v left (%v) 30 s after the answer before the jump; want 30s", left, ok)
	}
	// Past that end, answers still show the old count (the minute in
	// fact started after t0): ending, not a new minute nearly spent.
	azure.observeWindow(2000, 0, false, t0.Add(61*time.Second), t0.Add(61*time.Second))
	if left, ok := azure.windowLeft(t0.Add(61500 * time.Millisecond)); !ok || left != 0 {
		t.Errorf("Azure's minute: %v left (%v) past its end with no jump since; want 0, not a new minute", left, ok)
	}
	azure.observeWindow(59000, 0, false, t0.Add(62*time.Second), t0.Add(62*time.Second))
	if left, ok := azure.windowLeft(t0.Add(91 * time.Second)); !ok || left != 30*time.Second {
		t.Errorf("Azure's next minute: %v left (%v); want 30s (started at 61 s, the answer before the jump)", left, ok)
	}
}

// benchItems makes the benchmark's chat items from rng, for callers at
// once: prompts of 50 to 2,000 tokens, max_tokens 16 to 512, outputs of
// 40 to 100% of it.
func benchItems(rng *rand.Rand) func(id string) job.Item {
	var mu sync.Mutex
	return func(id string) job.Item {
		mu.Lock()
		defer mu.Unlock()
		prompt, maxTokens := 50+rng.IntN(1951), 16+rng.IntN(497)
		out := max(1, int(float64(maxTokens)*(0.4+0.6*rng.Float64())))
		return chatItem(id, fmt.Sprintf("[[len=%d]] %s%s", out, id, strings.Repeat(" w", prompt-10)), maxTokens)
	}
}

// runCallers starts 16 callers of m on wg, each running single items of
// item(caller, i) until end on s's clock, waiting out a backoff as the
// subscriber would, each answer's outputs to answered.
func runCallers(t *testing.T, wg *sync.WaitGroup, m *Model, s *fakeoai.Server, end time.Time, item func(w, i int) job.Item,
	answered func([]job.Output)) {
	runBatches(t, wg, m, s, end, 16, func(w, i int) []job.Item { return []job.Item{item(w, i)} }, answered)
}

// runBatches is runCallers with callers, each running batch(caller, i),
// a batch handed back (a backoff) dropped for the next once its wait
// ends, its outputs to answered as each batch ends.
func runBatches(t *testing.T, wg *sync.WaitGroup, m *Model, s *fakeoai.Server, end time.Time, callers int,
	batch func(w, i int) []job.Item, answered func([]job.Output)) {
	runWork(t, wg, m, s, end, callers, batch, answered, false)
}

// runMessages is runBatches as the subscriber runs its messages: a batch
// handed back waits out its backoff and runs again with only the items it
// had not finished. Each answer goes to answered as it arrives
// (gpu.WithAnswers), as the fake server counts it, not when its batch
// ends: a 32-item batch ending just after a run's end moves a tenth of a
// Model's items.
func runMessages(t *testing.T, wg *sync.WaitGroup, m *Model, s *fakeoai.Server, end time.Time, callers int,
	batch func(w, i int) []job.Item, answered func([]job.Output)) {
	runWork(t, wg, m, s, end, callers, batch, answered, true)
}

func runWork(t *testing.T, wg *sync.WaitGroup, m *Model, s *fakeoai.Server, end time.Time, callers int,
	batch func(w, i int) []job.Item, answered func([]job.Output), messages bool) {
	ctx := context.Background()
	if messages {
		ctx = gpu.WithAnswers(ctx, func(_ int, out job.Output) { answered([]job.Output{out}) })
	}
	for w := range callers {
		wg.Go(func() {
			for i := 0; s.Now().Before(end); i++ {
				items := batch(w, i)
				for len(items) > 0 && s.Now().Before(end) {
					outs, err := m.Run(ctx, "", items)
					if until, ok := fault.BackoffUntil(err); ok {
						var rest []job.Item
						if messages {
							_, done, _ := fault.Partial[job.Output](err)
							for k, it := range items {
								if k >= len(done) || !done[k] {
									rest = append(rest, it)
								}
							}
						}
						items = rest
						time.Sleep(time.Until(until))
						continue
					}
					if err != nil {
						t.Errorf("Run: %v", err)
						return
					}
					if !messages {
						answered(outs)
					}
					items = nil
				}
			}
		})
	}
}

// Issue 33, item 3: sharing a limit, a process sends at its own pace, so
// what it offers admission (learnedWithin, backend.RateTokens) is what the
// pace passes, not the refill the others leave it: offered that, the
// subscriber admitted messages the pace then held past MaxWait, each one
// backed off. Alone on the limit there is no pace, and the offer is the
// mirror's.
func TestLearnedWithinKnowsThePace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := time.Now()
		r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
		b := newBucket(60000, now, true)
		b.level, b.proven, b.othersPerSec = 30000, 30000, 500 // half the refill left to this process
		r.srv[kindTokens], r.answered, r.typical = b, true, 1300
		const d = 30 * time.Second
		lone, _ := r.learnedWithin(d, 0)
		if want := 500*d.Seconds() + 30000 - 1300; lone != want {
			t.Errorf("alone: %.0f tokens offered in %v; want the mirror's %.0f", lone, d, want)
		}
		b.sharedAt = now
		r.pace, r.paceAt, r.paceLevel = 300, now, 0
		shared, _ := r.learnedWithin(d, 0)
		if most := 300*d.Seconds() + 2*300; shared > most {
			t.Errorf("paced at 300 a second: %.0f tokens offered in %v; want at most %.0f", shared, d, most)
		}
	})
}

// Sharing a bucket, a request that waits for the mirror's room rather
// than for the pace cuts the pace by paceCutBound of its share of the
// draw, at most once in cutEvery: the paces summed to more than the limit,
// and the mirror, first come first served, divided it (one of three 24–28%
// off the mean in 3 of 6 runs of TestBenchShare's 32-item batches). Not
// in a sliding window, whose parts are kept by sending again, nor in a
// fixed minute whose end the answers show.
func TestPaceCutWhenTheMirrorBinds(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(b *bucket, now time.Time)
		cut  bool
	}{
		{"bucket", func(*bucket, time.Time) {}, true},
		{"sliding window", func(b *bucket, now time.Time) { b.slidingAt = now }, false},
		{"fixed minute", func(b *bucket, now time.Time) { b.windowEnd = now.Add(30 * time.Second) }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				now := time.Now()
				r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
				b := newBucket(60000, now, true)
				// The mirror has 2,000 tokens of room for a request of
				// 1,300 and a margin of 3 typical requests: it waits for
				// the mirror, while the pace (400 a second, its room full)
				// would let it go.
				b.level, b.proven, b.othersPerSec, b.sharedAt = 2000, 2000, 600, now
				c.set(b, now)
				r.srv[kindTokens], r.answered, r.typical = b, true, 1300
				r.pace, r.paceAt, r.paceLevel = 400, now, 800
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				defer cancel()
				_, err := r.take(ctx, 1300, now.Add(time.Hour))
				if err == nil {
					t.Fatal("took room the mirror does not have")
				}
				r.mu.Lock()
				defer r.mu.Unlock()
				want := 400.0
				if c.cut {
					want = 400 * (1 - paceCutBound*400/(400+600))
				}
				if math.Abs(r.pace-want) > 1e-9 {
					t.Errorf("pace %.2f after a wait on the mirror; want %.2f", r.pace, want)
				}
			})
		})
	}
}

// In a fixed minute whose end the answers show, a process that shares it
// paces at its share of what remains over what remains of the minute (its
// share: what it sent of the minute's count so far): three paces that
// summed to more than the limit spent each minute before its end, and the
// requests sent into its last room met 429s (Azure's strict minute: 0.9–1.6%
// in virtual time).
func TestPaceHeldToItsShareOfAWindowsRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := time.Now()
		r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
		b := newBucket(60000, now, true)
		// 30 s into the minute the server has counted 45,000, a third of
		// it this process's: 15,000 remain for 30 s, 5,000 of them its.
		b.proven, b.othersPerSec, b.sharedAt = 15000, 800, now
		b.windowEnd, b.endFromStart = now.Add(30*time.Second), true // Azure's: from its count's jump
		b.charge(15000, now.Add(-20*time.Second), 1)
		r.srv[kindTokens], r.answered, r.typical = b, true, 1300
		r.pace, r.paceAt, r.paceLevel = 400, now, -100
		r.congestion(b, now)
		if r.pace > 200 || r.pace < r.minPace() {
			t.Errorf("pace %.0f a second after a third of the minute's 45,000 in its first half; want at most 200 "+
				"(its 5,000 of the rest over 30 s is 167; at most halved at once)", r.pace)
		}
	})
}

// Issue 33: sharing a limit, a process's pace grows only while a request
// waits for it, and decays towards what the process uses while none waits
// at all. Grown whenever its room was under a burst's, which it is after
// every send, a process sending less than its pace grew it until a cut,
// and offered admission what it never used (TestOfferSharesTheServersLimits
// swung between 800 and 2,900 tokens). The mirror here has room to spare:
// only the pace holds a request.
func TestSharedPaceGrowsOnlyWhileWaitedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRates(0, 0, time.Now(), newWaits(time.Hour, quiet()))
		b := newBucket(60000, time.Now(), true)
		b.othersPerSec = 500
		r.srv[kindTokens], r.answered, r.typical = b, true, 1000
		r.pace, r.paceAt = 300, time.Now()
		send := func() {
			r.mu.Lock()
			b.sharedAt, b.level, b.proven = time.Now(), b.capacity, b.capacity
			r.mu.Unlock()
			res, err := r.take(t.Context(), 1000, time.Now().Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			r.settle(res, 1000)
		}
		pace := func() float64 {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.pace
		}
		// Admission reads the offer every second, as the subscriber does
		// (Device.MemInfo), which brings the pace to now; and an answer
		// shows the limit all unused, which grows a pace that binds by half
		// (rates.congestion).
		idle := func() {
			for range 5 {
				time.Sleep(time.Second)
				r.learnedWithin(30*time.Second, 0)
				r.mu.Lock()
				b.proven = b.capacity
				r.congestion(b, time.Now())
				r.mu.Unlock()
			}
		}
		// 1,000 tokens every 5 s, 200 a second: none waits for a pace of 300.
		for range 60 {
			send()
			idle()
		}
		if p := pace(); p > 300 {
			t.Errorf("sending 200 tokens a second for 5 minutes, nothing waiting: the pace grew from 300 to %.0f", p)
		}
		// Back to back, each request waits for the pace: it grows.
		for range 30 {
			send()
		}
		grown := pace()
		if grown <= 300 {
			t.Fatalf("30 requests waiting for a pace of 300 in turn: it stayed at %.0f; want it grown", grown)
		}
		// Back to 200 a second: it decays towards 1.5 times that.
		for range 36 {
			send()
			idle()
		}
		if p := pace(); p > 1.5*200*1.1 {
			t.Errorf("3 minutes at 200 tokens a second after the pace grew to %.0f: still %.0f; want at most 1.5 times the use and 10%%", grown, p)
		}
	})
}

// A request handed back (its wait past the deadline: a backoff) still
// waits, its batch holding its messages until the backoff ends. Handed back
// by the pace, the pace binds over that time and grows, as for a request
// waiting in take; by the mirror, the process is not short of work, and its
// pace does not decay: it is cut once, as the mirror bound
// (mirrorBound), and no further. Counted as no wait, a process whose
// batches were handed back would decay its pace on its own backoffs.
func TestSharedPaceHandedBackStillBinds(t *testing.T) {
	for _, tc := range []struct {
		name        string
		paceLevel   float64 // the pace's room: -3,000 is 10 s of sends to pay off
		mirrorLevel float64
		grows       bool
	}{
		{"by the pace", -3000, 60000, true},
		{"by the mirror", 1000, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRates(0, 0, time.Now(), newWaits(time.Hour, quiet()))
				b := newBucket(60000, time.Now(), true)
				b.othersPerSec, b.sharedAt, b.level = 500, time.Now(), tc.mirrorLevel
				r.srv[kindTokens], r.answered, r.typical = b, true, 1000
				r.pace, r.paceAt, r.paceLevel = 300, time.Now(), tc.paceLevel
				_, err := r.take(t.Context(), 1000, time.Now().Add(time.Second))
				until, ok := fault.BackoffUntil(err)
				if !ok {
					t.Fatalf("take with seconds to wait and a deadline in 1 s: %v; want a backoff", err)
				}
				d := time.Until(until)
				for time.Now().Before(until) {
					time.Sleep(time.Second)
					r.learnedWithin(30*time.Second, 0)
				}
				r.mu.Lock()
				defer r.mu.Unlock()
				least := 300.0
				if !tc.grows {
					least = 300 * (1 - paceCutBound*300/(300+500)) // mirrorBound's one cut
				}
				if grown := r.pace > least+1e-9; grown != tc.grows || r.pace < least-1e-9 {
					t.Errorf("after a backoff of %v: pace %.1f from 300; want grown %v, never less than %.1f", d, r.pace, tc.grows, least)
				}
			})
		})
	}
}

// Before the server's first answer its limits are unknown, and what the
// rate tokens offer is bounded to DefaultMaxConcurrency requests at the
// output ceiling, also where the concurrency follows a KV cache of
// thousands of blocks: bounded by that, a learning subscriber admitted
// every message it held at its first reading, and all of them, sharing
// the limit, backed off again and again; none finished in the ten minutes
// of the real-time benchmark (bench/modelserver.md).
func TestPreAnswerOfferIgnoresTheKVConcurrency(t *testing.T) {
	kv := fakeoai.Config{BlockSize: 16, NumGPUBlocks: 2048, MaxNumSeqs: 4096}
	inBubble(t, kv, Config{MaxOutputTokens: 100}, func(t *testing.T, _ *fakeoai.Server, m *Model) {
		if m.cfg.MaxConcurrency <= DefaultMaxConcurrency {
			t.Fatalf("concurrency %d: the KV cache's bound was wanted for this test", m.cfg.MaxConcurrency)
		}
		if now, _ := m.Offers(); now[backend.RateTokens] != DefaultMaxConcurrency*100 {
			t.Errorf("before any answer: %d rate tokens offered; want %d requests of 100", now[backend.RateTokens], DefaultMaxConcurrency)
		}
	})
}

// Issue 33, Build item 2: a lone Model against a strict sliding window,
// the limits learned from the headers or configured, the benchmark's
// items in its 32-item messages (prompts of 50 to 2,000 tokens,
// max_tokens 16 to 512, outputs 40 to 100% of it), several at once as the
// subscriber admits them, each request reaching the server sendDelay
// after its reservation, as on a loaded machine: a send leaves the
// window that much later than it leaves a count kept from the
// reservation, and a lump of them read so was taken for others' use. The
// Model must never read itself as sharing the limit (in the real-time
// benchmark it did, and paced itself at a third of the limit for up to
// two minutes; here, before ownHeld, minutes at 0.43–0.83 of TPM), and
// every minute after the first admits at least 0.85 of it (the delay
// itself costs a little: 0.887 the least minute in 60 runs with ownHeld).
func TestLoneModelBatchesAgainstASlidingWindow(t *testing.T) {
	for _, configured := range []bool{false, true} {
		t.Run(fmt.Sprintf("configured=%v", configured), func(t *testing.T) {
			loneBatches(t, configured)
		})
	}
}

// lateTransport delivers each request d after it is sent: the time from a
// request's reservation to its arrival at the server, which a loaded
// machine stretches to tenths of a second.
type lateTransport struct {
	rt http.RoundTripper
	d  time.Duration
}

func (l lateTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	time.Sleep(l.d)
	return l.rt.RoundTrip(r)
}

const sendDelay = 300 * time.Millisecond

// loneBatches runs TestLoneModelBatchesAgainstASlidingWindow's Model,
// its limits configured too when configured.
func loneBatches(t *testing.T, configured bool) {
	const minutes, callers, chunk = 8, 4, 32
	limits := fakeoai.RateLimits{TPM: 60000, RPM: 600, Kind: fakeoai.LimitSlidingWindow}
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: limits, TokenLatency: 5 * time.Millisecond})
		defer s.Close()
		start := s.Now()
		end := start.Add(minutes*time.Minute + 30*time.Second)
		cfg := Config{}
		if configured {
			cfg.TPM, cfg.RPM = limits.TPM, limits.RPM
		}
		cfg.BaseURL, cfg.Models, cfg.Logger = s.URL(), []string{"fake-model"}, quiet()
		cfg.HTTPClient = httpClient(lateTransport{s.Client().Transport, sendDelay})
		m, err := Open(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		item := benchItems(rand.New(rand.NewPCG(33, 2)))
		var wg sync.WaitGroup
		runBatches(t, &wg, m, s, end, callers, func(w, i int) []job.Item {
			items := make([]job.Item, chunk)
			for j := range items {
				items[j] = item(fmt.Sprintf("w%dm%di%d", w, i, j))
			}
			return items
		}, func([]job.Output) {})
		wg.Wait()
		m.rates.mu.Lock()
		sharedAt := m.rates.srv[kindTokens].sharedAt
		m.rates.mu.Unlock()
		if !sharedAt.IsZero() {
			t.Errorf("alone on the limit, the Model read others on it, last %v into the run", sharedAt.Sub(start))
		}
		var answers, limited int64
		for i, mn := range s.Stats().Minutes[1:minutes] {
			answers += mn.Answers
			limited += mn.RateLimited
			used := float64(mn.Tokens) / float64(limits.TPM)
			t.Logf("minute %d: %d requests, %.3f of TPM admitted, %d 429s", i+1, mn.Requests, used, mn.RateLimited)
			if used < 0.85 {
				t.Errorf("minute %d: %.3f of TPM admitted; want at least 0.85", i+1, used)
			}
		}
		if answers == 0 || float64(limited) > 0.01*float64(answers) {
			t.Errorf("after the first minute, %d of %d answers were 429s; want at most 1%%", limited, answers)
		}
	})
}

// Issue 33: sharing a sliding window, a process sends again into the room
// its own sends leave as they leave the window, a span and a transit
// after they reached the server, though its mirror shows no room and its
// pace holds it; not before, and not for a send the limiter refused with
// a 429, which it never counted.
func TestReplaysOwnSendsLeavingASlidingWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		r, b := sharedSlidingWindow(t0)
		r.pace, r.paceLevel, r.paceAt = 100, -1e6, t0 // the pace holds every send
		b.charge(1000, t0, 1)
		b.answered(t0, t0)
		b.charge(1000, t0.Add(time.Millisecond), 2)
		b.answered(t0.Add(time.Millisecond), t0.Add(time.Millisecond))
		r.seq = 2
		take := func() error {
			r.mu.Lock()
			b.level, b.proven = 0, 0 // the window full, as far as answers show
			r.mu.Unlock()
			res, err := r.take(context.Background(), 1000, time.Now())
			if err == nil {
				r.settle(res, 1000)
			}
			return err
		}
		time.Sleep(limitSpan)
		if _, ok := fault.BackoffUntil(take()); !ok {
			t.Fatalf("a span after its sends: sent; want to wait until they leave the window")
		}
		r.limited(reservation{tokens: 1000, at: t0.Add(time.Millisecond), seq: 2}, time.Time{})
		time.Sleep(transit + time.Second)
		if err := take(); err != nil {
			t.Fatalf("its send left the window: %v; want it sent again at once", err)
		}
		if _, ok := fault.BackoffUntil(take()); !ok {
			t.Errorf("a send refused with a 429 left the window: sent again; want no room from it")
		}
	})
}

// A sliding window is read from answers whose reset, the time until the
// newest charge leaves, is longer than a bucket's refill at the limit
// would take for what is used, and whose end moves with the charges; a
// bucket's reset is that refill's time, and a fixed minute's end stays
// put within the minute.
func TestSlidingWindowFromAnswers(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, c := range []struct {
		name string
		// remaining and reset of two answers, the second 3 s after.
		remaining [2]float64
		reset     [2]time.Duration
		want      bool
	}{
		{"bucket", [2]float64{30000, 27000}, [2]time.Duration{30 * time.Second, 33 * time.Second}, false},
		{"sliding window", [2]float64{30000, 27000}, [2]time.Duration{59 * time.Second, 59 * time.Second}, true},
		{"fixed minute", [2]float64{30000, 27000}, [2]time.Duration{50 * time.Second, 47 * time.Second}, false},
	} {
		b := newBucket(60000, t0, true)
		b.observeSliding(c.remaining[0], c.reset[0], at(0))
		b.observeSliding(c.remaining[1], c.reset[1], at(3))
		if got := b.sliding(at(4)); got != c.want {
			t.Errorf("%s: read as a sliding window %v; want %v", c.name, got, c.want)
		}
	}
}

// A 429 asks every request to wait out its pause, and a process that does
// is not limited by its work: its pace does not decay over the pause (as
// over a backoff). The 429s of one burst are one sign of congestion: the
// pace is cut once in cutEvery, not at each. Decayed over the first
// minute's pause and cut at each of its 429s, a process came out at the
// least pace and kept a part of half the others' (TestBenchShare).
func TestA429PausesThePaceAndCutsItOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRates(0, 0, time.Now(), newWaits(time.Hour, quiet()))
		b := newBucket(60000, time.Now(), true)
		b.othersPerSec, b.sharedAt = 500, time.Now()
		r.srv[kindTokens], r.answered, r.typical = b, true, 1000
		r.pace, r.paceAt, r.paceLevel = 300, time.Now(), 1e6
		pace := func() float64 {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.advancePace(time.Now())
			return r.pace
		}
		for range 3 { // a burst's 429s, 100 ms apart
			r.limited(reservation{}, time.Now().Add(40*time.Second))
			time.Sleep(100 * time.Millisecond)
		}
		if p, want := pace(), 300*paceCut429; math.Abs(p-want) > 1e-9 {
			t.Errorf("after three 429s within 200 ms: pace %.1f; want one cut, %.1f", p, want)
		}
		time.Sleep(39 * time.Second)
		if p, want := pace(), 300*paceCut429; math.Abs(p-want) > 1e-9 {
			t.Errorf("39 s into the 429s' 40-second pause, nothing sent: pace %.1f; want it kept at %.1f", p, want)
		}
		time.Sleep(2 * time.Second)
		pace() // past the pause
		time.Sleep(time.Minute)
		if p := pace(); p > 300*paceCut429/2 {
			t.Errorf("a minute past the pause with nothing to send: pace %.1f; want it decayed towards the least", p)
		}
		r.limited(reservation{}, time.Now().Add(time.Second))
		if p := pace(); p >= r.minPace()+1e-9 && p > 300*paceCut429*paceCut429 {
			t.Errorf("a 429 a minute after the last: pace %.1f; want it cut again", p)
		}
	})
}

// A sliding window's reset is its newest charge's, written as the server
// answers. Dated by their sends, two answers whose generations differed
// by as much as their newest charges showed one end; dated by their
// arrival, they do not. Two answers a second apart whose newest charges
// were admitted 15 ms apart, just after the first, show one end dated by
// arrival too, but the second's reset is nearly the whole span: no fixed
// minute's evidence. A fixed minute's end is read.
func TestSlidingWindowAnswersNeverReadAsAFixedMinute(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	d := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	sliding := newBucket(60000, t0, true)
	// Sent at 0 s, answered at 1 s, the newest charge admitted at 0.9 s;
	// sent at 5 s, answered at 12 s, the newest charge at 6.9 s: both
	// sends' ends at 59.9 s, their arrivals' at 60.9 s and 66.9 s.
	sliding.observeWindow(9000, d(59.9), true, at(0), at(1))
	sliding.observeWindow(8000, d(54.9), true, at(5), at(12))
	// Answered at 21 s (newest charge 20.99 s) and 22.02 s (newest 21.005 s).
	sliding.observeWindow(7000, d(59.99), true, at(20.9), at(21))
	sliding.observeWindow(6000, d(58.985), true, at(21.5), at(22.02))
	if left, ok := sliding.windowLeft(at(23)); ok {
		t.Errorf("a sliding window's answers read as a fixed minute with %v left", left)
	}
	fixed := newBucket(60000, t0, true)
	// Sent together, generations of 1 s and 4 s: the minute ends at 50 s.
	fixed.observeWindow(30000, d(49), true, t0, at(1))
	fixed.observeWindow(28000, d(46), true, t0, at(4))
	if left, ok := fixed.windowLeft(at(10)); !ok || left != 40*time.Second {
		t.Errorf("fixed minute: %v left (%v) 10 s in; want 40s", left, ok)
	}
}

// In a fixed minute whose end the answers show, the estimate of others'
// use weighs the server's count against what it counts of this process
// since the minute started, not all it sent within the last 60 s: a
// process that sent the whole limit in every minute saw no one else and
// took nearly every minute's room (TestBenchShare, LiteLLM's minute).
func TestFixedMinuteOthersSeenPastLastMinutesSends(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 50, 0, time.UTC)
	b := newBucket(60000, t0, true)
	b.windowEnd = t0.Add(10 * time.Second) // the minute ends at 00:01:00
	// 50,000 sent in the last 10 s of the minute before.
	for i := range 50 {
		b.charge(1000, t0.Add(time.Duration(i)*200*time.Millisecond), uint64(i+1))
	}
	b.estimate(60000, t0.Add(10*time.Second), false, time.Time{})
	now := t0.Add(20 * time.Second) // 10 s into the new minute
	b.charge(5000, now.Add(-5*time.Second), 51)
	b.estimate(60000-20000, now, false, time.Time{}) // the count: 20,000, of which 5,000 this process's
	if b.lone() {
		t.Errorf("15,000 of the minute's count not this process's: estimate %.0f tokens a second; want others seen", b.othersPerSec)
	}
}

// In a sliding window, a process sends again what its own sends free
// only while its part is at most what its pace passes in a span: kept
// whatever its size, a part taken in the first minute's race stayed apart
// from the others' for the run.
func TestReplayBoundedByThePace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := time.Now()
		r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
		b := newBucket(60000, now, true)
		b.sharedAt, b.slidingAt = now, now
		r.srv[kindTokens], r.answered, r.typical = b, true, 1000
		for i := range 30 { // 30,000 sent over 3 s
			b.charge(1000, now.Add(time.Duration(i)*100*time.Millisecond), uint64(i+1))
		}
		// Unanswered, each is held a span, a transit and arrivalLag.
		time.Sleep(limitSpan + transit + arrivalLag + 1950*time.Millisecond) // the first 20 have left
		r.mu.Lock()
		defer r.mu.Unlock()
		r.pace = 170 // 10,200 a span: the part left, 10,000, is within it
		if ok, _ := r.replayable(1000, time.Now()); !ok {
			t.Errorf("a part of 10,000 paced at 170 tokens a second: its own freed room not sent again")
		}
		r.pace = 160 // 9,600 a span
		if ok, _ := r.replayable(1000, time.Now()); ok {
			t.Errorf("a part of 10,000 paced at 160 tokens a second (9,600 a span): its own freed room sent again")
		}
	})
}

// In a sliding window the pace is a window: a new send goes while the
// process's part of the count and the send fit within what its pace
// passes in a span, whatever the pace's rate level says, and waits past
// it; against a bucket the rate still holds it.
func TestSlidingPaceIsAWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := time.Now()
		for _, sliding := range []bool{true, false} {
			r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
			b := newBucket(60000, now, true)
			b.othersPerSec, b.sharedAt = 500, now
			if sliding {
				b.slidingAt = now
			}
			r.srv[kindTokens], r.answered, r.typical = b, true, 1000
			r.pace, r.paceAt, r.paceLevel = 100, now, -1e6 // 6,000 a span; the rate holds every send
			b.charge(4000, now, 1)
			r.mu.Lock()
			w := r.paceWait(1000, now)
			r.mu.Unlock()
			if sliding && w != 0 {
				t.Errorf("sliding window, a part of 4,000 and a send of 1,000 under a pace of 6,000 a span: waits %v; want sent", w)
			}
			if !sliding && w == 0 {
				t.Errorf("bucket, the pace's level 10^6 under: sent; want a wait")
			}
			if !sliding {
				continue
			}
			r.mu.Lock()
			w = r.paceWait(2500, now)
			r.mu.Unlock()
			if w == 0 {
				t.Errorf("sliding window, a part of 4,000 and a send of 2,500 over a pace of 6,000 a span: sent; want a wait")
			}
		}
	})
}

// In a sliding window the pace grows faster the smaller this process's
// part against the others' use, and slower the larger: a window grows only
// while an answer has shown room, and the larger part, hearing more
// answers, grew more often (TestBenchShare at 10 minutes: one of three
// 20% off the mean in 20 and 24 of 100 runs with equal increases, 3 of 100
// scaled). Elsewhere it grows by paceIncrease whatever its part.
func TestSlidingGrowthByTheOthersPart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := time.Now()
		grown := func(sliding bool, pace, others float64) float64 {
			r := newRates(0, 0, now, newWaits(time.Hour, quiet()))
			b := newBucket(60000, now, true)
			b.othersPerSec, b.sharedAt = others, now
			if sliding {
				b.slidingAt = now
			}
			r.srv[kindTokens], r.answered, r.typical = b, true, 1000
			r.pace, r.paceAt, r.paceHeld = pace, now, 1 // a request waits for the pace
			r.mu.Lock()
			defer r.mu.Unlock()
			r.advancePace(now.Add(time.Second))
			return (r.pace - pace) / b.perSec // of the limit, in a second
		}
		for _, c := range []struct {
			name         string
			sliding      bool
			pace, others float64
			want         float64
		}{
			{"a third of a sliding window", true, 300, 600, slidingIncrease},
			{"a tenth of a sliding window", true, 100, 900, slidingIncrease * 4.5},
			{"a twentieth of a sliding window", true, 50, 950, slidingIncrease * slidingSpread},
			{"a half of a sliding window", true, 500, 500, slidingIncrease / 2},
			{"nearly all of a sliding window", true, 900, 50, slidingIncrease / slidingSpread},
			{"a tenth of a bucket", false, 100, 900, paceIncrease},
			{"a half of a bucket", false, 500, 500, paceIncrease},
		} {
			if got := grown(c.sliding, c.pace, c.others); math.Abs(got-c.want) > 1e-9 {
				t.Errorf("%s: the pace grew by %.5f of the limit in a second; want %.5f", c.name, got, c.want)
			}
		}
	})
}

// A batch handed back (a wait past its deadline) in a shared sliding
// window comes back when this process's own next send leaves the window,
// as a request that waits on does, not at the end of a longer wait (here
// the requests' limit's): its subscriber pauses until then, and the room
// its send frees, left unspent, is the others' to take, and its part with
// it.
func TestBackoffEndsAtOwnRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		r, b := sharedSlidingWindow(t0)
		reqs := newBucket(600, t0, true)
		r.srv[kindRequests] = reqs
		r.pace, r.paceAt = 1000, t0 // its window holds no send back
		b.charge(1000, t0, 1)
		b.answered(t0, t0)
		r.seq = 1
		time.Sleep(limitSpan)
		r.mu.Lock()
		b.level, b.proven = 0, 0                                    // the tokens' window full, as far as answers show
		reqs.level, reqs.proven, reqs.last = -300, -300, time.Now() // the requests' limit: half a minute's wait
		release := b.own[0].heldUntil(time.Now())
		r.mu.Unlock()
		_, err := r.take(context.Background(), 1000, time.Now())
		until, ok := fault.BackoffUntil(err)
		if !ok {
			t.Fatalf("take past its deadline: %v; want a backoff", err)
		}
		if until.After(release) {
			t.Errorf("handed back until %v from now, its own send leaving the window %v from now; want no later than that",
				time.Until(until), time.Until(release))
		}
	})
}

// sharedSlidingWindow is a process's rates at t0 on a server's tokens
// limit of 60,000 a minute that answers have shown to be a sliding window
// with others on it (600 tokens a second), its typical request 1,000
// tokens.
func sharedSlidingWindow(t0 time.Time) (*rates, *bucket) {
	r := newRates(0, 0, t0, newWaits(time.Hour, quiet()))
	b := newBucket(60000, t0, true)
	b.othersPerSec, b.sharedAt, b.slidingAt = 600, t0, t0
	r.srv[kindTokens], r.answered, r.typical = b, true, 1000
	return r, b
}
