package fakeoai

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// bucket is one rate limit: capacity units, refilled continuously at limit
// per minute, so that x-ratelimit-reset is the time until it is full again
// (12ms for one request of 5,000 RPM, as OpenAI answers).
type bucket struct {
	limit    int
	capacity float64
	perNano  float64 // refill per nanosecond of server time
	avail    float64
	last     time.Time
}

func newBucket(limit int, burst time.Duration, now time.Time) *bucket {
	if limit <= 0 {
		return nil
	}
	if burst <= 0 {
		burst = time.Minute
	}
	c := float64(limit) * float64(burst) / float64(time.Minute)
	return &bucket{limit: limit, capacity: c, perNano: float64(limit) / float64(time.Minute), avail: c, last: now}
}

func (b *bucket) refill(now time.Time) {
	if dt := now.Sub(b.last); dt > 0 {
		b.avail = math.Min(b.capacity, b.avail+float64(dt)*b.perNano)
		b.last = now
	}
}

// wait is the server time until cost is available.
func (b *bucket) wait(cost float64) time.Duration {
	if b.avail >= cost {
		return 0
	}
	return time.Duration(math.Ceil((cost - b.avail) / b.perNano))
}

func (b *bucket) remaining() int { return int(math.Floor(b.avail)) }

func (b *bucket) reset() time.Duration {
	return time.Duration(math.Ceil((b.capacity - b.avail) / b.perNano))
}

// limiter holds the RPM and TPM buckets; a nil bucket enforces nothing.
type limiter struct {
	cfg       RateLimits
	req, tok  *bucket
	exhausted bool // insufficient_quota mode
}

func newLimiter(cfg RateLimits, now time.Time) limiter {
	return limiter{cfg: cfg, req: newBucket(cfg.RPM, cfg.Burst, now), tok: newBucket(cfg.TPM, cfg.Burst, now)}
}

// replace swaps in new limits, keeping what was used of the old ones.
func (l *limiter) replace(cfg RateLimits, now time.Time) {
	next := newLimiter(cfg, now)
	next.exhausted = l.exhausted
	for _, p := range [][2]*bucket{{l.req, next.req}, {l.tok, next.tok}} {
		old, nb := p[0], p[1]
		if old == nil || nb == nil {
			continue
		}
		old.refill(now)
		nb.avail = math.Max(0, nb.capacity-(old.capacity-old.avail))
	}
	*l = next
}

// rejection is a 429 rate_limit_exceeded, or a request too large for a
// bucket ever to admit (wait 0).
type rejection struct {
	kind      string // "requests" or "tokens", OpenAI's error.type
	limit     int
	used      int
	requested int
	wait      time.Duration // server time; 0 for too large
}

// admit takes one request and cost tokens, or says why not.
func (l *limiter) admit(cost int, now time.Time) *rejection {
	for _, b := range []*bucket{l.req, l.tok} {
		if b != nil {
			b.refill(now)
		}
	}
	var rej *rejection
	if l.tok != nil && float64(cost) > l.tok.capacity {
		rej = &rejection{kind: "tokens", limit: l.tok.limit, used: l.tok.limit - l.tok.remaining(), requested: cost}
	} else {
		var wr, wt time.Duration
		if l.req != nil {
			wr = l.req.wait(1)
		}
		if l.tok != nil {
			wt = l.tok.wait(float64(cost))
		}
		switch {
		case wt > 0 && wt >= wr:
			rej = &rejection{kind: "tokens", limit: l.tok.limit, used: l.tok.limit - l.tok.remaining(), requested: cost, wait: wt}
		case wr > 0:
			rej = &rejection{kind: "requests", limit: l.req.limit, used: l.req.limit - l.req.remaining(), requested: 1, wait: wr}
		}
	}
	if rej != nil {
		if !l.cfg.FreeRejections && l.req != nil && l.req.avail >= 1 {
			l.req.avail--
		}
		return rej
	}
	if l.req != nil {
		l.req.avail--
	}
	if l.tok != nil {
		l.tok.avail -= float64(cost)
	}
	return nil
}

// headers sets the x-ratelimit headers of the limits in force, resets in
// real time.
func (l *limiter) headers(h http.Header, now time.Time, c clock) {
	for _, p := range []struct {
		name string
		b    *bucket
	}{{"requests", l.req}, {"tokens", l.tok}} {
		if p.b == nil {
			continue
		}
		p.b.refill(now)
		h.Set("x-ratelimit-limit-"+p.name, strconv.Itoa(p.b.limit))
		h.Set("x-ratelimit-remaining-"+p.name, strconv.Itoa(max(0, p.b.remaining())))
		h.Set("x-ratelimit-reset-"+p.name, wireDuration(c.real(p.b.reset())))
	}
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
