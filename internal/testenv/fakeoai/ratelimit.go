package fakeoai

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// LimitKind says how the rate limits count: each kind follows one
// provider's documented limiter (doc.go, "Rate limiters", has the sources).
type LimitKind string

const (
	// LimitBucket is OpenAI's: a bucket refilled continuously, the cost
	// (prompt + max_tokens × n) taken at arrival; x-ratelimit-reset-* is the
	// time until the bucket is full again. The zero Kind.
	LimitBucket LimitKind = "bucket"
	// LimitAnthropic is Anthropic's bucket, "continuously replenished up to
	// your maximum limit", with its anthropic-ratelimit-* headers (resets as
	// RFC 3339 times), retry-after in seconds and its error body.
	LimitAnthropic LimitKind = "anthropic"
	// LimitSlidingWindow is a strict sliding 60 s window: a request is
	// admitted when what was charged in the last 60 s plus its cost is
	// within the limit, so use frees up only as the requests that took it
	// turn 60 s old: lumps, not a flow. OpenAI's headers.
	LimitSlidingWindow LimitKind = "sliding-window"
	// LimitFixedWindow is LiteLLM's per-minute counter (a Redis key per
	// calendar minute): requests counted at arrival, tokens counted from
	// usage when answered, a request admitted while the minute's count is
	// below the limit, everything whole again at the minute.
	LimitFixedWindow LimitKind = "fixed-window"
	// LimitAzure is Azure OpenAI's: requests evaluated over short windows
	// (Window, 1 s or 10 s) of RPM × Window / 1m each, tokens charged at
	// arrival as an estimate (prompt + max_tokens × max(n, best_of))
	// against a count reset every minute. Azure's x-ratelimit-remaining-*
	// (requests of the short window, tokens of the minute), retry-after-ms
	// and Retry-After.
	LimitAzure LimitKind = "azure"
)

func (k LimitKind) valid() bool {
	switch k {
	case "", LimitBucket, LimitAnthropic, LimitSlidingWindow, LimitFixedWindow, LimitAzure:
		return true
	}
	return false
}

// meter is one limit (requests or tokens) of one kind, on the server's clock.
type meter interface {
	// limit is the figure a limit header advertises.
	limit() int
	// tooLarge says that no wait would ever admit cost.
	tooLarge(cost float64) bool
	// wait is the server time until cost fits; 0 when it fits now.
	wait(cost float64, now time.Time) time.Duration
	take(cost float64, now time.Time)
	remaining(now time.Time) float64
	// reset is the server time until the limit is whole again.
	reset(now time.Time) time.Duration
}

// bucket holds capacity units, refilled continuously at lim per minute, so
// that its reset is the time until it is full again (12ms for one request
// of 5,000 RPM, as OpenAI answers).
type bucket struct {
	lim      int
	capacity float64
	perNano  float64 // refill per nanosecond of server time
	avail    float64
	last     time.Time
}

func newBucket(limit int, burst time.Duration, now time.Time) *bucket {
	if burst <= 0 {
		burst = time.Minute
	}
	c := float64(limit) * float64(burst) / float64(time.Minute)
	return &bucket{lim: limit, capacity: c, perNano: float64(limit) / float64(time.Minute), avail: c, last: now}
}

func (b *bucket) refill(now time.Time) {
	if dt := now.Sub(b.last); dt > 0 {
		b.avail = math.Min(b.capacity, b.avail+float64(dt)*b.perNano)
		b.last = now
	}
}

func (b *bucket) limit() int                 { return b.lim }
func (b *bucket) tooLarge(cost float64) bool { return cost > b.capacity }

func (b *bucket) wait(cost float64, now time.Time) time.Duration {
	b.refill(now)
	if b.avail >= cost {
		return 0
	}
	return time.Duration(math.Ceil((cost - b.avail) / b.perNano))
}

func (b *bucket) take(cost float64, now time.Time) { b.refill(now); b.avail -= cost }

func (b *bucket) remaining(now time.Time) float64 { b.refill(now); return b.avail }

func (b *bucket) reset(now time.Time) time.Duration {
	b.refill(now)
	return time.Duration(math.Ceil((b.capacity - b.avail) / b.perNano))
}

// sliding is a strict sliding window: the sum of what was taken in the
// last span.
type sliding struct {
	lim     int
	span    time.Duration
	entries []charge // oldest first
	used    float64
}

type charge struct {
	at   time.Time
	cost float64
}

func (s *sliding) prune(now time.Time) {
	i := 0
	for i < len(s.entries) && !s.entries[i].at.Add(s.span).After(now) {
		s.used -= s.entries[i].cost
		i++
	}
	s.entries = s.entries[i:]
	if len(s.entries) == 0 {
		s.used = 0 // no drift from the float sums
	}
}

