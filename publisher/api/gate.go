// Package api is the publisher's HTTP edge, what every route shares: API
// keys and the caller they name (tenant, owner), rate limits, the bounds on
// request bodies in flight and their pace, Idempotency-Key records, the
// error shapes (vramq's, OpenAI's, Anthropic's), OpenAI's list pages and
// the ids of listed records, the request log and its metrics, and the
// adapters that serve one http.Handler from a listener or AWS Lambda. The
// routes themselves (publisher/files; jobs and batches in publisher) ask a
// Gate for these.
package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config is the settings of the HTTP edge. publisher.Config embeds it, and
// publisher.New gives each zero field its default (publisher.DefaultConfig)
// and checks them (publisher.Config.Validate) before NewGate sees them.
type Config struct {
	// APIKeys, when any, are the bearer tokens accepted on /v1/jobs routes
	// (Authorization: Bearer <key>). /healthz and /metrics stay open. An
	// entry "name:key" names the key's tenant (see SplitKey); one without a
	// name is the tenant tenant.OfKey(key). Keys may share a name, to rotate
	// one tenant's key without changing its tenant.
	APIKeys []string

	// RateLimit is the steady rate, in requests per second, that one client
	// may send to /v1/jobs routes: its API key when auth is on, else its
	// source address (an IPv6 client by its IPv6ClientPrefix). RateBurst is
	// how many it may send at once after a quiet spell; zero is twice
	// RateLimit. A request over the limit is answered 429 rate_limited with
	// Retry-After, before its body is read. 0: no per-client limit
	// (publisher.DefaultConfig's; cmd/publisher sets one).
	RateLimit float64
	RateBurst int
	// GlobalRateLimit and GlobalRateBurst are the same over all clients
	// together, for this process; 0: none. GlobalRateBurst defaults to twice
	// GlobalRateLimit.
	GlobalRateLimit float64
	GlobalRateBurst int
	// IPv6ClientPrefix is the prefix length by which an IPv6 address is one
	// client, for rate limits and shares of the bodies in flight: every
	// address in one such prefix is the same client. The default is 56, what
	// ISPs delegate to one customer site (RIPE-690 advises a /48 or a /56,
	// and most residential ISPs that follow it give the /56) and what AWS
	// gives one VPC: a /64 is one LAN, and a site holds 256 of them, so
	// keying by /64 let one site send 256 times the limit. A /48 would bound
	// a site given a /48 too, but lump 256 customers of an ISP that gives
	// /56s into one client. Lower it to 48 where clients hold /48s; raise it
	// to 64 where many clients share a /56 (a mobile carrier gives each
	// device a /64 of a shared pool). 32 to 128: a shorter prefix is a
	// whole ISP's.
	IPv6ClientPrefix int
	// RateLimitClients bounds the clients whose buckets are kept in memory
	// (about 200 bytes each), least recently used first out.
	RateLimitClients int
	// TrustedProxies are the load balancers and proxies allowed to say who
	// the client is: when a request's peer address is in one of them, the
	// client is the rightmost address of X-Forwarded-For that is not (see
	// ClientAddr). Empty: the peer address is the client and X-Forwarded-For
	// is ignored, which is right when clients connect directly and under
	// Lambda, where the peer is API Gateway's sourceIp.
	TrustedProxies []netip.Prefix

	// MaxBodyBytes bounds a request body, enforced before it is read.
	// The whole body is held in memory while it is handled,
	// with what is decoded from it: 5 to 6 times its size at the peak
	// (BenchmarkConcurrentMaxBodies).
	MaxBodyBytes int64
	// MaxBodyBytesInFlight bounds the bytes of request bodies held at once,
	// over all requests: a POST that would go over it is answered 503
	// overloaded with Retry-After, without waiting (inflight.go). A body is
	// charged for the bytes that have arrived, as they arrive. So the heap
	// the requests take is 5 to 6 times this at most. Zero is twice
	// MaxBodyBytes; at least MaxBodyBytes, or a body at the limit could
	// never be taken.
	MaxBodyBytesInFlight int64
	// MaxBodyBytesPerClient bounds the bytes of bodies one client holds at
	// once (the client of RateLimit: its API key, else its address), and
	// MaxBodiesPerClient its POSTs whose bodies are in flight, read or being
	// read; a POST over either is answered 429 too_many_bodies with
	// Retry-After, without waiting, so that one client cannot take the whole
	// budget. MaxBodyBytesPerClient: zero is half MaxBodyBytesInFlight, at
	// least MaxBodyBytes and at most MaxBodyBytesInFlight.
	MaxBodyBytesPerClient int64
	MaxBodiesPerClient    int
	// MinBodyRate, in bytes a second, and BodyGrace: a body's bytes must
	// start coming within BodyGrace, never pause for longer, and once
	// BodyGrace has passed have come at MinBodyRate on average since the
	// body began. A body that falls behind is cut off, 408 body_too_slow,
	// and gives back what it held (BodyPace), so that clients that stall or
	// trickle cannot hold the budget or their share of it.
	MinBodyRate int64
	BodyGrace   time.Duration
	// UploadHeld is the most bytes one upload holds at once (a part on its
	// way to S3): the least share of the bodies in flight uploads get.
	// publisher.New works it out from MaxFileBytes, over what is here.
	UploadHeld int64

	// Idem keeps the records of Idempotency-Keys; publisher.New picks it
	// (the bucket's, else one in memory), over what is here.
	Idem IdemStore
	// IdempotencyStale is how long a record of a request still sending
	// blocks a retry with the same key (409); after it the retry takes the
	// job over and sends it again.
	IdempotencyStale time.Duration

	Logger *slog.Logger // default slog.Default(); request logs carry no payloads
	// Registerer gets the metrics; default a private registry. When it is
	// also a prometheus.Gatherer (a *prometheus.Registry is),
	// publisher.Publisher.MetricsHandler serves it.
	Registerer prometheus.Registerer
}

