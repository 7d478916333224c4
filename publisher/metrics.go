package publisher

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the publisher's Prometheus series, all vramq_publisher_*.
type metrics struct {
	requests      *prometheus.CounterVec   // route, code
	latency       *prometheus.HistogramVec // route
	jobs          prometheus.Counter
	replays       prometheus.Counter
	chunksSent    prometheus.Counter
	claimChecked  prometheus.Counter
	sqsCalls      *prometheus.CounterVec // outcome
	sendRetries   prometheus.Counter
	failedEntries *prometheus.CounterVec // code
	rateLimited   *prometheus.CounterVec // scope: client, global
	rateClients   prometheus.Gauge
	rateEvictions prometheus.Counter
	overloaded    prometheus.Counter
	bodyRefusals  *prometheus.CounterVec // reason: client_bodies, client_bytes, too_slow
	bodyBytes     prometheus.Gauge
	tenantJobs    *prometheus.CounterVec // tenant (tenant.Labels)
	tenantItems   *prometheus.CounterVec // tenant
	batchesEnded  *prometheus.CounterVec // status (batchstate.go)
	sweepErrors   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "vramq", "publisher"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "HTTP requests by route pattern and status code."}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "request_seconds",
			Help:    "Time to answer an HTTP request, by route pattern.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"route"}),
		jobs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "jobs_accepted_total",
			Help: "Jobs answered 202 with every chunk on the queue (replays not counted)."}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "idempotent_replays_total",
			Help: "POSTs answered from an earlier request with the same Idempotency-Key."}),
		chunksSent: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "chunks_sent_total",
			Help: "Work messages SQS confirmed."}),
		claimChecked: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "items_claim_checked_total",
			Help: "Items stored in S3 because they were too large for a message."}),
		sqsCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "sqs_requests_total",
			Help: "SendMessageBatch calls by outcome (ok, or error after the SDK's retries)."}, []string{"outcome"}),
		sendRetries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "sqs_send_retries_total",
			Help: "SendMessageBatch entries sent again after SQS listed them in Failed."}),
		failedEntries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "sqs_failed_entries_total",
			Help: "SendMessageBatch entries SQS listed in Failed, by error code."}, []string{"code"}),
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
		tenantJobs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "tenant_jobs_accepted_total",
			Help: "Jobs answered 202 with every chunk on the queue, by tenant: the configured keys' names, the first 100 others, " +
				"then \"other tenants\"; \"no tenant\" when none was named."}, []string{"tenant"}),
		tenantItems: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "tenant_items_accepted_total",
			Help: "Items of the jobs in vramq_publisher_tenant_jobs_accepted_total, by tenant (labelled the same way)."}, []string{"tenant"}),
		batchesEnded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "batches_ended_total",
			Help: "Batches this process's finalizer or sweeper ended, by status: completed, cancelled, expired, failed."}, []string{"status"}),
		sweepErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "batch_sweep_errors_total",
			Help: "Batches the sweeper or a nudge could not advance (an S3 error): tried again at the next pass."}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.jobs, m.replays, m.chunksSent, m.claimChecked, m.sqsCalls,
		m.sendRetries, m.failedEntries,
		m.rateLimited, m.rateClients, m.rateEvictions, m.overloaded, m.bodyRefusals, m.bodyBytes, m.tenantJobs, m.tenantItems,
		m.batchesEnded, m.sweepErrors} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
