package batches

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the batches' Prometheus series, all vramq_publisher_* (the
// jobs' are publisher/jobs').
type metrics struct {
	batchesEnded *prometheus.CounterVec // status (batchstate.go)
	sweepErrors  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "vramq", "publisher"
	m := &metrics{
		batchesEnded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "batches_ended_total",
			Help: "Batches this process's finalizer or sweeper ended, by status: completed, cancelled, expired, failed."}, []string{"status"}),
		sweepErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "batch_sweep_errors_total",
			Help: "Batches the sweeper or a nudge could not advance (an S3 error): tried again at the next pass."}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.batchesEnded, m.sweepErrors} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