func (s *sliding) limit() int                 { return s.lim }
func (s *sliding) tooLarge(cost float64) bool { return cost > float64(s.lim) }

// wait is until enough of the oldest charges have left the window.
func (s *sliding) wait(cost float64, now time.Time) time.Duration {
	s.prune(now)
	over := s.used + cost - float64(s.lim)
	if over <= 0 {
		return 0
	}
	for _, e := range s.entries {
		over -= e.cost
		if over <= 0 {
			return e.at.Add(s.span).Sub(now)
		}
	}
	return s.span // not reached unless tooLarge
}

func (s *sliding) take(cost float64, now time.Time) {
	s.prune(now)
	s.entries = append(s.entries, charge{now, cost})
	s.used += cost
}

func (s *sliding) remaining(now time.Time) float64 { s.prune(now); return float64(s.lim) - s.used }

// reset is until the newest charge leaves the window.
func (s *sliding) reset(now time.Time) time.Duration {
	s.prune(now)
	if len(s.entries) == 0 {
		return 0
	}
	return s.entries[len(s.entries)-1].at.Add(s.span).Sub(now)
}

// fixed counts per window of span aligned to the clock (a calendar minute
// for span 1m), from zero at each window's start. Strict admits what fits
// within the limit; otherwise, as LiteLLM's `current >= limit` check,
// whatever arrives while the count is below it.
type fixed struct {
	lim    int
	span   time.Duration
	strict bool
	start  time.Time
	used   float64
}

func (f *fixed) roll(now time.Time) {
	if !now.Before(f.start.Add(f.span)) {
		f.start, f.used = now.Truncate(f.span), 0
	}
}

func (f *fixed) limit() int { return f.lim }

func (f *fixed) tooLarge(cost float64) bool { return f.strict && cost > float64(f.lim) }

func (f *fixed) fits(cost float64) bool {
	if f.strict {
		return f.used+cost <= float64(f.lim)
	}
	return f.used < float64(f.lim)
}

func (f *fixed) wait(cost float64, now time.Time) time.Duration {
	f.roll(now)
	if f.fits(cost) {
		return 0
	}
	return f.start.Add(f.span).Sub(now)
}

func (f *fixed) take(cost float64, now time.Time) { f.roll(now); f.used += cost }

func (f *fixed) remaining(now time.Time) float64 { f.roll(now); return float64(f.lim) - f.used }

func (f *fixed) reset(now time.Time) time.Duration {
	f.roll(now)
	if f.used == 0 {
		return 0
	}
	return f.start.Add(f.span).Sub(now)
}

// both is Azure's requests limit: a short window's share of RPM and the
// minute's RPM. x-ratelimit-remaining-requests is the short window's
// count (doc.go, "Rate limiters").
type both struct{ short, minute *fixed }

func (b both) limit() int                 { return b.minute.lim }
func (b both) tooLarge(cost float64) bool { return b.short.tooLarge(cost) || b.minute.tooLarge(cost) }
func (b both) wait(cost float64, now time.Time) time.Duration {
	return max(b.short.wait(cost, now), b.minute.wait(cost, now))
}
func (b both) take(cost float64, now time.Time)  { b.short.take(cost, now); b.minute.take(cost, now) }
func (b both) remaining(now time.Time) float64   { return b.short.remaining(now) }
func (b both) reset(now time.Time) time.Duration { return b.minute.reset(now) }

// limiter holds the requests and tokens limits; a nil meter enforces
// nothing and sends no headers.
type limiter struct {
	cfg       RateLimits
	kind      LimitKind
	req, tok  meter
	exhausted bool // insufficient_quota mode
}

func newLimiter(cfg RateLimits, now time.Time) limiter {
	l := limiter{cfg: cfg, kind: cfg.Kind}
	if l.kind == "" {
		l.kind = LimitBucket
	}
	mk := func(limit int, requests bool) meter {
		if limit <= 0 {
			return nil
		}
		switch l.kind {
		case LimitSlidingWindow:
			return &sliding{lim: limit, span: time.Minute}
		case LimitFixedWindow:
			return &fixed{lim: limit, span: time.Minute, start: now.Truncate(time.Minute)}
		case LimitAzure:
			m := &fixed{lim: limit, span: time.Minute, strict: true, start: now.Truncate(time.Minute)}
			if !requests {
				return m
			}
			w := cfg.window()
			share := max(1, int(math.Floor(float64(limit)*float64(w)/float64(time.Minute))))
			return both{short: &fixed{lim: share, span: w, strict: true, start: now.Truncate(w)}, minute: m}
		default:
			return newBucket(limit, cfg.Burst, now)
		}
	}
	l.req, l.tok = mk(cfg.RPM, true), mk(cfg.TPM, false)
	return l
}

