// Package publisher turns jobs posted over HTTP into vramq work messages: it
// validates a job, cuts it into chunks that fit the queue's messages, sends
// items too large for a message through S3 (claim-check), puts the chunks on
// SQS with SendMessageBatch, and answers job status from the results the
// subscribers leave in S3. The same http.Handler serves a long-lived server
// and an AWS Lambda function.
package publisher

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"golang.org/x/sync/semaphore"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/tenant"
)

// Publisher is the HTTP API over one work queue. Safe for concurrent use.
type Publisher struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	planner Planner
	sender  *sender
	idem    idemStore
	store   *payload.Store
	keys    [][sha256.Size]byte // SHA-256 of each API key
	tenants []string            // the tenant of each key, by the index of keys
	labels  *tenant.Labels      // per-tenant metric labels
	rates   *limiter            // nil without rate limits
	bodies  *bodyBudget         // request bodies in flight
	results *resultShares       // bytes of stored results in flight (resultpage.go)
	// Batches (batches.go, batchvalidate.go, batchstate.go, webhooks.go).
	// batchBytes bounds the bytes of Message Batch creates held at once
	// while they are planned (msgbatches.go): MaxFileBytes. An OpenAI batch
	// holds none: its file is validated streamed (batchvalidate.go).
	batchBytes    *semaphore.Weighted
	batchCreators keySet    // the clients creating a batch, one each
	advancing     keySet    // the batches this process is advancing (advanceBatch)
	hooks         *webhooks // nil without BatchWebhookURL
	now           func() time.Time
	nudges        chan string // records of batches a read found settled (sweeper.go)
}

// New checks cfg and builds a Publisher. It makes no AWS calls: read the
// queue's limits with QueueLimits first and put them in cfg.
func New(cfg Config) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("publisher config: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("publisher metrics: %w", err)
	}
	p := &Publisher{cfg: cfg, log: cfg.Logger, m: m, store: cfg.Payloads, now: time.Now,
		nudges: make(chan string, nudgeBuffer)}
	p.planner = Planner{MaxMessageBytes: cfg.MaxMessageBytes, MaxItemBytes: cfg.MaxItemBytes}
	if cfg.Payloads != nil {
		p.planner.Bucket = cfg.Payloads.Bucket()
		p.idem = s3Idem{cfg.Payloads}
	} else {
		p.idem = newMemIdem(cfg.IdempotencyTTL, cfg.IdempotencyEntries)
	}
	p.sender = &sender{
		queue: cfg.Queue, attempts: cfg.SendAttempts, retry: sendRetry(cfg.SendBackoff),
		maxBatchBytes: cfg.MaxMessageBytes, concurrency: cfg.SendConcurrency, m: m, log: cfg.Logger,
	}
	for _, k := range cfg.APIKeys {
		name, key := SplitKey(k)
		p.keys = append(p.keys, sha256.Sum256([]byte(key)))
		p.tenants = append(p.tenants, name)
	}
	p.labels = tenant.NewLabels(maxTenantLabels, p.tenants...)
	p.rates = newLimiter(&cfg, m)
	p.bodies = newBodyBudget(&cfg, m)
	p.results = newResultShares(&cfg)
	p.batchBytes = semaphore.NewWeighted(cfg.MaxFileBytes)
	if p.hooks, err = newWebhooks(cfg.BatchWebhookURL, cfg.BatchWebhookSecret, cfg.Logger); err != nil {
		return nil, fmt.Errorf("publisher config: %w", err)
	}
	return p, nil
}

