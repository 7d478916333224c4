package api

import (
	"container/list"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Rate limits: every request to /v1/jobs routes is charged to its client's
// token bucket (golang.org/x/time/rate) and, when configured, to one global
// bucket. A request that finds a bucket empty is answered 429 rate_limited
// with Retry-After before its body is read, so nothing of it is enqueued.
//
// The client is the caller's API key when auth is on (requests with a wrong
// key are charged to their source address instead, so guessing keys is
// limited too), else its source address: IPv4 as is, IPv6 by its prefix of
// IPv6ClientPrefix bits (a /56 by default), what one site is given, so that a
// client cannot mint fresh buckets from its own prefix (see
// Config.IPv6ClientPrefix). See ClientAddr for how the source address is
// read behind a load balancer. The same client has a share of the bodies in
// flight (inflight.go).
//
// Buckets are kept in a map bounded by RateLimitClients, least recently used
// first out, and dropped once unused long enough to be full again: dropping a
// full bucket loses nothing, as a new one starts full. A flood of distinct
// addresses therefore costs at most RateLimitClients entries; evicting a
// client still active only hands it a fresh burst, which the global limit
// bounds.

// limiter is the publisher's rate limiting; nil when no limit is set.
type limiter struct {
	clients *clientBuckets // nil without a per-client limit
	global  *rate.Limiter  // nil without a global limit
	m       *metrics
}

func newLimiter(c *Config, m *metrics) *limiter {
	if c.RateLimit == 0 && c.GlobalRateLimit == 0 {
		return nil
	}
	l := &limiter{m: m}
	if c.RateLimit > 0 {
		l.clients = newClientBuckets(rate.Limit(c.RateLimit), c.RateBurst, c.RateLimitClients)
	}
	if c.GlobalRateLimit > 0 {
		l.global = rate.NewLimiter(rate.Limit(c.GlobalRateLimit), c.GlobalRateBurst)
	}
	return l
}

// DefaultBurst is twice the rate, at least 1: a client may send two seconds'
// worth at once after a quiet spell.
func DefaultBurst(r float64) int {
	return max(1, int(math.Ceil(2*r)))
}

// Scopes of vramq_publisher_rate_limited_total.
const (
	scopeClient = "client"
	scopeGlobal = "global"
)

// allow charges one request of key at now. When a bucket is empty it charges
// nothing and returns the scope that refused and how long until a token.
func (l *limiter) allow(key string, now time.Time) (scope string, wait time.Duration) {
	var cr *rate.Reservation
	if l.clients != nil {
		var kept int
		var evicted bool
		cr, kept, evicted = l.clients.reserve(key, now)
		l.m.rateClients.Set(float64(kept))
		if evicted {
			l.m.rateEvictions.Inc()
		}
		if d := cr.DelayFrom(now); d > 0 {
			cr.CancelAt(now)
			return scopeClient, d
		}
	}
	if l.global != nil {
		gr := l.global.ReserveN(now, 1)
		if d := gr.DelayFrom(now); d > 0 {
			gr.CancelAt(now)
			if cr != nil {
				cr.CancelAt(now) // refused for everyone: the client keeps its token
			}
			return scopeGlobal, d
		}
	}
	return "", 0
}

// refuse answers 429 if key's request at now is over a limit, and reports
// whether it did.
func (g *Gate) refuse(w http.ResponseWriter, r *http.Request, key string) bool {
	scope, wait := g.rates.allow(key, g.now())
	if scope == "" {
		return false
	}
	g.m.rateLimited.WithLabelValues(scope).Inc()
	// Whole seconds (RFC 9110), rounded up so that a client that waits as
	// told finds a token.
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(wait.Seconds())))))
	Info(r).Code = CodeRateLimited
	msg := "too many requests from this client; retry after the time in Retry-After"
	if scope == scopeGlobal {
		msg = "the publisher is taking too many requests; retry after the time in Retry-After"
	}
	WriteError(w, Err(http.StatusTooManyRequests, CodeRateLimited, "%s", msg))
	return true
}

