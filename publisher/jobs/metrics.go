package jobs

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the job routes' Prometheus series, all vramq_publisher_*.
type metrics struct {
	jobs          prometheus.Counter
	chunksSent    prometheus.Counter
	claimChecked  prometheus.Counter
	sqsCalls      *prometheus.CounterVec // outcome
	sendRetries   prometheus.Counter
	failedEntries *prometheus.CounterVec // code
	tenantJobs    *prometheus.CounterVec // tenant (tenant.Labels)
	tenantItems   *prometheus.CounterVec // tenant
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "vramq", "publisher"
	m := &metrics{
		jobs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "jobs_accepted_total",
			Help: "Jobs answered 202 with every chunk on the queue (replays not counted)."}),
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
		tenantJobs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "tenant_jobs_accepted_total",
			Help: "Jobs answered 202 with every chunk on the queue, by tenant: the configured keys' names, the first 100 others, " +
				"then \"other tenants\"; \"no tenant\" when none was named."}, []string{"tenant"}),
		tenantItems: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "tenant_items_accepted_total",
			Help: "Items of the jobs in vramq_publisher_tenant_jobs_accepted_total, by tenant (labelled the same way)."}, []string{"tenant"}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.jobs, m.chunksSent, m.claimChecked, m.sqsCalls,
		m.sendRetries, m.failedEntries, m.tenantJobs, m.tenantItems} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