// Handler routes the API:
//
//	POST /v1/jobs        submit a job (auth, rate limits)
//	GET  /v1/jobs/{id}   a job's progress and results (auth, rate limits)
//	DELETE /v1/jobs/{id} cancel a job (auth, rate limits)
//	POST /v1/files, GET /v1/files, GET and DELETE /v1/files/{id},
//	GET /v1/files/{id}/content
//	                     OpenAI's Files API (files.go; auth, rate limits)
//	POST /v1/batches, GET /v1/batches, GET /v1/batches/{id},
//	POST /v1/batches/{id}/cancel
//	                     OpenAI's Batch API (batches.go; auth, rate limits)
//	POST /v1/messages/batches, GET /v1/messages/batches, GET and DELETE
//	/v1/messages/batches/{id}, POST /v1/messages/batches/{id}/cancel,
//	GET /v1/messages/batches/{id}/results
//	                     Anthropic's Message Batches (msgbatches.go; auth, rate limits)
//	GET  /healthz        liveness
//
// Every error is JSON, including 404 and 405, and every response says
// X-Content-Type-Options: nosniff. A path that is not in canonical form
// (dot segments, repeated slashes) is answered 404, never redirected: the
// mux's redirect is an HTML page. Probes are not rate limited: a load
// balancer's health checks must not be refused. /metrics is not here: it is
// MetricsHandler, for a listener of its own that API clients cannot reach.
func (p *Publisher) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/jobs", p.auth(p.rateLimit(http.HandlerFunc(p.postJob))))
	mux.Handle("GET /v1/jobs/{id}", p.auth(p.rateLimit(http.HandlerFunc(p.getJob))))
	mux.Handle("DELETE /v1/jobs/{id}", p.auth(p.rateLimit(http.HandlerFunc(p.deleteJob))))
	// The method-less patterns catch what the ones above do not, so a wrong
	// method gets a JSON 405 rather than the mux's plain-text one.
	mux.HandleFunc("/v1/jobs", methodNotAllowed("POST"))
	mux.HandleFunc("/v1/jobs/{id}", methodNotAllowed("GET, HEAD, DELETE"))
	// The files routes answer every error in OpenAI's shape (openai.go),
	// their 404s and 405s included.
	mux.Handle("POST /v1/files", openAI(p.auth(p.rateLimit(p.withinFileLimit(http.HandlerFunc(p.postFile))))))
	mux.Handle("GET /v1/files", openAI(p.auth(p.rateLimit(http.HandlerFunc(p.listFiles)))))
	mux.Handle("GET /v1/files/{id}", openAI(p.auth(p.rateLimit(http.HandlerFunc(p.getFile)))))
	mux.Handle("DELETE /v1/files/{id}", openAI(p.auth(p.rateLimit(http.HandlerFunc(p.deleteFile)))))
	mux.Handle("GET /v1/files/{id}/content", openAI(p.auth(p.rateLimit(http.HandlerFunc(p.fileContent)))))
	mux.Handle("/v1/files", openAI(methodNotAllowed("GET, HEAD, POST")))
	mux.Handle("/v1/files/{id}", openAI(methodNotAllowed("GET, HEAD, DELETE")))
	mux.Handle("/v1/files/{id}/content", openAI(methodNotAllowed("GET, HEAD")))
	mux.Handle("/v1/files/", openAI(http.HandlerFunc(notFound)))
	mux.Handle("POST /v1/batches", openAI(p.auth(p.rateLimit(http.HandlerFunc(p.postBatch)))))
	mux.Handle("GET /v1/batches", openAI(p.auth(p.rateLimit(http.HandlerFunc(p.listBatches)))))
	mux.Handle("GET /v1/batches/{id}", openAI(p.auth(p.rateLimit(http.HandlerFunc(p.getBatch)))))
	mux.Handle("POST /v1/batches/{id}/cancel", openAI(p.auth(p.rateLimit(http.HandlerFunc(p.cancelBatch)))))
	mux.Handle("/v1/batches", openAI(methodNotAllowed("GET, HEAD, POST")))
	mux.Handle("/v1/batches/{id}", openAI(methodNotAllowed("GET, HEAD")))
	mux.Handle("/v1/batches/{id}/cancel", openAI(methodNotAllowed("POST")))
	mux.Handle("/v1/batches/", openAI(http.HandlerFunc(notFound)))
	p.messageBatchRoutes(mux) // Anthropic's Message Batches (msgbatches.go)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/", notFound)
	return p.observe(canonical(mux))
}

func notFound(w http.ResponseWriter, _ *http.Request) {
	writeError(w, apiErr(http.StatusNotFound, CodeNotFound, "no such endpoint"))
}

// canonical answers 404 to a path that http.ServeMux would redirect to its
// clean form (dot segments, repeated slashes): the mux's redirect is an HTML
// page, and no client of this API has a reason to send such a path. The rule
// is the mux's own (cleanPath in net/http): path.Clean, keeping a trailing
// slash.
func canonical(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		clean := path.Clean("/" + p)
		if strings.HasSuffix(p, "/") && clean != "/" {
			clean += "/"
		}
		if p != clean && r.Method != http.MethodConnect {
			notFound(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, apiErr(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "this method is not allowed here; Allow lists the ones that are"))
	}
}

// MetricsHandler serves the Registerer's metrics in Prometheus' text format,
// or is nil when the Registerer is not also a prometheus.Gatherer. Serve it
// on a listener of its own, which the load balancer does not forward: the
// metrics describe every client's traffic, so API clients must not read them.
func (p *Publisher) MetricsHandler() http.Handler {
	g, ok := p.cfg.Registerer.(prometheus.Gatherer)
	if !ok {
		return nil
	}
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}