// tokensFromUsage says that tokens are counted when answered, from usage,
// not at arrival.
func (l *limiter) tokensFromUsage() bool { return l.kind == LimitFixedWindow }

// cost is what a request is charged at arrival: Azure's estimate counts
// best_of, the others n.
func (l *limiter) cost(wk *work) int {
	if l.kind == LimitAzure && wk.bestOf > wk.n {
		return wk.prompt + wk.maxTokens*wk.bestOf*len(wk.inputs)
	}
	return wk.cost()
}

// replace swaps in new limits, keeping what was used of the old ones
// (for the windows, as if all of it was used now).
func (l *limiter) replace(cfg RateLimits, now time.Time) {
	next := newLimiter(cfg, now)
	next.exhausted = l.exhausted
	for _, p := range [][2]meter{{l.req, next.req}, {l.tok, next.tok}} {
		old, nm := p[0], p[1]
		if old == nil || nm == nil {
			continue
		}
		ob, okO := old.(*bucket)
		nb, okN := nm.(*bucket)
		if okO && okN {
			ob.refill(now)
			nb.avail = math.Max(0, nb.capacity-(ob.capacity-ob.avail))
			continue
		}
		if used := float64(old.limit()) - old.remaining(now); used > 0 {
			nm.take(used, now)
		}
	}
	*l = next
}

// rejection is a 429 for a rate limit, or for a request too large for a
// limit ever to admit (wait 0).
type rejection struct {
	kind      string // "requests" or "tokens", OpenAI's error.type
	limit     int
	used      int
	requested int
	wait      time.Duration // server time; 0 for too large
}

// admit takes one request and cost tokens, or says why not.
func (l *limiter) admit(cost int, now time.Time) *rejection {
	c := float64(cost)
	if l.tokensFromUsage() {
		c = 0 // counted when answered; admitted while below the limit
	}
	used := func(m meter) int { return m.limit() - int(math.Floor(m.remaining(now))) }
	var rej *rejection
	if l.tok != nil && l.tok.tooLarge(c) {
		rej = &rejection{kind: "tokens", limit: l.tok.limit(), used: used(l.tok), requested: cost}
	} else {
		var wr, wt time.Duration
		if l.req != nil {
			wr = l.req.wait(1, now)
		}
		if l.tok != nil {
			wt = l.tok.wait(c, now)
		}
		switch {
		case wt > 0 && wt >= wr:
			rej = &rejection{kind: "tokens", limit: l.tok.limit(), used: used(l.tok), requested: cost, wait: wt}
		case wr > 0:
			rej = &rejection{kind: "requests", limit: l.req.limit(), used: used(l.req), requested: 1, wait: wr}
		}
	}
	if rej != nil {
		if !l.cfg.FreeRejections && l.req != nil && l.req.remaining(now) >= 1 {
			l.req.take(1, now)
		}
		return rej
	}
	if l.req != nil {
		l.req.take(1, now)
	}
	if l.tok != nil && c > 0 {
		l.tok.take(c, now)
	}
	return nil
}

// answered counts an answer's usage where tokens are counted from it.
func (l *limiter) answered(tokens int, now time.Time) {
	if l.tok != nil && l.tokensFromUsage() {
		l.tok.take(float64(tokens), now)
	}
}

// headers sets the limit headers of the kind, resets in real time.
func (l *limiter) headers(h http.Header, now time.Time, c clock) {
	for _, p := range []struct {
		name string
		m    meter
	}{{"requests", l.req}, {"tokens", l.tok}} {
		if p.m == nil {
			continue
		}
		remaining := strconv.Itoa(max(0, int(math.Floor(p.m.remaining(now)))))
		switch l.kind {
		case LimitAnthropic:
			pre := "anthropic-ratelimit-" + p.name + "-"
			h.Set(pre+"limit", strconv.Itoa(p.m.limit()))
			h.Set(pre+"remaining", remaining)
			h.Set(pre+"reset", wireTime(c.real(p.m.reset(now))))
		case LimitAzure:
			// Only the remaining counts: Azure documents no limit or reset
			// header.
			h.Set("x-ratelimit-remaining-"+p.name, remaining)
		default:
			h.Set("x-ratelimit-limit-"+p.name, strconv.Itoa(p.m.limit()))
			h.Set("x-ratelimit-remaining-"+p.name, remaining)
			h.Set("x-ratelimit-reset-"+p.name, wireDuration(c.real(p.m.reset(now))))
		}
	}
}

// wireTime is the real time d from now in RFC 3339, rounded up to the
// second so that a client never comes back early.
func wireTime(d time.Duration) string {
	t := time.Now().Add(d)
	if r := t.Truncate(time.Second); r.Before(t) {
		t = r.Add(time.Second)
	}
	return t.UTC().Format(time.RFC3339)
}

