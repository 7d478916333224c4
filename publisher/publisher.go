// Package publisher turns jobs posted over HTTP into vramq work messages: it
// validates a job, cuts it into chunks that fit the queue's messages, sends
// items too large for a message through S3 (claim-check), puts the chunks on
// SQS with SendMessageBatch, and answers job status from the results the
// subscribers leave in S3. The same http.Handler serves a long-lived server
// and an AWS Lambda function.
package publisher

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/batches"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/jobs"
)

// Publisher is the HTTP API over one work queue. Safe for concurrent use.
type Publisher struct {
	cfg     Config
	gate    *api.Gate        // keys, rate limits, bodies in flight, the request log
	jobs    *jobs.Service    // the job routes, and the jobs the batches submit
	files   *files.Service   // the Files API
	batches *batches.Service // the Batch API and Message Batches, and their sweeper
}

// New checks cfg and builds a Publisher. It makes no AWS calls: read the
// queue's limits with QueueLimits first and put them in cfg.
func New(cfg Config) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("publisher config: %w", err)
	}
	cfg.Idem = api.NewMemIdem(cfg.IdempotencyTTL, cfg.IdempotencyEntries)
	if cfg.Payloads != nil {
		cfg.Idem = api.S3Idem{Store: cfg.Payloads}
	}
	cfg.UploadHeld = cfg.uploadHeld()
	p := &Publisher{cfg: cfg}
	var err error
	p.gate, err = api.NewGate(cfg.API)
	if err != nil {
		return nil, fmt.Errorf("publisher metrics: %w", err)
	}
	fileLimits := files.Config{MaxFileBytes: cfg.MaxFileBytes, MaxFileLines: cfg.MaxFileLines,
		MaxFileLineBytes: cfg.MaxFileLineBytes, MaxFiles: cfg.MaxFiles, FileUploadTimeout: cfg.FileUploadTimeout,
		MinBodyRate: cfg.MinBodyRate, BodyGrace: cfg.BodyGrace, UploadHeld: cfg.UploadHeld, PublicURL: cfg.PublicURL}
	p.files = files.New(fileLimits, p.gate, cfg.Payloads, cfg.Logger)
	p.jobs, err = jobs.New(cfg.Jobs, jobs.Shared{Queue: cfg.Queue, Payloads: cfg.Payloads, Gate: p.gate, Idem: cfg.Idem,
		Labels:       tenant.NewLabels(api.MaxTenantLabels, p.gate.Tenants()...),
		MaxBodyBytes: cfg.MaxBodyBytes, IdempotencyStale: cfg.IdempotencyStale, Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, fmt.Errorf("publisher metrics: %w", err)
	}
	p.batches, err = batches.New(cfg.Batches, batches.Shared{Payloads: cfg.Payloads, Gate: p.gate, Jobs: p.jobs,
		Files: p.files, FileLimits: fileLimits, Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, fmt.Errorf("publisher batches: %w", err)
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
//	                     OpenAI's Batch API (publisher/batches; auth, rate limits)
//	POST /v1/messages/batches, GET /v1/messages/batches, GET and DELETE
//	/v1/messages/batches/{id}, POST /v1/messages/batches/{id}/cancel,
//	GET /v1/messages/batches/{id}/results
//	                     Anthropic's Message Batches (publisher/batches; auth, rate limits)
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
	p.jobs.Routes(mux)    // the job routes (publisher/jobs)
	p.files.Routes(mux)   // OpenAI's Files API (publisher/files)
	p.batches.Routes(mux) // the Batch API and Message Batches (publisher/batches)
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

// Sweep advances every open batch once (batches.Service.Sweep).
func (p *Publisher) Sweep(ctx context.Context) error { return p.batches.Sweep(ctx) }

// RunSweeper sweeps every interval, and advances the batches it is nudged
// about, until ctx ends (batches.Service.RunSweeper).
func (p *Publisher) RunSweeper(ctx context.Context, interval time.Duration) {
	p.batches.RunSweeper(ctx, interval)
}

// AdvanceBatch advances batch id now, as a sweep would
// (batches.Service.AdvanceBatch).
func (p *Publisher) AdvanceBatch(ctx context.Context, id string) error {
	return p.batches.AdvanceBatch(ctx, id)
}
