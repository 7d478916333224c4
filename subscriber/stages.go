package subscriber

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A message's way through the subscriber, timed per stage in
// vramq_subscriber_stage_seconds{stage} (docs/metrics.md), so that where
// its latency goes is measured rather than guessed (bench/README.md,
// "Adaptive batch delay"). Each stage is observed once per message, on the
// way to a result only: a message that ends otherwise (released,
// dead-lettered) leaves the stages it never reached unobserved.
const (
	stageAdmit  = "admit"  // receive (lease.received) to admitted
	stageBatch  = "batch"  // admitted to the start of its first batch
	stageRun    = "run"    // its successful batch's run on the model
	stageEncode = "encode" // run end to its result's SendMessageBatch call: encode, store, outbox
	stageSend   = "send"   // that call, to its result accepted by SQS
	stageDelete = "delete" // result accepted to its delete confirmed
)

// stageBuckets run from 100 µs to a minute, a factor of √2 apart: light
// load puts a stage at a fraction of a millisecond to a few, and a
// histogram's median is only as fine as its buckets.
var stageBuckets = prometheus.ExponentialBucketsRange(100e-6, 60, 40)

// stamps are the times a task reached its stages; zero before.
type stamps struct {
	admitted time.Time
	started  time.Time // its first batch's start
	ran      time.Time // its successful batch's end
	sending  time.Time // its result's SendMessageBatch call's start
}

// stages are the stage histogram's series, one per stage, looked up once:
// a message observes five or six.
var stages = []string{stageAdmit, stageBatch, stageRun, stageEncode, stageSend, stageDelete}

func (m *metrics) observeStage(stage string, from, to time.Time) {
	if from.IsZero() {
		return
	}
	m.stages[stage].Observe(to.Sub(from).Seconds())
}

// admitted stamps t as admitted now.
func (s *Subscriber) stampAdmitted(t *task) {
	t.at.admitted = time.Now()
	s.m.observeStage(stageAdmit, t.lease.received, t.at.admitted)
}

// stampStarted stamps tasks as started in a batch at start, the first time
// only: a retry after an out-of-memory split is part of the run.
func (s *Subscriber) stampStarted(tasks []*task, start time.Time) {
	for _, t := range tasks {
		if t.at.started.IsZero() {
			t.at.started = start
			s.m.observeStage(stageBatch, t.at.admitted, start)
		}
	}
}

// stampRan stamps tasks as run, by a batch that started at start, at end.
func (s *Subscriber) stampRan(tasks []*task, start, end time.Time) {
	for _, t := range tasks {
		t.at.ran = end
		s.m.observeStage(stageRun, start, end)
	}
}

// stampSending stamps rs as going out in a call that starts at start.
func (m *metrics) stampSending(rs []outResult, start time.Time) {
	for _, r := range rs {
		if r.t.at.sending.IsZero() {
			r.t.at.sending = start
			m.observeStage(stageEncode, r.t.at.ran, start)
		}
	}
}

// stampSent observes t's send stage and its whole time, its result
// accepted by SQS now, and stamps its lease for the delete stage.
func (s *Subscriber) stampSent(t *task) {
	now := time.Now()
	s.m.observeStage(stageSend, t.at.sending, now)
	s.m.messageSeconds.Observe(now.Sub(t.lease.received).Seconds())
	t.lease.resultSent = now
}
