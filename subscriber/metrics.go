package subscriber

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/model/backend"
)

// metrics are the subscriber's Prometheus series, all prefixed vramq_subscriber_.
type metrics struct {
	received      prometheus.Counter
	redelivered   prometheus.Counter
	admitted      prometheus.Counter
	held          prometheus.Gauge
	waiting       prometheus.Gauge
	prefetch      prometheus.Gauge
	inflight      prometheus.Gauge
	inflightPeak  prometheus.Gauge
	budget        prometheus.Gauge
	budgetMax     prometheus.Gauge
	deviceTotal   prometheus.Gauge
	deviceFree    prometheus.Gauge
	deviceProcess prometheus.Gauge
	batchSize     prometheus.Histogram
	batchBytes    prometheus.Histogram
	batchSeconds  prometheus.Histogram
	// stage is each message's time in one stage of its way through the
	// subscriber (message.go); messageSeconds its whole time, from its
	// receive to its result accepted by SQS.
	stage          *prometheus.HistogramVec
	stages         map[string]prometheus.Observer // stage's series, by stage
	messageSeconds prometheus.Histogram
	oomRetries     prometheus.Counter
	results        prometheus.Counter
	released       *prometheus.CounterVec
	deadLettered   *prometheus.CounterVec
	cancelled      prometheus.Counter
	itemsFailed    prometheus.Counter
	deleted        prometheus.Counter
	extensions     prometheus.Counter
	leasesLost     *prometheus.CounterVec
	requests       *prometheus.CounterVec
	batchLimit     prometheus.Gauge

	batchLimitChanges  *prometheus.CounterVec
	estimateCorrection prometheus.Gauge

	claimChecks     *prometheus.CounterVec
	resultsStored   prometheus.Counter
	payloadRequests *prometheus.CounterVec
	events          *prometheus.CounterVec

	protected        prometheus.Gauge
	protectionErrors prometheus.Counter

	// tenantDone is results sent by the vramq-tenant attribute, labelled by
	// tenants (tenant.Labels): anyone who can send to the queue names the
	// tenant, so only the configured tenants (Config.Tenants) have labels
	// of their own.
	backedOff     *prometheus.CounterVec
	pausedUntil   prometheus.Gauge
	needsOperator prometheus.Gauge
	handedBack    *prometheus.CounterVec
	answersKept   prometheus.Counter
	// answersStored and answersRecalled count the answer store's items
	// (answers.go).
	answersStored, answersRecalled prometheus.Counter
	modelWaiting                   prometheus.Gauge

	tenantDone *prometheus.CounterVec
	tenants    *tenant.Labels
}

// memorySeries names the series of what admission weighs messages by, in
// the unit of the memory that bounds the backend (backend.Memory): a
// GPU's bytes, or a model server's KV tokens. The two are different
// resources, so their series have different names, not one name whose
// unit depends on the deployment.
type memorySeries struct {
	inflight, peak, budget, budgetMax, total, free, process, batch string
	what, unit                                                     string  // "working memory", "bytes"
	batchFirst                                                     float64 // the batch histogram's first bucket
}

func memorySeriesOf(u backend.Unit) memorySeries {
	if u == backend.KVTokens {
		return memorySeries{inflight: "inflight_kv_tokens", peak: "inflight_kv_tokens_peak", budget: "budget_kv_tokens",
			budgetMax: "budget_max_kv_tokens", total: "kv_cache_total_tokens", free: "kv_cache_free_tokens",
			process: "kv_cache_process_tokens", batch: "batch_kv_tokens", what: "KV cache", unit: "KV tokens", batchFirst: 64}
	}
	return memorySeries{inflight: "inflight_bytes", peak: "inflight_bytes_peak", budget: "budget_bytes",
		budgetMax: "budget_max_bytes", total: "device_memory_total_bytes", free: "device_memory_free_bytes",
		process: "device_memory_process_bytes", batch: "batch_bytes", what: "working memory", unit: "bytes", batchFirst: 1 << 20}
}

