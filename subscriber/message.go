package subscriber

import (
	"container/list"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queue"
)

// A received message, and how it ends (Ack, Release, HandBack, DeadLetter, Cancel: the first end wins),
// with the times it reached each stage.

// A task is one received work message on its way through the stages, and
// it owns its end. It holds its lease (the receipt, kept visible by the
// keeper) and, once admitted, its admission hold, and it ends exactly once:
//
//   - Ack: its result, or its DLQ copy, is out; the message is deleted.
//   - Release(after): it goes back to the queue, visible again after after
//     (0: at once), for a failure that may be its own (a timeout, a model
//     error): the next receive counts towards its redrive.
//   - HandBack(after, why): a wait that is not its fault; a fresh copy goes
//     to the queue and the message is deleted, so its receive count starts
//     again.
//   - DeadLetter(kind, reason): it can never succeed; a copy goes to the
//     DLQ with the reason, then it is acked (or released, when the DLQ
//     cannot be reached).
//   - Cancel: its job was cancelled (DELETE /v1/jobs/{id}) before it ran;
//     its cancelled marker is written, then it is acked (or released, when
//     the marker cannot be written).
//
// The first end wins and the others do nothing, so no two paths can end a
// message twice; every end gives back the admission the message still holds
// first (hold.release), so no path can forget it. The SQS calls are the
// keeper's, which batches them with others' (keeper.ack, keeper.release,
// keeper.handBack). How a stage's outcome becomes one of these ends is
// decided in one place, Subscriber.end (below).
//
// (The keeper also lets go of a lease SQS reports lost, and releases any
// still held at shutdown.)
type task struct {
	lease  *lease
	work   *job.Work
	cost   int64          // working memory admission weighs, bytes: raw, corrected (correction.go)
	raw    int64          // the model's own estimate of its working memory, bytes
	factor float64        // the estimate correction cost was weighed with; 0 before admission
	class  int            // the model's length class (gpu.LengthClasser); 0 without one
	hold   *hold          // what it holds in admission (admit.go); nil before
	needs  backend.Vector // what it takes of the resources the model offers (backend.Offerer)
	// answered holds the answers a backoff came with for some of its items
	// while it waits (answers.go); nil when none.
	answered *answered
	// told is what its items' answers were, as they arrived, for a
	// message run in parts (run.go); nil for one that runs whole.
	told *toldAnswers
	// of is the message a run of some of its items is of (inferPart,
	// inferItems), whose answers held elsewhere count against this run's
	// (keptBytes); nil for a message itself.
	of *task
	// parts are how a message too large to run whole runs (admit.go); nil
	// for one that runs whole. cost and raw are then its largest part's.
	parts []part
	// ahead is the task's batch of one, launched while it waited for
	// admission; nil when it was not. infer takes it.
	ahead *launched
	// batch is the per-batch part of the cost its pending or running
	// batch holds once for all its messages (batchShare); nil when none.
	batch atomic.Pointer[batchShare]
	at    stamps // when it reached its stages (message.go)

	ends  *ends       // what ending it needs; shared by every task of a Subscriber
	ended atomic.Bool // an end was asked for: later ones do nothing
}

// ends is what a message needs to end itself: the keeper that sends the
// deletes and releases, the DLQ, and the payload bucket for markers.
type ends struct {
	keeper          *keeper
	dlq             queue.Sender
	payloads        Payloads // nil when none is configured
	m               *metrics
	log             *slog.Logger
	retry           backoff.Policy // a release's delay after a failure, by receive count
	maxMessageBytes int
	// settling is told when a chunk's marker is written (events.go).
	settling func(jobID string)
	// ended holds the IDs of the messages whose result or DLQ copy SQS
	// accepted. A receive of one whose lease lapsed may still be running,
	// and must not dead-letter a chunk that has its result (overtaken); and
	// one received again after its delete was lost must not run again,
	// to a result after its dead letter (Subscriber.accept).
	ended *idSet
}

// sendTimeout bounds sending results or a DLQ copy. It is not tied to
// shutdown: work that finished deserves its result.
const sendTimeout = 30 * time.Second