// write answers the 429 of rej as the kind's provider does: its retry
// headers (none for too large) and its body.
func (l *limiter) write(w http.ResponseWriter, rej *rejection, wk *work, now time.Time, c clock) {
	rd := c.real(rej.wait)
	secs := int64(ceilTo(rd, time.Second) / time.Second)
	h := w.Header()
	switch l.kind {
	case LimitAnthropic:
		if rej.wait > 0 {
			h.Set("retry-after", strconv.FormatInt(secs, 10))
		}
		unit := "requests per minute"
		if rej.kind == "tokens" {
			unit = "tokens per minute"
		}
		writeJSON(w, http.StatusTooManyRequests, anthropicError{Type: "error", Error: anthropicErrorBody{Type: "rate_limit_error",
			Message: fmt.Sprintf("This request would exceed the rate limit for your organization (org-fakeoai) of %d %s. "+
				"For details, refer to: https://docs.claude.com/en/api/rate-limits.", rej.limit, unit)}})
	case LimitFixedWindow:
		if rej.wait > 0 {
			h.Set("retry-after", strconv.FormatFloat(ceilTo(rd, time.Millisecond).Seconds(), 'f', -1, 64))
		}
		var curR, limR, curT, limT int
		if l.req != nil {
			curR, limR = l.req.limit()-int(l.req.remaining(now)), l.req.limit()
		}
		if l.tok != nil {
			curT, limT = l.tok.limit()-int(l.tok.remaining(now)), l.tok.limit()
		}
		writeOpenAI(w, http.StatusTooManyRequests, fmt.Sprintf("LiteLLM Rate Limit Handler for rate limit type = key. Crossed TPM, RPM Limit. "+
			"current rpm: %d, rpm limit: %d, current tpm: %d, tpm limit: %d", curR, limR, curT, limT), "None", "None", "429")
	case LimitAzure:
		if rej.wait > 0 {
			h.Set("retry-after-ms", strconv.FormatInt(int64(ceilTo(rd, time.Millisecond)/time.Millisecond), 10))
			h.Set("Retry-After", strconv.FormatInt(secs, 10))
		}
		what := "call rate limit"
		if rej.kind == "tokens" {
			what = "token rate limit"
		}
		writeJSON(w, http.StatusTooManyRequests, map[string]map[string]string{"error": {"code": "429",
			"message": fmt.Sprintf("Requests to the %s Operation under Azure OpenAI API version 2024-10-21 have exceeded %s of your current "+
				"OpenAI S0 pricing tier. Please retry after %d seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further "+
				"increase the default rate limit.", azureOperation(wk.path), what, secs)}})
	default:
		if rej.wait > 0 {
			setRetryAfter(h, rej.wait, c)
		}
		writeOpenAI(w, http.StatusTooManyRequests, rej.message(wk.model, c), rej.kind, "", "rate_limit_exceeded")
	}
}

// azureOperation names the operation as Azure's 429 message does.
func azureOperation(path string) string {
	switch path {
	case "/v1/chat/completions":
		return "ChatCompletions_Create"
	case "/v1/completions":
		return "Completions_Create"
	}
	return "Embeddings_Create"
}

// anthropicError is Anthropic's error body: {"type":"error","error":{...}}.
type anthropicError struct {
	Type  string             `json:"type"`
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// message is OpenAI's text for a rate-limit 429.
func (r *rejection) message(model string, c clock) string {
	unit := "tokens per min (TPM)"
	if r.kind == "requests" {
		unit = "requests per min (RPM)"
	}
	if r.wait == 0 {
		return fmt.Sprintf("Request too large for %s in organization org-fakeoai on %s: Limit %d, Requested %d. "+
			"The input or output tokens must be reduced in order to run successfully.", model, unit, r.limit, r.requested)
	}
	return fmt.Sprintf("Rate limit reached for %s in organization org-fakeoai on %s: Limit %d, Used %d, Requested %d. "+
		"Please try again in %s. Visit https://platform.openai.com/account/rate-limits to learn more.",
		model, unit, r.limit, r.used, r.requested, wireDuration(c.real(r.wait)))
}

// setRetryAfter sets the headers the SDKs read, retry-after-ms first, for a
// wait of server time d.
func setRetryAfter(h http.Header, d time.Duration, c clock) {
	rd := c.real(d)
	h.Set("retry-after-ms", strconv.FormatInt(int64(ceilTo(rd, time.Millisecond)/time.Millisecond), 10))
	h.Set("Retry-After", strconv.FormatInt(int64(ceilTo(rd, time.Second)/time.Second), 10))
}
