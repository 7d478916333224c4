// Package publisher turns jobs posted over HTTP into vramq work messages: it
// validates a job, cuts it into chunks that fit the queue's messages, sends
// items too large for a message through S3 (claim-check), puts the chunks on
// SQS with SendMessageBatch, and answers job status from the results the
// subscribers leave in S3. The same http.Handler serves a long-lived server
// and an AWS Lambda function.
package publisher

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/jobs"
)

// Publisher is the HTTP API over one work queue. Safe for concurrent use.
type Publisher struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	store *payload.Store
	gate  *api.Gate      // keys, rate limits, bodies in flight, the request log
	jobs  *jobs.Service  // the job routes, and the jobs the batches submit
	files *files.Service // the Files API
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
	var idem api.IdemStore = api.NewMemIdem(cfg.IdempotencyTTL, cfg.IdempotencyEntries)
	if cfg.Payloads != nil {
		idem = api.S3Idem{Store: cfg.Payloads}
	}
	p.gate, err = api.NewGate(api.Config{APIKeys: cfg.APIKeys,
		RateLimit: cfg.RateLimit, RateBurst: cfg.RateBurst, GlobalRateLimit: cfg.GlobalRateLimit, GlobalRateBurst: cfg.GlobalRateBurst,
		IPv6ClientPrefix: cfg.IPv6ClientPrefix, RateLimitClients: cfg.RateLimitClients, TrustedProxies: cfg.TrustedProxies,
		MaxBodyBytes: cfg.MaxBodyBytes, MaxBodyBytesInFlight: cfg.MaxBodyBytesInFlight, MaxBodyBytesPerClient: cfg.MaxBodyBytesPerClient,
		MaxBodiesPerClient: cfg.MaxBodiesPerClient, MinBodyRate: cfg.MinBodyRate, BodyGrace: cfg.BodyGrace,
		UploadHeld: cfg.uploadHeld(), Idem: idem, IdempotencyStale: cfg.IdempotencyStale,
		Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, fmt.Errorf("publisher metrics: %w", err)
	}
	p.files = files.New(files.Config{MaxFileBytes: cfg.MaxFileBytes, MaxFileLines: cfg.MaxFileLines,
		MaxFileLineBytes: cfg.MaxFileLineBytes, MaxFiles: cfg.MaxFiles, FileUploadTimeout: cfg.FileUploadTimeout,
		MinBodyRate: cfg.MinBodyRate, BodyGrace: cfg.BodyGrace, UploadHeld: cfg.uploadHeld(), PublicURL: cfg.PublicURL},
		p.gate, cfg.Payloads, cfg.Logger)
	p.jobs, err = jobs.New(cfg.Jobs, jobs.Shared{Queue: cfg.Queue, Payloads: cfg.Payloads, Gate: p.gate, Idem: idem,
		Labels:       tenant.NewLabels(api.MaxTenantLabels, p.gate.Tenants()...),
		MaxBodyBytes: cfg.MaxBodyBytes, IdempotencyStale: cfg.IdempotencyStale, Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, fmt.Errorf("publisher metrics: %w", err)
	}
	p.batchBytes = semaphore.NewWeighted(cfg.MaxFileBytes)
	if p.hooks, err = newWebhooks(cfg.BatchWebhookURL, cfg.BatchWebhookSecret, cfg.Logger); err != nil {
		return nil, fmt.Errorf("publisher config: %w", err)
	}
	return p, nil
}

// Handler routes the API:
//
//	POST /v1/jobs        submit a job (publisher/jobs; auth, rate limits)
//	GET  /v1/jobs/{id}   a job's progress and results (publisher/jobs)
//	DELETE /v1/jobs/{id} cancel a job (publisher/jobs)
//	POST /v1/files, GET /v1/files, GET and DELETE /v1/files/{id},
//	GET /v1/files/{id}/content
//	                     OpenAI's Files API (publisher/files; auth, rate limits)
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
	p.jobs.Routes(mux)  // the job routes (publisher/jobs)
	p.files.Routes(mux) // OpenAI's Files API (publisher/files)
	mux.Handle("POST /v1/batches", api.OpenAI(p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.postBatch)))))
	mux.Handle("GET /v1/batches", api.OpenAI(p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.listBatches)))))
	mux.Handle("GET /v1/batches/{id}", api.OpenAI(p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.getBatch)))))
	mux.Handle("POST /v1/batches/{id}/cancel", api.OpenAI(p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.cancelBatch)))))
	mux.Handle("/v1/batches", api.OpenAI(api.MethodNotAllowed("GET, HEAD, POST")))
	mux.Handle("/v1/batches/{id}", api.OpenAI(api.MethodNotAllowed("GET, HEAD")))
	mux.Handle("/v1/batches/{id}/cancel", api.OpenAI(api.MethodNotAllowed("POST")))
	mux.Handle("/v1/batches/", api.OpenAI(http.HandlerFunc(api.NotFound)))
	p.messageBatchRoutes(mux) // Anthropic's Message Batches (msgbatches.go)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/", api.NotFound)
	return p.gate.Observe(api.Canonical(mux))
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
