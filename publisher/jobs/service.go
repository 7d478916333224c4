// Package jobs is the job routes of the publisher: POST /v1/jobs, a job's
// status and result pages, its cancel, and the chunks a job is cut into and
// sent on the work queue, with the manifests and cancel records that stand
// for a job in the payload bucket. The batch routes submit and read their
// jobs through a Service's exported methods, as a client of the routes would.
package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// Service is the job routes and what the batch routes ask of jobs. Safe for
// concurrent use.
type Service struct {
	cfg       Config
	log       *slog.Logger
	m         *metrics
	planner   Planner
	sender    *sender
	idem      api.IdemStore
	store     *payload.Store
	gate      *api.Gate
	labels    *tenant.Labels
	results   *resultShares // bytes of stored results in flight (resultpage.go)
	maxBody   int64         // Shared.MaxBodyBytes
	idemStale time.Duration // Shared.IdempotencyStale
	now       func() time.Time
}

// Shared is what a Service takes from the rest of the publisher: settings
// another part owns, and the parts it shares.
type Shared struct {
	Queue            Queue
	Payloads         *payload.Store // nil: no bucket (see publisher.Config.Payloads)
	Gate             *api.Gate
	Idem             api.IdemStore
	Labels           *tenant.Labels
	MaxBodyBytes     int64
	IdempotencyStale time.Duration
	Logger           *slog.Logger
	Registerer       prometheus.Registerer
}

// New builds the job routes of cfg, which has its defaults and is valid.
func New(cfg Config, sh Shared) (*Service, error) {
	m, err := newMetrics(sh.Registerer)
	if err != nil {
		return nil, err
	}
	p := &Service{cfg: cfg, log: sh.Logger, m: m, idem: sh.Idem, store: sh.Payloads, gate: sh.Gate, labels: sh.Labels,
		maxBody: sh.MaxBodyBytes, idemStale: sh.IdempotencyStale, now: time.Now}
	p.planner = Planner{MaxMessageBytes: cfg.MaxMessageBytes, MaxItemBytes: cfg.MaxItemBytes}
	if sh.Payloads != nil {
		p.planner.Bucket = sh.Payloads.Bucket()
	}
	p.sender = &sender{
		queue: sh.Queue, attempts: cfg.SendAttempts, retry: sendRetry(cfg.SendBackoff),
		maxBatchBytes: cfg.MaxMessageBytes, concurrency: cfg.SendConcurrency, m: m, log: sh.Logger,
	}
	p.results = newResultShares(&cfg)
	return p, nil
}

// Routes adds POST /v1/jobs, GET /v1/jobs/{id} and DELETE /v1/jobs/{id},
// behind the gate's auth and rate limits.
func (p *Service) Routes(mux *http.ServeMux) {
	mux.Handle("POST /v1/jobs", p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.postJob))))
	mux.Handle("GET /v1/jobs/{id}", p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.getJob))))
	mux.Handle("DELETE /v1/jobs/{id}", p.gate.Auth(p.gate.RateLimit(http.HandlerFunc(p.deleteJob))))
	// The method-less patterns catch what the ones above do not, so a wrong
	// method gets a JSON 405 rather than the mux's plain-text one.
	mux.HandleFunc("/v1/jobs", api.MethodNotAllowed("POST"))
	mux.HandleFunc("/v1/jobs/{id}", api.MethodNotAllowed("GET, HEAD, DELETE"))
}

// Accepted counts a job of items that is on the queue whole, for tenantName.
func (p *Service) Accepted(tenantName string, items int) {
	p.m.jobs.Inc()
	label := p.labels.Label(tenantName)
	p.m.tenantJobs.WithLabelValues(label).Inc()
	p.m.tenantItems.WithLabelValues(label).Add(float64(items))
}

// Cancel writes job jobID's cancel record, once (the first one's time
// stands): subscribers delete its chunks unrun from then on.
func (p *Service) Cancel(ctx context.Context, jobID string) error {
	err := p.cancel(ctx, jobID)
	if err != nil {
		p.log.Error("cancelling a job", "job_id", jobID, "err", err)
	}
	return err
}

func (p *Service) cancel(ctx context.Context, jobID string) error {
	raw, err := json.Marshal(job.CancelRecord{V: job.Version, JobID: jobID, At: p.now().UTC()})
	if err == nil {
		_, _, err = p.store.PutIfAbsent(ctx, job.CancelKey(jobID), raw)
	}
	return err
}

// Progress reads the manifest and the progress of job jobID.
func (p *Service) Progress(ctx context.Context, jobID string) (*job.Manifest, *Status, error) {
	raw, err := p.store.Read(ctx, job.ManifestKey(jobID))
	if err != nil {
		return nil, nil, fmt.Errorf("manifest of job %s: %w", jobID, err)
	}
	var m job.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, nil, fmt.Errorf("manifest of job %s: %w", jobID, err)
	}
	st, err := p.status(ctx, &m)
	if err != nil {
		return nil, nil, err
	}
	return &m, st, nil
}

// Outputs reads the result of chunk c of job jobID, its outputs by item id.
func (p *Service) Outputs(ctx context.Context, jobID string, c int) (map[string]*job.Output, error) {
	body, size, err := p.store.Open(ctx, job.ResultKey(jobID, c))
	if err != nil {
		return nil, err
	}
	defer body.Close()
	if size > job.MaxResultBytes {
		return nil, fmt.Errorf("result %s is %d bytes, over %d", job.ResultKey(jobID, c), size, job.MaxResultBytes)
	}
	res, err := readResult(body, size, jobID, c)
	if err != nil {
		return nil, err
	}
	outputs := make(map[string]*job.Output, len(res.Outputs))
	for i := range res.Outputs {
		outputs[res.Outputs[i].ID] = &res.Outputs[i]
	}
	return outputs, nil
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
