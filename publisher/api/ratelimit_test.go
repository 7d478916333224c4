package api

import (
	"fmt"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestClientAddr(t *testing.T) {
	vpc := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("fd00::/8")}
	for _, tc := range []struct {
		name    string
		remote  string
		xff     []string
		trusted []netip.Prefix
		want    string
	}{
		{"direct client", "203.0.113.7:51000", nil, nil, "203.0.113.7"},
		{"forwarded-for ignored without trusted proxies", "203.0.113.7:51000", []string{"198.51.100.1"}, nil, "203.0.113.7"},
		{"forwarded-for ignored from an untrusted peer", "203.0.113.7:51000", []string{"198.51.100.1"}, vpc, "203.0.113.7"},
		{"behind the load balancer", "10.0.3.4:40000", []string{"198.51.100.1"}, vpc, "198.51.100.1"},
		// The client sent its own X-Forwarded-For; the balancer appended the
		// real address: the forged entry on the left is never reached.
		{"forged entry on the left", "10.0.3.4:40000", []string{"192.0.2.66, 198.51.100.1"}, vpc, "198.51.100.1"},
		{"two trusted hops", "10.0.3.4:40000", []string{"198.51.100.1, 10.0.9.9"}, vpc, "198.51.100.1"},
		{"headers joined in order", "10.0.3.4:40000", []string{"192.0.2.66", "198.51.100.1"}, vpc, "198.51.100.1"},
		{"every hop trusted", "10.0.3.4:40000", []string{"10.0.1.1, 10.0.2.2"}, vpc, "10.0.1.1"},
		{"no header from a trusted peer", "10.0.3.4:40000", nil, vpc, "10.0.3.4"},
		{"garbage stops the walk", "10.0.3.4:40000", []string{"198.51.100.1, not-an-ip"}, vpc, "10.0.3.4"},
		{"entry with a port", "10.0.3.4:40000", []string{"198.51.100.1:4711"}, vpc, "198.51.100.1"},
		{"Lambda source IP", "198.51.100.23:0", nil, nil, "198.51.100.23"},
		{"IPv4-mapped IPv6", "[::ffff:203.0.113.7]:51000", nil, nil, "203.0.113.7"},
		{"IPv6 behind the balancer", "[fd00::5]:40000", []string{"2001:db8:1:2:3:4:5:6"}, vpc, "2001:db8:1:2:3:4:5:6"},
		{"no peer address", "", nil, vpc, "invalid IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ClientAddr(tc.remote, tc.xff, tc.trusted); got.String() != tc.want {
				t.Errorf("ClientAddr(%q, %q) = %s, want %s", tc.remote, tc.xff, got, tc.want)
			}
		})
	}
}

// An IPv6 client is its prefix of IPv6ClientPrefix bits, a /56 unless set;
// an IPv4 client is its address.
func TestAddrKey(t *testing.T) {
	key := func(prefix int, remote string) string {
		t.Helper()
		c := testConfig(Config{})
		if prefix != 0 {
			c.IPv6ClientPrefix = prefix
		}
		p, err := NewGate(c)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		return p.addrKey(r)
	}
	for _, tc := range []struct {
		name   string
		prefix int // 0: the default
		a, b   string
		same   bool
	}{
		{"two /64s of one /56, by default", 0, "[2001:db8:1:200::1]:1", "[2001:db8:1:2ff:ffff::9]:2", true},
		{"two /56s, by default", 0, "[2001:db8:1:200::1]:1", "[2001:db8:1:300::1]:1", false},
		{"two /56s of one /48, by /48", 48, "[2001:db8:1:200::1]:1", "[2001:db8:1:ff00::1]:1", true},
		{"two /48s, by /48", 48, "[2001:db8:1::1]:1", "[2001:db8:2::1]:1", false},
		{"two /64s of one /56, by /64", 64, "[2001:db8:1:200::1]:1", "[2001:db8:1:201::1]:1", false},
		{"two addresses of one /64, by /64", 64, "[2001:db8:1:2::1]:1", "[2001:db8:1:2:ffff::9]:2", true},
		{"two IPv4 addresses", 0, "203.0.113.7:1", "203.0.113.8:1", false},
	} {
		a, b := key(tc.prefix, tc.a), key(tc.prefix, tc.b)
		if (a == b) != tc.same {
			t.Errorf("%s: keys %q and %q, want the same: %v", tc.name, a, b, tc.same)
		}
	}
	if got := key(0, "[2001:db8:1:2ff:ffff::9]:2"); got != "addr:2001:db8:1:200::/56" {
		t.Errorf("key %q, want the address's /56", got)
	}
}