// claim reports whether this is t's first end, and gives back what t
// holds in admission if so.
func (t *task) claim() bool {
	if !t.ended.CompareAndSwap(false, true) {
		return false
	}
	t.hold.release()
	return true
}

// Ack deletes t's message: its result or its DLQ copy is out.
func (t *task) Ack() {
	if t.claim() {
		t.ends.keeper.ack(t.lease)
	}
}

// Release hands t's message back to the queue, visible again after after.
func (t *task) Release(after time.Duration) {
	if t.claim() {
		t.ends.keeper.release(t.lease, after)
	}
}

// retryAfter is how long a message that failed stays invisible before its
// next receive: Config.RetryDelay, doubled per receive after the first up
// to the longest delay SQS takes, in whole seconds as SQS counts them.
func (t *task) retryAfter() time.Duration {
	return t.ends.retry.Delay(t.lease.msg.ReceiveCount).Truncate(time.Second)
}

// HandBack hands t's message back to the queue at no cost to its receive
// count (keeper.handBack: a fresh copy, visible after after, then a delete
// of this one), for why: a wait that is not the message's fault
// (backpressure, a shutdown, a wait for the model longer than a lease
// holds, a lost or shrunk device). A release would be received again, one
// receive nearer the DLQ each time.
func (t *task) HandBack(after time.Duration, why string) {
	if t.claim() {
		t.ends.m.handedBack.WithLabelValues(why).Inc()
		t.ends.keeper.handBack(t.lease, after)
	}
}

// An outcome is what a stage found out about a message that it does not
// carry on: how the message must end, or that it waits. Stages return
// outcomes and Subscriber.end alone turns them into the message's ends, so
// how a message ends is read in one place.
type outcome struct {
	kind   outcomeKind
	after  time.Duration // release, handBack: how long the message stays invisible
	why    string        // handBack: the wait that is not its fault; deadLetter: the kind
	reason string        // deadLetter: the detail
}

type outcomeKind int

const (
	// carried: the message went on (its result is in the outbox, which
	// ends it once the result is out); nothing to end here.
	carried outcomeKind = iota
	// waits: the model asks to wait; the message waits holding its lease
	// and its admission, and runs again after the wait (pause.go).
	waits
	acked        // its result or its DLQ copy is out: delete it
	retried      // a failure that may be its own: release it after its retry delay
	released     // release it after after (a lost lease: at once)
	handedBack   // a wait that is not its fault: hand it back, visible after after
	deadLettered // it can never succeed: copy it to the DLQ with why and reason
	cancelled    // its job was cancelled before it ran
)

func endAck() outcome                        { return outcome{kind: acked} }
func endFailed() outcome                     { return outcome{kind: retried} }
func endRelease(after time.Duration) outcome { return outcome{kind: released, after: after} }
func endCancel() outcome                     { return outcome{kind: cancelled} }
func endDeadLetter(kind, reason string) outcome {
	return outcome{kind: deadLettered, why: kind, reason: reason}
}

// endHandBack is a wait that is not the message's fault, why (a
// vramq_subscriber_messages_handed_back_total label), after which it is
// visible again.
func endHandBack(after time.Duration, why string) outcome {
	return outcome{kind: handedBack, after: after, why: why}
}

// end ends t as o says. It is the one place an outcome becomes an end; a
// dead letter and a cancel write to the DLQ or the bucket before they end,
// so a caller that must not wait for them uses endAsync.
func (s *Subscriber) end(t *task, o outcome) {
	switch o.kind {
	case acked:
		t.Ack()
	case retried:
		t.Release(t.retryAfter())
	case released:
		t.Release(o.after)
	case handedBack:
		t.HandBack(o.after, o.why)
	case deadLettered:
		t.DeadLetter(o.why, o.reason)
	case cancelled:
		t.Cancel()
	}
}

