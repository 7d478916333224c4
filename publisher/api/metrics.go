package api

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Gate's: requests by route, and what its limits refused.
type metrics struct {
	requests      *prometheus.CounterVec   // route, code
	latency       *prometheus.HistogramVec // route
	rateLimited   *prometheus.CounterVec   // scope: client, global
	rateClients   prometheus.Gauge
	rateEvictions prometheus.Counter
	overloaded    prometheus.Counter
	bodyRefusals  *prometheus.CounterVec // reason: client_bodies, client_bytes, too_slow
	replays       prometheus.Counter
	bodyBytes     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "vramq", "publisher"
	m := &metrics{
		replays: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "idempotent_replays_total",
			Help: "POSTs answered from an earlier request with the same Idempotency-Key."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "HTTP requests by route pattern and status code."}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "request_seconds",
			Help:    "Time to answer an HTTP request, by route pattern.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"route"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rate_limited_total",
			Help: "Requests answered 429 because a rate limit was reached, by the limit: client or global."}, []string{"scope"}),
		rateClients: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "rate_limit_clients",
			Help: "Clients with a token bucket in memory (bounded by -rate-limit-clients)."}),
		rateEvictions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rate_limit_evictions_total",
			Help: "Token buckets still in use dropped to make room for a new client: the client table is full."}),
		overloaded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "overloaded_total",
			Help: "POSTs answered 503 overloaded because the bodies in flight were at -max-inflight-body-bytes."}),
		bodyRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "body_refusals_total",
			Help: "POSTs refused for their client's bodies in flight or their body's pace, by reason: client_bodies and client_bytes " +
				"(429 too_many_bodies, at -max-client-bodies or -max-client-body-bytes), too_slow (408 body_too_slow)."}, []string{"reason"}),
		bodyBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "body_bytes_in_flight",
			Help: "Bytes of request bodies held now, all clients together (bounded by -max-inflight-body-bytes)."}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.rateLimited, m.rateClients, m.rateEvictions, m.overloaded,
		m.bodyRefusals, m.bodyBytes, m.replays} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
