package subscriber

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/vramq/vramq/job"
)

// sendTimeout bounds sending results or a DLQ copy. It is not tied to
// shutdown: work that finished deserves its result.
const sendTimeout = 30 * time.Second

// settle gives back a task's admission. Its lease is finished separately.
// The bytes leave the in-flight count before the weight goes back, or the
// next admission could be counted while this one still is, and the peak
// would show more than the budget for an instant.
func (s *Subscriber) settle(t *task) {
	if t.cost > 0 {
		s.m.inflight.Sub(float64(t.cost))
		s.inflight.Add(-t.cost)
		t.cost = 0
	}
	if t.weight > 0 {
		s.adm.release(t.weight)
		t.weight = 0
	}
}

// finish settles t and deletes its message (release false) or hands it back
// after delay.
func (s *Subscriber) finish(t *task, release bool, delay time.Duration) {
	s.settle(t)
	s.keeper.finish(t.lease, release, delay)
}

// complete sends one result message per task, through the outbox, which
// shares SendMessageBatch calls across batches; once a result is on the
// results queue its message is deleted, and a message whose result did not
// go out is released for a retry. With a payload bucket each result is
// written there first, and one too large for a message goes out as a
// reference to that object. The caller has promised the outbox len(tasks)
// results (see outbox.promise).
func (s *Subscriber) complete(tasks []*task, outs [][]job.Output) {
	// Attribute names and values count towards SQS's size limits too.
	const attrOverhead = 128
	model := s.cfg.Model.Name()
	results := make([]job.Result, len(tasks))
	bodies := make([][]byte, len(tasks))
	errs := make([]error, len(tasks))
	for i, t := range tasks {
		results[i] = job.Result{
			V: job.Version, JobID: t.work.JobID, Chunk: t.work.Chunk, Model: model,
			Outputs: outs[i], Attempt: t.lease.msg.ReceiveCount,
			WorkerMS: time.Since(t.lease.received).Milliseconds(),
		}
		bodies[i], errs[i] = json.Marshal(results[i])
	}
	var refs []*job.PayloadRef
	if s.payloads != nil {
		refs = s.storeResults(results, bodies)
	}
	out := make([]outResult, 0, len(tasks))
	for i, t := range tasks {
		r, body, err := results[i], bodies[i], errs[i]
		if err != nil {
			s.deadLetter(t.lease, "result_too_large", "encoding the result: "+err.Error())
			s.settle(t)
			continue
		}
		if refs != nil && refs[i] == nil {
			// Consumers of the bucket expect every result in it.
			s.log.Warn("result not stored; message released for a retry", "message_id", t.lease.msg.ID)
			s.finish(t, true, s.retryDelay(t.lease.msg.ReceiveCount))
			continue
		}
		if len(body)+attrOverhead > s.cfg.MaxMessageBytes && refs != nil {
			r.Outputs, r.Ref = nil, refs[i]
			body, err = json.Marshal(r)
		}
		if err != nil || len(body)+attrOverhead > s.cfg.MaxMessageBytes {
			reason := fmt.Sprintf("result of %d bytes exceeds the %d-byte message limit", len(body), s.cfg.MaxMessageBytes)
			if refs == nil {
				reason += " and no payload bucket is configured"
			}
			if err != nil {
				reason = "encoding the result: " + err.Error()
			}
			s.deadLetter(t.lease, "result_too_large", reason)
			s.settle(t)
			continue
		}
		out = append(out, outResult{
			msg:  Outgoing{Body: string(body), Attributes: job.Attributes(r.Key())},
			size: len(body) + attrOverhead,
			t:    t,
		})
	}
	s.outbox.add(out, len(tasks))
}

// maxReasonLen keeps the reason attribute readable and well inside SQS's
// limits.
const maxReasonLen = 1024

// deadLetter copies a message to the DLQ with why, writes the chunk's failed
// marker when there is a payload bucket, then deletes it from the work
// queue. When the DLQ cannot be reached the message is released for a later
// try; the queue's own redrive policy is the last resort.
func (s *Subscriber) deadLetter(l *lease, kind, reason string) {
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	// SQS allows ten attributes a message: ours first, then the original's.
	attrs := map[string]string{job.AttrReason: kind + ": " + reason, job.AttrSource: l.msg.ID}
	for _, k := range slices.Sorted(maps.Keys(l.msg.Attributes)) {
		if len(attrs) == 10 {
			break
		}
		if _, ours := attrs[k]; !ours {
			attrs[k] = l.msg.Attributes[k]
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	errs, err := s.dlq.Send(ctx, []Outgoing{{Body: l.msg.Body, Attributes: attrs}})
	if err == nil {
		err = errs[0]
	}
	if err != nil {
		delay := s.retryDelay(l.msg.ReceiveCount)
		s.log.Error("dead-lettering failed; message released for a retry", "message_id", l.msg.ID, "reason", kind, "err", err, "retry_in", delay)
		s.keeper.finish(l, true, delay)
		return
	}
	s.m.deadLettered.WithLabelValues(kind).Inc()
	s.log.Warn("message dead-lettered", "message_id", l.msg.ID, "reason", kind, "detail", reason,
		"job_id", l.msg.Attributes[job.AttrJobID], "chunk", l.msg.Attributes[job.AttrChunk])
	if s.payloads != nil {
		// Before the delete, so that a crash in between redelivers the
		// message (a second DLQ copy) rather than leaving the chunk
		// dead-lettered without its marker.
		s.markFailed(l, attrs[job.AttrReason])
	}
	s.keeper.finish(l, false, 0)
}