// ReadConcurrency bounds the S3 reads one request makes at once: a job's
// status, a page of files or batches, a batch's finalization.
const ReadConcurrency = 8

// Gate is what every request passes through: it knows the API keys, the
// rate limits and the bodies in flight. Safe for concurrent use.
type Gate struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	keys    [][sha256.Size]byte // SHA-256 of each API key
	tenants []string            // the tenant of each key, by the index of keys
	rates   *limiter            // nil without rate limits
	bodies  *bodyBudget         // request bodies in flight
	idem    IdemStore
	now     func() time.Time
}

// NewGate builds a Gate from cfg, registering its metrics.
func NewGate(cfg Config) (*Gate, error) {
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	g := &Gate{cfg: cfg, log: cfg.Logger, m: m, idem: cfg.Idem, now: time.Now}
	for _, k := range cfg.APIKeys {
		name, key := SplitKey(k)
		g.keys = append(g.keys, sha256.Sum256([]byte(key)))
		g.tenants = append(g.tenants, name)
	}
	g.rates = newLimiter(&cfg, m)
	g.bodies = newBodyBudget(&cfg, m)
	return g, nil
}

// Tenants are the tenants the API keys name, by the keys' order.
func (g *Gate) Tenants() []string { return g.tenants }

// OpenUpload admits one more request body of r's client that is an upload
// (bodyBudget.openUpload).
func (g *Gate) OpenUpload(r *http.Request) (*BodyCharge, error) {
	return g.bodies.openUpload(g.ClientKey(r))
}

func NotFound(w http.ResponseWriter, _ *http.Request) {
	WriteError(w, Err(http.StatusNotFound, CodeNotFound, "no such endpoint"))
}