// endAsync ends t as o says off the caller (a poller or a runner that must
// not wait for a DLQ or a bucket), giving back what t holds in admission at
// once. Run waits for it (aux) before the outbox closes.
func (s *Subscriber) endAsync(t *task, o outcome) {
	t.hold.release()
	s.aux.Go(func() { s.end(t, o) })
}

// maxReasonLen keeps the reason attribute readable and well inside SQS's
// limits.
const maxReasonLen = 1024

// AttrBodyTruncated, on a dead letter, gives the size in bytes of the
// original body when the copy carries only its beginning: the body, the
// reason and the attributes did not fit in one message together.
const AttrBodyTruncated = "vramq-body-truncated"

// DeadLetter copies t's message to the DLQ with why, writes the chunk's failed
// marker when there is a payload bucket, then deletes it from the work
// queue. When the DLQ cannot be reached the message is released for a later
// try; the queue's own redrive policy is the last resort.
//
// The copy always carries its reason, made safe for an attribute and cut to
// maxReasonLen. It goes whole when the DLQ takes it (the original body, and
// the original's attributes up to SQS's ten); a copy the DLQ refuses for good
// (too long with the reason, say) goes again cut to MaxMessageBytes: the
// original's attributes while they fit, the body cut to what does, with its
// size in AttrBodyTruncated; and, refused again, with its body escaped like
// the reason and only vramq's attributes.
func (t *task) DeadLetter(kind, reason string) {
	if !t.claim() {
		return
	}
	e, l := t.ends, t.lease
	if e.overtaken(t, kind) {
		return
	}
	reason = truncateUTF8(job.AttributeSafe(kind+": "+reason), maxReasonLen)
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	var err error
	for try := range 3 {
		errs, sendErr := e.dlq.Send(ctx, []queue.Outgoing{e.deadLetterCopy(l, reason, try)})
		if err = sendErr; err == nil {
			err = errs[0]
		}
		if !permanent(err) {
			break
		}
		e.log.Warn("the DLQ refuses the copy; sending it again cut to fit", "message_id", l.msg.ID, "reason", kind, "try", try+1, "err", err)
	}
	if err != nil {
		delay := t.retryAfter()
		e.log.Error("dead-lettering failed; message released for a retry", "message_id", l.msg.ID, "reason", kind, "err", err, "retry_in", delay)
		e.keeper.release(l, delay)
		return
	}
	e.ended.add(l.msg.ID)
	e.m.deadLettered.WithLabelValues(kind).Inc()
	k, _ := chunkOf(l.msg)
	e.log.Warn("message dead-lettered", "message_id", l.msg.ID, "reason", kind, "detail", reason,
		"job_id", k.JobID, "chunk", k.Chunk)
	if e.payloads != nil {
		// Before the delete, so that a crash in between redelivers the
		// message (a second DLQ copy) rather than leaving the chunk
		// dead-lettered without its marker.
		e.markFailed(t, reason)
	}
	e.keeper.ack(l)
}

// overtaken ends t without a DLQ copy, and reports true, when another
// receive of its message may have ended it or may yet: its result or DLQ
// copy is out from here (ends.ended), or t's lease has lapsed, so the
// message is back on the queue or with another receive, which decides for
// itself (and, if it runs out of memory alone too, dead-letters it then). A
// chunk must never be both answered and dead-lettered, and a receive that no
// longer holds its message does not know what the other did.
func (e *ends) overtaken(t *task, kind string) bool {
	l := t.lease
	switch {
	case e.ended.has(l.msg.ID):
		e.log.Warn("not dead-lettered: another receive of the message ended it", "message_id", l.msg.ID, "reason", kind)
		e.keeper.ack(l)
	case e.keeper.lapsed(l):
		e.log.Warn("not dead-lettered: its lease lapsed, so the message is back on the queue or with another receive",
			"message_id", l.msg.ID, "reason", kind)
		e.keeper.release(l, 0)
	default:
		return false
	}
	return true
}

