package jobs

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/config"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/publisher/api"
)

// testMaxBody is the body limit of newTestService's gate: publisher's
// default (DefaultConfig.MaxBodyBytes), which this package cannot import.
const testMaxBody = 32 << 20

// newTestService builds the job routes of cfg over store as publisher.New
// wires them: behind a gate of keys with the publisher's default body
// limits, on a queue that takes every message at once. The handler serves
// the routes as publisher.Handler does.
func newTestService(t testing.TB, cfg Config, store *payload.Store, keys ...string) (*Service, http.Handler) {
	t.Helper()
	cfg.SetDefaults()
	reg, log := prometheus.NewRegistry(), slog.New(slog.DiscardHandler)
	idem := api.NewMemIdem(time.Hour, 1000)
	gate, err := api.NewGate(api.Config{APIKeys: keys, IPv6ClientPrefix: 56, RateLimitClients: 100,
		MaxBodyBytes: testMaxBody, MaxBodyBytesInFlight: 2 * testMaxBody, MaxBodyBytesPerClient: testMaxBody,
		MaxBodiesPerClient: 16, MinBodyRate: 16 << 10, BodyGrace: 10 * time.Second, UploadHeld: payload.UploadPartBytes,
		Idem: idem, IdempotencyStale: time.Minute, Logger: log, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	take := queueFunc(func(_ context.Context, entries []Entry) ([]error, error) { return make([]error, len(entries)), nil })
	s, err := New(cfg, Shared{Queue: take, Payloads: store, Gate: gate, Idem: idem,
		Labels: tenant.NewLabels(api.MaxTenantLabels, gate.Tenants()...), MaxBodyBytes: testMaxBody,
		IdempotencyStale: time.Minute, Logger: log, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	s.Routes(mux)
	return s, gate.Observe(api.Canonical(mux))
}

// validate is cfg, defaults given, as Validate finds it.
func validate(cfg Config) error {
	cfg.SetDefaults()
	var problems config.Problems
	cfg.Validate(&problems)
	return problems.Err()
}