func TestClientBuckets(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	allowed := func(c *clientBuckets, key string, at time.Time) bool {
		r, _, _ := c.reserve(key, at)
		if r.DelayFrom(at) > 0 {
			r.CancelAt(at)
			return false
		}
		return true
	}

	t.Run("burst, then the rate", func(t *testing.T) {
		c := newClientBuckets(2, 4, 100) // 2/s, burst 4
		for i := range 4 {
			if !allowed(c, "a", t0) {
				t.Fatalf("request %d of the burst refused", i+1)
			}
		}
		if allowed(c, "a", t0) {
			t.Error("a fifth request at once allowed over a burst of 4")
		}
		if !allowed(c, "b", t0) {
			t.Error("another client refused: buckets are per client")
		}
		// A refused request costs nothing: half a second later one token is back.
		if !allowed(c, "a", t0.Add(500*time.Millisecond)) {
			t.Error("refused half a second later at 2/s")
		}
		if allowed(c, "a", t0.Add(500*time.Millisecond)) {
			t.Error("two requests allowed half a second after an empty bucket at 2/s")
		}
	})

	t.Run("idle buckets are dropped once full again", func(t *testing.T) {
		c := newClientBuckets(2, 4, 100) // full again after 2s
		for i := range 50 {
			allowed(c, fmt.Sprintf("10.0.0.%d", i), t0)
		}
		if n := c.lru.Len(); n != 50 {
			t.Fatalf("%d buckets, want 50", n)
		}
		allowed(c, "late", t0.Add(2*time.Second))
		if n := c.lru.Len(); n != 1 {
			t.Errorf("%d buckets kept after 2s idle (the refill time), want only the new one", n)
		}
	})

	t.Run("a flood of addresses stays bounded", func(t *testing.T) {
		c := newClientBuckets(1, 2, 1000)
		for range 2 {
			allowed(c, "steady", t0)
		}
		evictions := 0
		for i := range 100_000 {
			at := t0.Add(time.Duration(i) * time.Microsecond) // all within the idle time
			_, kept, evicted := c.reserve(fmt.Sprintf("flood-%d", i), at)
			if kept > 1000 {
				t.Fatalf("%d buckets after %d distinct clients; the bound is 1000", kept, i+1)
			}
			if evicted {
				evictions++
			}
			if i%100 == 0 && allowed(c, "steady", at) {
				t.Fatalf("the steady client got a token at flood request %d: its empty bucket was dropped while in use", i)
			}
		}
		if len(c.byKey) != c.lru.Len() || c.lru.Len() != 1000 {
			t.Errorf("map %d, list %d; want both at the bound 1000", len(c.byKey), c.lru.Len())
		}
		if evictions < 90_000 {
			t.Errorf("%d evictions for 100,000 clients in a table of 1,000", evictions)
		}
	})
}

// A request refused by the global limit does not use up its client's token.
func TestGlobalLimitKeepsTheClientsToken(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(&Config{RateLimit: 1, RateBurst: 2, GlobalRateLimit: 1, GlobalRateBurst: 1, RateLimitClients: 10}, m)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if s, _ := l.allow("a", t0); s != "" {
		t.Fatalf("first request refused by %s", s)
	}
	if s, wait := l.allow("a", t0); s != scopeGlobal || wait <= 0 {
		t.Fatalf("second request: refused by %q after %v, want the global limit", s, wait)
	}
	if got := l.clients.byKey["a"].Value.(*bucket).lim.TokensAt(t0); got < 0.99 {
		t.Errorf("client a has %.2f tokens after a global refusal, want its second token back", got)
	}
}
