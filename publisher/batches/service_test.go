package batches

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/jobs"
)

// nopQueue takes every message at once.
type nopQueue struct{}

func (nopQueue) SendBatch(_ context.Context, entries []jobs.Entry) ([]error, error) {
	return make([]error, len(entries)), nil
}

// stack is the batch routes as publisher.New wires them (this package
// cannot import publisher): behind a gate, beside the job routes and the
// Files API, over one bucket.
// Handler serves them all as publisher.Handler does.
type stack struct {
	*Service
	h http.Handler
}

func (s *stack) Handler() http.Handler { return s.h }

// newStack builds a stack over store with the job routes of jc, sending to
// queue. The limits it sets are publisher.DefaultConfig's.
func newStack(tb testing.TB, store *payload.Store, jc jobs.Config, queue jobs.Queue) *stack {
	tb.Helper()
	jc.SetDefaults()
	reg, log := prometheus.NewRegistry(), slog.New(slog.DiscardHandler)
	const maxBody = 32 << 20
	fl := files.Config{MaxFileBytes: 200 << 20, MaxFileLines: 50_000, MaxFileLineBytes: 10 << 20, MaxFiles: 10_000,
		FileUploadTimeout: 30 * time.Minute, MinBodyRate: 16 << 10, BodyGrace: 10 * time.Second, UploadHeld: payload.UploadPartBytes}
	idem := api.S3Idem{Store: store}
	gate, err := api.NewGate(api.Config{IPv6ClientPrefix: 56, RateLimitClients: 100,
		MaxBodyBytes: maxBody, MaxBodyBytesInFlight: 2 * maxBody, MaxBodyBytesPerClient: maxBody,
		MaxBodiesPerClient: 16, MinBodyRate: fl.MinBodyRate, BodyGrace: fl.BodyGrace, UploadHeld: fl.UploadHeld,
		Idem: idem, IdempotencyStale: 2 * time.Minute, Logger: log, Registerer: reg})
	if err != nil {
		tb.Fatal(err)
	}
	js, err := jobs.New(jc, jobs.Shared{Queue: queue, Payloads: store, Gate: gate, Idem: idem,
		Labels: tenant.NewLabels(api.MaxTenantLabels), MaxBodyBytes: maxBody, IdempotencyStale: 2 * time.Minute,
		Logger: log, Registerer: reg})
	if err != nil {
		tb.Fatal(err)
	}
	fs := files.New(fl, gate, store, log)
	s, err := New(Config{}, Shared{Payloads: store, Gate: gate, Jobs: js, Files: fs, FileLimits: fl, Logger: log, Registerer: reg})
	if err != nil {
		tb.Fatal(err)
	}
	mux := http.NewServeMux()
	js.Routes(mux)
	fs.Routes(mux)
	s.Routes(mux)
	return &stack{s, gate.Observe(api.Canonical(mux))}
}