// Cancel ends t, a chunk of a cancelled job that has not run: it writes
// the chunk's cancelled marker, which the publisher counts, then deletes the
// message. Written before the delete, so that a crash in between redelivers
// the message (and its marker is written then) rather than leaving the
// chunk gone and uncounted; when it cannot be written the message is
// released for a later try. The marker is written only where none is, so a
// redelivery keeps the first one.
func (t *task) Cancel() {
	if !t.claim() {
		return
	}
	e, l, w := t.ends, t.lease, t.work
	body, err := json.Marshal(job.CancelledMarker{V: job.Version, JobID: w.JobID, Chunk: w.Chunk, MessageID: l.msg.ID,
		At: time.Now().UTC().Format(time.RFC3339)})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
		_, _, err = e.payloads.PutIfAbsent(ctx, job.CancelledKey(w.JobID, w.Chunk), body)
		cancel()
	}
	if err != nil {
		delay := t.retryAfter()
		e.log.Warn("writing a cancelled marker failed; message released for a retry", "message_id", l.msg.ID,
			"job_id", w.JobID, "chunk", w.Chunk, "err", err, "retry_in", delay)
		e.keeper.release(l, delay)
		return
	}
	e.m.cancelled.Inc()
	e.settling(w.JobID)
	e.log.Info("chunk of a cancelled job deleted unrun", "message_id", l.msg.ID, "job_id", w.JobID, "chunk", w.Chunk)
	e.keeper.ack(l)
}

// deadLetterCopy is the DLQ copy of l's message with reason: whole on try 0,
// cut to MaxMessageBytes on try 1, cut and escaped with only vramq's
// attributes on try 2.
func (e *ends) deadLetterCopy(l *lease, reason string, try int) queue.Outgoing {
	// SQS allows ten attributes a message: ours first, then the original's,
	// in name order (one is kept for AttrBodyTruncated when cutting).
	attrs := map[string]string{job.AttrReason: reason, job.AttrSource: job.AttributeSafe(l.msg.ID)}
	const truncatedReserve = len(AttrBodyTruncated) + len(job.AttrDataType) + 20
	limit := e.maxMessageBytes - truncatedReserve
	if try < 2 {
		for _, k := range slices.Sorted(maps.Keys(l.msg.Attributes)) {
			if len(attrs) == 9 {
				break
			}
			v := l.msg.Attributes[k]
			if _, ours := attrs[k]; ours || k == AttrBodyTruncated {
				continue
			}
			if try == 1 && job.MessageSize("", attrs)+len(k)+len(job.AttrDataType)+len(v) > limit/2 {
				continue
			}
			attrs[k] = v
		}
	}
	body := l.msg.Body
	if try == 0 {
		return queue.Outgoing{Body: body, Attributes: attrs}
	}
	if try == 2 {
		body = job.AttributeSafe(body)
	}
	if room := limit - job.MessageSize("", attrs); len(body) > room {
		attrs[AttrBodyTruncated] = strconv.Itoa(len(l.msg.Body))
		body = truncateUTF8(body, room)
	}
	if body == "" {
		body = "-" // SQS refuses an empty body
	}
	return queue.Outgoing{Body: body, Attributes: attrs}
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

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

// maxIDs bounds the message IDs an idSet remembers; the oldest are
// forgotten first, which at worst batches a suspect again, or runs a
// message whose result is out again.
const maxIDs = 10_000

// An idSet is a bounded set of message IDs, safe for concurrent use:
// running.suspects and ends.ended.
type idSet struct {
	mu sync.Mutex
	// set holds each id's place in order, oldest add first, so that clear
	// takes the id out of both: a place left behind would forget the id
	// when it came up, though the id was added again since.
	set   map[string]*list.Element
	order list.List
}

func newIDSet() *idSet { return &idSet{set: map[string]*list.Element{}} }

func (s *idSet) add(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if _, ok := s.set[id]; ok {
			continue
		}
		if len(s.set) >= maxIDs {
			delete(s.set, s.order.Remove(s.order.Front()).(string))
		}
		s.set[id] = s.order.PushBack(id)
	}
}

func (s *idSet) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.set[id]
	return ok
}

func (s *idSet) clear(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.set[id]; ok {
		s.order.Remove(e)
		delete(s.set, id)
	}
}