// Canonical answers 404 to a path that http.ServeMux would redirect to its
// clean form (dot segments, repeated slashes): the mux's redirect is an HTML
// page, and no client of this API has a reason to send such a path. The rule
// is the mux's own (cleanPath in net/http): path.Clean, keeping a trailing
// slash.
func Canonical(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		clean := path.Clean("/" + p)
		if strings.HasSuffix(p, "/") && clean != "/" {
			clean += "/"
		}
		if p != clean && r.Method != http.MethodConnect {
			NotFound(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func MethodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		WriteError(w, Err(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "this method is not allowed here; Allow lists the ones that are"))
	}
}

// RequestInfo collects what a request's log line says about its job; handlers
// fill it in through the request's context.
type RequestInfo struct {
	JobID          string
	Items, Chunks  int
	Code           string // the error code, when there was one
	Replayed       bool
	ClaimChecked   int
	Sent           int
	BodyBytes      int
	IdempotencyKey bool
}

type reqInfoKey struct{}

func Info(r *http.Request) *RequestInfo {
	if i, ok := r.Context().Value(reqInfoKey{}).(*RequestInfo); ok {
		return i
	}
	return &RequestInfo{}
}

// Observe logs one line per request (never its body) and counts it by route
// pattern, so ids in paths do not explode the label set.
func (g *Gate) Observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := g.now()
		w.Header().Set("X-Content-Type-Options", "nosniff")
		ri := &RequestInfo{}
		r = r.WithContext(context.WithValue(r.Context(), reqInfoKey{}, ri))
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		route := r.Pattern // set by the mux on this same request
		if route == "" || route == "/" {
			route = "other"
		}
		d := g.now().Sub(start)
		g.m.requests.WithLabelValues(route, strconv.Itoa(sw.status)).Inc()
		g.m.latency.WithLabelValues(route).Observe(d.Seconds())
		if route == "GET /healthz" {
			return // probes would drown the log
		}
		attrs := []any{"method", r.Method, "path", r.URL.Path, "route", route, "status", sw.status,
			"took", d.Round(time.Microsecond), "remote", r.RemoteAddr}
		if ri.Code != "" {
			attrs = append(attrs, "code", ri.Code)
		}
		if ri.JobID != "" {
			attrs = append(attrs, "job_id", ri.JobID, "items", ri.Items, "chunks", ri.Chunks, "sent", ri.Sent,
				"claim_checked", ri.ClaimChecked, "body_bytes", ri.BodyBytes, "idempotency_key", ri.IdempotencyKey, "replayed", ri.Replayed)
		}
		level := slog.LevelInfo
		if sw.status >= 500 {
			level = slog.LevelError
		}
		g.log.Log(r.Context(), level, "request", attrs...)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Auth checks the bearer key when keys are configured, and puts the
// caller's scope (the SHA-256 of its key) where idempotency and rate limits
// find it, and its key's tenant where RequestTenant and Owner do. Every
// configured key is compared, each in constant time, over SHA-256 digests
// of equal length, so neither a key's content nor its length leaks by
// timing. A request without a valid key is charged to its source
// address's rate limit before it is answered 401, so keys cannot be guessed
// faster than the limit.
func (g *Gate) Auth(next http.Handler) http.Handler {
	if len(g.keys) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const prefix = "Bearer "
		h := r.Header.Get("Authorization")
		if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
			if g.rates != nil && g.refuse(w, r, g.addrKey(r)) {
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="vramq"`)
			Info(r).Code = CodeUnauthorized
			WriteError(w, Err(http.StatusUnauthorized, CodeUnauthorized, "an API key is required: Authorization: Bearer <key>"))
			return
		}
		given := sha256.Sum256([]byte(h[len(prefix):]))
		match := -1
		for i := range g.keys {
			if subtle.ConstantTimeCompare(given[:], g.keys[i][:]) == 1 {
				match = i
			}
		}
		if match < 0 {
			if g.rates != nil && g.refuse(w, r, g.addrKey(r)) {
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="vramq", error="invalid_token"`)
			Info(r).Code = CodeUnauthorized
			WriteError(w, Err(http.StatusUnauthorized, CodeUnauthorized, "the API key is not valid"))
			return
		}
		ctx := context.WithValue(r.Context(), scopeKey{}, hex.EncodeToString(g.keys[match][:]))
		next.ServeHTTP(w, r.WithContext(withTenant(ctx, g.tenants[match])))
	})
}

type scopeKey struct{}

// Scope is the caller's idempotency scope, and its client for rate limits
// and shares (ClientKey): its key's digest; without keys, the digest of the
// identity API Gateway gave (caller.go), so that one caller's
// Idempotency-Key never replays another's answer; else "".
func Scope(r *http.Request) string {
	if s, _ := r.Context().Value(scopeKey{}).(string); s != "" {
		return s
	}
	if id := CallerIdentity(r); id != "" {
		sum := sha256.Sum256([]byte(id))
		return "caller-" + hex.EncodeToString(sum[:])
	}
	return ""
}

func WriteJSON(w http.ResponseWriter, status int, v any) {
	WriteJSONHeader(w, status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteJSONHeader starts a JSON answer whose body the caller writes.
func WriteJSONHeader(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
}

// Owner is who a job, file or batch r creates belongs to, and who may read,
// cancel and delete it: the tenant of r's API key; without keys, the
// identity API Gateway's authorizer vouched for (caller.go), or "" when
// there is none (the tenant header is the caller's own word). The tenant
// rather than the key: a tenant rotates its key by adding a second one
// under the same name (SplitKey), and its jobs in flight must stay its
// own; and a digest of the key stored in the bucket would let whoever
// reads the bucket test guesses of a weak key offline, where an unnamed
// key's tenant is 48 bits of its SHA-256 and already goes out with every
// message.
func (g *Gate) Owner(r *http.Request) string {
	if len(g.keys) == 0 {
		return CallerIdentity(r)
	}
	t, _ := r.Context().Value(tenantKey{}).(string)
	return t
}

// Owns reports whether r's caller may see, and cancel or delete, what
// owner owns (a job, a file, a batch): the caller it was made by (owner).
// With keys, nobody owns what has no owner, since nothing shows whose it
// is; without keys, a caller without an identity owns what such callers
// made, and no identity's. Every route that answers for what a caller owns
// asks this, and answers 404 when it says no.
func (g *Gate) Owns(r *http.Request, owner string) bool {
	return owner == g.Owner(r) && (len(g.keys) == 0 || owner != "")
}