// reqInfo collects what a request's log line says about its job; handlers
// fill it in through the request's context.
type reqInfo struct {
	jobID          string
	items, chunks  int
	code           string // the error code, when there was one
	replayed       bool
	claimChecked   int
	sent           int
	bodyBytes      int
	idempotencyKey bool
}

type reqInfoKey struct{}

func info(r *http.Request) *reqInfo {
	if i, ok := r.Context().Value(reqInfoKey{}).(*reqInfo); ok {
		return i
	}
	return &reqInfo{}
}

// observe logs one line per request (never its body) and counts it by route
// pattern, so ids in paths do not explode the label set.
func (p *Publisher) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := p.now()
		w.Header().Set("X-Content-Type-Options", "nosniff")
		ri := &reqInfo{}
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
		d := p.now().Sub(start)
		p.m.requests.WithLabelValues(route, strconv.Itoa(sw.status)).Inc()
		p.m.latency.WithLabelValues(route).Observe(d.Seconds())
		if route == "GET /healthz" {
			return // probes would drown the log
		}
		attrs := []any{"method", r.Method, "path", r.URL.Path, "route", route, "status", sw.status,
			"took", d.Round(time.Microsecond), "remote", r.RemoteAddr}
		if ri.code != "" {
			attrs = append(attrs, "code", ri.code)
		}
		if ri.jobID != "" {
			attrs = append(attrs, "job_id", ri.jobID, "items", ri.items, "chunks", ri.chunks, "sent", ri.sent,
				"claim_checked", ri.claimChecked, "body_bytes", ri.bodyBytes, "idempotency_key", ri.idempotencyKey, "replayed", ri.replayed)
		}
		level := slog.LevelInfo
		if sw.status >= 500 {
			level = slog.LevelError
		}
		p.log.Log(r.Context(), level, "request", attrs...)
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

// auth checks the bearer key when keys are configured, and puts the
// caller's scope (the SHA-256 of its key) where idempotency and rate limits
// find it, and its key's tenant where postJob does. Every configured key is compared, each in constant time, over
// SHA-256 digests of equal length, so neither a key's content nor its length
// leaks by timing. A request without a valid key is charged to its source
// address's rate limit before it is answered 401, so keys cannot be guessed
// faster than the limit.
func (p *Publisher) auth(next http.Handler) http.Handler {
	if len(p.keys) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const prefix = "Bearer "
		h := r.Header.Get("Authorization")
		if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
			if p.rates != nil && p.refuse(w, r, p.addrKey(r)) {
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="vramq"`)
			info(r).code = CodeUnauthorized
			writeError(w, apiErr(http.StatusUnauthorized, CodeUnauthorized, "an API key is required: Authorization: Bearer <key>"))
			return
		}
		given := sha256.Sum256([]byte(h[len(prefix):]))
		match := -1
		for i := range p.keys {
			if subtle.ConstantTimeCompare(given[:], p.keys[i][:]) == 1 {
				match = i
			}
		}
		if match < 0 {
			if p.rates != nil && p.refuse(w, r, p.addrKey(r)) {
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="vramq", error="invalid_token"`)
			info(r).code = CodeUnauthorized
			writeError(w, apiErr(http.StatusUnauthorized, CodeUnauthorized, "the API key is not valid"))
			return
		}
		ctx := context.WithValue(r.Context(), scopeKey{}, hex.EncodeToString(p.keys[match][:]))
		next.ServeHTTP(w, r.WithContext(withTenant(ctx, p.tenants[match])))
	})
}

type scopeKey struct{}

// scope is the caller's idempotency scope, and its client for rate limits
// and shares (clientKey): its key's digest; without keys, the digest of the
// identity API Gateway gave (caller.go), so that one caller's
// Idempotency-Key never replays another's answer; else "".
func scope(r *http.Request) string {
	if s, _ := r.Context().Value(scopeKey{}).(string); s != "" {
		return s
	}
	if id := callerIdentity(r); id != "" {
		sum := sha256.Sum256([]byte(id))
		return "caller-" + hex.EncodeToString(sum[:])
	}
	return ""
}

// jobIDLen is the length of a job id: 128 random bits in hex.
const jobIDLen = 32

// newJobID returns 128 bits from crypto/rand, in hex: unguessable, so a job's
// status is not found by counting, and safe in S3 keys and SQS group ids.
func newJobID() string {
	var b [jobIDLen / 2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	return hex.EncodeToString(b[:])
}

func validJobID(id string) bool {
	if len(id) != jobIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeJSONHeader(w, status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeJSONHeader starts a JSON answer whose body the caller writes.
func writeJSONHeader(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
}