// newMetrics registers the subscriber's series on reg, those of memory in
// unit (memorySeries); tenants are the configured tenant names
// (Config.Tenants).
func newMetrics(reg prometheus.Registerer, unit backend.Unit, tenants ...string) *metrics {
	f := promauto.With(reg)
	ms := memorySeriesOf(unit)
	const ns, sub = "vramq", "subscriber"
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: ns, Subsystem: sub, Name: name, Help: help}
	}
	counter := func(name, help string) prometheus.Counter {
		return f.NewCounter(prometheus.CounterOpts(opts(name, help)))
	}
	gauge := func(name, help string) prometheus.Gauge {
		return f.NewGauge(prometheus.GaugeOpts(opts(name, help)))
	}
	m := &metrics{
		received: counter("messages_received_total", "Messages received from the work queue."),
		redelivered: counter("messages_redelivered_total", "Messages received that had been received before "+
			"(ApproximateReceiveCount above 1): released, timed out, or lost by a consumer."),
		admitted: counter("messages_admitted_total", "Messages admitted onto the device."),
		held:     gauge("messages_held", "Messages whose lease this subscriber holds (waiting or running)."),
		waiting:  gauge("messages_waiting", "Messages received but not yet started (the prefetch buffer)."),
		prefetch: gauge("prefetch", "Messages the subscriber lets wait received and not started: Prefetch, or as many "+
			"as start within half of AdmitTimeout at the rate they have started lately, at least 1."),
		inflight:     gauge(ms.inflight, "Estimated "+ms.what+" of admitted messages, in "+ms.unit+"."),
		inflightPeak: gauge(ms.peak, "Highest estimated "+ms.what+" admitted at once, in "+ms.unit+"."),
		budget: gauge(ms.budget, "Budget admission works against now, in "+ms.unit+" (vram strategy): "+
			"free "+ms.what+" plus what this process's work holds of it, less the reserve, refreshed while running."),
		budgetMax: gauge(ms.budgetMax, "Largest budget the device could give, in "+ms.unit+" (vram strategy): "+
			"its total less weights and reserve; a message estimated above it runs in parts that fit, or is dead-lettered "+
			"when no item fits alone."),
		deviceTotal: gauge(ms.total, "The device's "+ms.what+" in total, in "+ms.unit+" (simulated when the device is sim, "+
			"or a model server's cache is not followed)."),
		deviceFree: gauge(ms.free, "The device's "+ms.what+" free at the last reading (budget refresh or batch), in "+ms.unit+"."),
		deviceProcess: gauge(ms.process, "The device's "+ms.what+" this process holds at the last reading, in "+ms.unit+
			", as the device reports it per process (NVML; a model server's followed cache); 0 when it cannot tell."),
		batchSize: f.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "batch_messages",
			Help: "Messages per batch run on the device.", Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 24, 32}}),
		batchBytes: f.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: ms.batch,
			Help: "Estimated " + ms.what + " per batch, in " + ms.unit + ".", Buckets: prometheus.ExponentialBuckets(ms.batchFirst, 4, 10)}),
		batchSeconds: f.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "batch_seconds",
			Help: "Time to run one batch on the device.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}),
		stage: f.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "stage_seconds",
			Help: "Each message's time in one stage, by stage: admit (receive to admitted: decode, fetch, buffer, admission), " +
				"batch (admitted to its batch's start), run (its batch's run on the model), encode (run end to its result's " +
				"SendMessageBatch call: encode, store, outbox), send (that call, to its result accepted by SQS), " +
				"delete (result accepted to its delete confirmed).",
			Buckets: stageBuckets}, []string{"stage"}),
		messageSeconds: f.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "message_seconds",
			Help:    "Each message's time in the subscriber, from its receive to its result accepted by SQS.",
			Buckets: stageBuckets}),
		oomRetries: counter("oom_retries_total", "Batches that ran out of device memory and were split or run alone."),
		results:    counter("results_sent_total", "Result messages sent."),
		released: f.NewCounterVec(prometheus.CounterOpts(opts("messages_released_total",
			"Messages handed back to the queue (visibility changed) instead of deleted, by delay kind.")), []string{"delay"}),
		deadLettered: f.NewCounterVec(prometheus.CounterOpts(opts("messages_dead_lettered_total",
			"Messages sent to the DLQ, by reason.")), []string{"reason"}),
		backedOff: f.NewCounterVec(prometheus.CounterOpts(opts("messages_backed_off_total",
			"Messages whose batch the model (a model server) asked to wait (fault.ErrBackoff): they wait, holding their "+
				"leases, until the time it said, by reason: rate_limit, overloaded.")), []string{"reason"}),
		handedBack: f.NewCounterVec(prometheus.CounterOpts(opts("messages_handed_back_total",
			"Messages handed back to the queue as a fresh copy (its receive count starts again) and deleted, for a wait "+
				"that is not theirs, by reason: backpressure (not admitted in time), shutdown, wait (a wait for the "+
				"model longer than a lease holds), device_lost, device_shrunk.")), []string{"reason"}),
		answersKept: counter("answers_kept_total", "Items answered before a backoff in a message that waits for the model: "+
			"their answers are kept on the waiting message, and only its other items are asked again."),
		answersStored: counter("answers_stored_total", "Items' answers kept in the payload bucket as the model "+
			"answered them (a model server's), until their chunk's result is out, so that a message handed back or "+
			"redelivered asks only for the items without one."),
		answersRecalled: counter("answers_recalled_total", "Items of redelivered messages whose kept answers were read "+
			"from the payload bucket instead of being asked of the model again."),
		modelWaiting: gauge("messages_waiting_for_model", "Messages held, their leases extended, while the model asks "+
			"to wait (a backoff, or a needed operator until a probe gets through)."),
		pausedUntil: gauge("receive_paused_until_seconds", "Unix time until which receiving is paused by the latest "+
			"backoff (fault.ErrBackoff); 0 when none has come. Receiving resumes once it has passed."),
		needsOperator: gauge("needs_operator", "1 while the model says nothing runs until a person acts "+
			"(fault.ErrNeedsOperator: a spent quota, a refused key, an unknown model): receiving has stopped, one probe "+
			"runs every -operator-probe, and readiness fails; 0 again once a probe succeeds."),
		cancelled: counter("messages_cancelled_total",
			"Messages of cancelled jobs (DELETE /v1/jobs/{id}) deleted without running, their cancelled marker written."),
		itemsFailed: counter("items_failed_total",
			"Items answered with an error in their chunk's result, the chunk's other items kept: refused by the model "+
				"(invalid_input), or estimated alone above the largest budget (too_large)."),
		deleted:    counter("messages_deleted_total", "Messages deleted from the work queue after their result or DLQ copy was sent."),
		extensions: counter("visibility_extensions_total", "Visibility timeout extensions (heartbeats) that succeeded, per message."),
		leasesLost: f.NewCounterVec(prometheus.CounterOpts(opts("leases_lost_total",
			"Leases lost (receipt handle invalid or max hold passed), by where it was noticed.")), []string{"at"}),
		requests: f.NewCounterVec(prometheus.CounterOpts(opts("sqs_requests_total",
			"SQS API calls made, by action and outcome.")), []string{"action", "outcome"}),
		batchLimit: gauge("batch_limit_messages", "Most messages per batch now: lowered after an out-of-memory split, "+
			"probed back up after a run of clean full batches or a budget increase."),
		batchLimitChanges: f.NewCounterVec(prometheus.CounterOpts(opts("batch_limit_changes_total",
			"Changes of the batch limit, by cause: oom (lowered after an out-of-memory split), probe (raised one step), "+
				"probe_failed (lowered: the probe ran out of memory before a full batch confirmed it).")), []string{"cause"}),
		estimateCorrection: gauge("estimate_correction_ratio",
			"Factor vram admission multiplies the model's estimates by: raised after an out-of-memory error, back towards 1 "+
				"after clean batches."),
		claimChecks: f.NewCounterVec(prometheus.CounterOpts(opts("claim_checks_total",
			"Claim-checked items fetched from the payload bucket, by outcome: "+
				"ok, missing, corrupt (size or SHA-256), invalid (not the item), error (may pass).")), []string{"outcome"}),
		resultsStored: counter("results_stored_total",
			"Chunk results in the payload bucket (written, or found there from an earlier attempt)."),
		payloadRequests: f.NewCounterVec(prometheus.CounterOpts(opts("payload_requests_total",
			"Payload bucket (S3) operations, by operation and outcome; put_if_absent is a read and a conditional write, "+
				"create a conditional write and, only when it is refused, a read.")),
			[]string{"op", "outcome"}),
		events: f.NewCounterVec(prometheus.CounterOpts(opts("completion_events_total",
			"Job completion events (docs/events.md): sent (a job's first), corrected (a later revision), "+
				"error (a try of a check or a publish failed; tried again after a backoff), dropped (a check gave up after its tries).")),
			[]string{"outcome"}),
		protected: gauge("task_protected", "1 while the ECS task is protected from scale-in (messages held), else 0."),
		protectionErrors: counter("task_protection_errors_total",
			"Calls to the ECS agent's task protection endpoint that failed (each is retried)."),
		tenantDone: f.NewCounterVec(prometheus.CounterOpts(opts("tenant_results_sent_total",
			"Result messages sent, by the work message's vramq-tenant attribute: the tenants named by -tenants, "+
				"\"other tenants\" for any other name, \"no tenant\" without a valid one.")), []string{"tenant"}),
		// No label is given to a name first seen on the queue: its sender
		// chose it, and could take the labels from the real tenants.
		tenants: tenant.NewLabels(0, tenants...),
	}
	m.stages = make(map[string]prometheus.Observer, len(stages))
	for _, st := range stages {
		m.stages[st] = m.stage.WithLabelValues(st)
	}
	return m
}
