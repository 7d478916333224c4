// Package batches is the publisher's OpenAI Batch API and Anthropic's
// Message Batches: a batch's create, its validation after the create has
// answered, the state machine kept in its S3 record and the sweeper that
// advances it, its finalization into results files, and the webhooks of
// its end. A batch's requests run as one job, which it submits and reads
// through publisher/jobs' Service.
package batches

import (
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/config"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/jobs"
)

// Config is what the batch routes take of their own; publisher.Config
// embeds it (as Batches).
type Config struct {
	// BatchWebhookURL, when set, is sent OpenAI's batch.completed,
	// batch.failed, batch.expired and batch.cancelled events, signed with
	// BatchWebhookSecret ("whsec_" and base64, Standard Webhooks) as OpenAI
	// signs them (webhooks.go).
	BatchWebhookURL    string
	BatchWebhookSecret string
}

// Validate adds every problem with c to problems, each named by its field.
func (c *Config) Validate(problems *config.Problems) {
	if c.BatchWebhookURL == "" {
		return
	}
	if u, err := url.Parse(c.BatchWebhookURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		problems.Add("BatchWebhookURL", "batch webhook URL %q: want an http or https URL", c.BatchWebhookURL)
	}
	if _, err := webhookKey(c.BatchWebhookSecret); err != nil {
		problems.Add("BatchWebhookSecret", "%v", err)
	}
}

// Shared is what a Service takes from the rest of the publisher.
type Shared struct {
	Payloads *payload.Store // the bucket; the batch routes answer 501 without one
	Gate     *api.Gate
	Jobs     *jobs.Service // where a batch's job is submitted and read
	Files    *files.Service
	// FileLimits are the Files API's: the limits of an input file, and of
	// a Message Batch's body, which is as large as a file.
	FileLimits files.Config
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Service is the batch routes and the sweeper. Safe for concurrent use.
type Service struct {
	log     *slog.Logger
	m       *metrics
	store   *payload.Store
	gate    *api.Gate
	jobs    *jobs.Service
	files   *files.Service
	fileCfg files.Config
	// batchBytes bounds the bytes of Message Batch creates in flight at
	// once, each charged its body's size (msgbatches.go): MaxFileBytes. An
	// OpenAI batch's create reads no file: it is validated streamed
	// (batchvalidate.go).
	batchBytes    *semaphore.Weighted
	batchCreators keySet    // the clients creating a batch, one each
	advancing     keySet    // the batches this process is advancing (advanceBatch)
	hooks         *webhooks // nil without BatchWebhookURL
	now           func() time.Time
	nudges        chan string // records of batches a read found settled (sweeper.go)
}

// New builds the batch routes of cfg, which is valid.
func New(cfg Config, sh Shared) (*Service, error) {
	m, err := newMetrics(sh.Registerer)
	if err != nil {
		return nil, err
	}
	p := &Service{log: sh.Logger, m: m, store: sh.Payloads, gate: sh.Gate, jobs: sh.Jobs, files: sh.Files,
		fileCfg: sh.FileLimits, batchBytes: semaphore.NewWeighted(sh.FileLimits.MaxFileBytes),
		now: time.Now, nudges: make(chan string, nudgeBuffer)}
	if p.hooks, err = newWebhooks(cfg.BatchWebhookURL, cfg.BatchWebhookSecret, sh.Logger); err != nil {
		return nil, err
	}
	return p, nil
}

// Routes adds the Batch API's routes and Message Batches', behind the
// gate's auth and rate limits, each answering errors in its provider's shape.
func (p *Service) Routes(mux *http.ServeMux) {
	mux.Handle("POST /v1/batches", api.OpenAI(p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.postBatch)))))
	mux.Handle("GET /v1/batches", api.OpenAI(p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.listBatches)))))
	mux.Handle("GET /v1/batches/{id}", api.OpenAI(p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.getBatch)))))
	mux.Handle("POST /v1/batches/{id}/cancel", api.OpenAI(p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.cancelBatch)))))
	mux.Handle("/v1/batches", api.OpenAI(api.MethodNotAllowed("GET, HEAD, POST")))
	mux.Handle("/v1/batches/{id}", api.OpenAI(api.MethodNotAllowed("GET, HEAD")))
	mux.Handle("/v1/batches/{id}/cancel", api.OpenAI(api.MethodNotAllowed("POST")))
	mux.Handle("/v1/batches/", api.OpenAI(http.HandlerFunc(api.NotFound)))
	p.messageBatchRoutes(mux) // Anthropic's Message Batches (msgbatches.go)
}