// RateLimit charges each request to its client (ClientKey).
func (g *Gate) RateLimit(next http.Handler) http.Handler {
	if g.rates == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.refuse(w, r, g.ClientKey(r)) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ClientKey names r's client: its scope (the API key auth found, or the caller
// identity API Gateway gave), or the source address.
func (g *Gate) ClientKey(r *http.Request) string {
	if s := Scope(r); s != "" {
		return "key:" + s
	}
	return g.addrKey(r)
}

// addrKey names the client of r's source address: an IPv6 address by its
// prefix of IPv6ClientPrefix bits.
func (g *Gate) addrKey(r *http.Request) string {
	a := ClientAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), g.cfg.TrustedProxies)
	if !a.IsValid() {
		return "addr:unknown"
	}
	if a.Is6() {
		pfx, _ := a.Prefix(g.cfg.IPv6ClientPrefix)
		return "addr:" + pfx.String()
	}
	return "addr:" + a.String()
}

// ClientAddr is the address a request came from. It is the connection's peer
// (RemoteAddr; under Lambda, the sourceIp API Gateway or the function URL saw
// the connection come from), unless that peer is a trusted proxy: then
// X-Forwarded-For is read from the right, skipping trusted proxies, and the
// first address that is not one is the client. An Application Load Balancer
// appends the address it took the connection from to X-Forwarded-For, so the
// rightmost entries are the ones trusted hops wrote; anything further left
// was sent by the client and can be forged, which is why reading stops at the
// first untrusted address. With no trusted proxies X-Forwarded-For is never
// read. An entry that is not an address ends the walk at the last trusted
// hop.
func ClientAddr(remoteAddr string, xff []string, trusted []netip.Prefix) netip.Addr {
	peer := parseAddr(remoteAddr)
	if !peer.IsValid() || !inAny(peer, trusted) {
		return peer
	}
	var hops []string
	for _, h := range xff {
		hops = append(hops, strings.Split(h, ",")...)
	}
	addr := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseAddr(strings.TrimSpace(hops[i]))
		if !a.IsValid() {
			return addr
		}
		addr = a
		if !inAny(a, trusted) {
			return a
		}
	}
	return addr // every hop trusted: the leftmost is the origin
}

// parseAddr reads "ip", "ip:port" or "[ipv6]:port"; IPv4-mapped IPv6
// addresses become IPv4 so that one client has one bucket.
func parseAddr(s string) netip.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap()
	}
	return netip.Addr{}
}

func inAny(a netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientBuckets is a bounded map of token buckets, least recently used
// first out. Safe for concurrent use.
type clientBuckets struct {
	mu    sync.Mutex
	limit rate.Limit
	burst int
	max   int
	idle  time.Duration // unused this long, a bucket is full again
	lru   *list.List    // of *bucket, most recently used at the front
	byKey map[string]*list.Element
}

type bucket struct {
	key  string
	lim  *rate.Limiter
	last time.Time
}

func newClientBuckets(limit rate.Limit, burst, max int) *clientBuckets {
	idle := time.Duration(float64(burst) / float64(limit) * float64(time.Second))
	return &clientBuckets{limit: limit, burst: burst, max: max, idle: idle, lru: list.New(), byKey: map[string]*list.Element{}}
}

// reserve takes a token from key's bucket at now, making the bucket if
// needed; the reservation says how long the token is still to come. It also
// returns the buckets kept and whether a bucket still in use was dropped to
// make room.
func (c *clientBuckets) reserve(key string, now time.Time) (r *rate.Reservation, kept int, evicted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for e := c.lru.Back(); e != nil && now.Sub(e.Value.(*bucket).last) >= c.idle; e = c.lru.Back() {
		c.remove(e)
	}
	e, ok := c.byKey[key]
	if !ok {
		if c.lru.Len() >= c.max {
			c.remove(c.lru.Back())
			evicted = true
		}
		e = c.lru.PushFront(&bucket{key: key, lim: rate.NewLimiter(c.limit, c.burst)})
		c.byKey[key] = e
	}
	c.lru.MoveToFront(e)
	b := e.Value.(*bucket)
	b.last = now
	return b.lim.ReserveN(now, 1), c.lru.Len(), evicted
}

func (c *clientBuckets) remove(e *list.Element) {
	delete(c.byKey, e.Value.(*bucket).key)
	c.lru.Remove(e)
}
