package subscriber

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

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
//
// A result that can never be sent is dead-lettered with the reason, never
// stored or retried: one whose outputs do not encode (NaN or ±Inf), one
// over MaxResultBytes, one too large for a message without a bucket, and
// one that S3 or SQS refuse for good.
func (s *Subscriber) complete(tasks []*task, outs [][]job.Output) {
	model := s.cfg.Model.Name()
	results := make([]job.Result, len(tasks))
	var keep []*task
	var kept []job.Result
	var keptBodies [][]byte
	for i, t := range tasks {
		results[i] = job.Result{
			V: job.Version, JobID: t.work.JobID, Chunk: t.work.Chunk, Model: model,
			Outputs: outs[i], Attempt: t.lease.msg.ReceiveCount,
			WorkerMS: time.Since(t.lease.received).Milliseconds(),
		}
		body, err := encodeResult(&results[i])
		switch {
		case err != nil:
			s.deadLetter(t.lease, "invalid_output", unencodable(outs[i], err))
			s.settle(t)
			continue
		case len(body) > s.cfg.MaxResultBytes:
			s.deadLetter(t.lease, "result_too_large", fmt.Sprintf("result of %d bytes (%d items) exceeds the %d-byte result limit",
				len(body), len(outs[i]), s.cfg.MaxResultBytes))
			s.settle(t)
			continue
		}
		keep, kept, keptBodies = append(keep, t), append(kept, results[i]), append(keptBodies, body)
	}
	var refs []*job.PayloadRef
	var storeErrs []error
	if s.payloads != nil {
		refs, storeErrs = s.storeResults(kept, keptBodies)
	}
	out := make([]outResult, 0, len(keep))
	for i, t := range keep {
		r, body := kept[i], keptBodies[i]
		if refs != nil && refs[i] == nil {
			if permanent(storeErrs[i]) {
				s.deadLetter(t.lease, "result_refused", "the payload bucket refuses the result: "+refusalCode(storeErrs[i]))
				s.settle(t)
				continue
			}
			// Consumers of the bucket expect every result in it.
			s.log.Warn("result not stored; message released for a retry", "message_id", t.lease.msg.ID)
			s.finish(t, true, s.retryDelay(t.lease.msg.ReceiveCount))
			continue
		}
		attrs := job.Attributes(r.Key())
		var err error
		if job.MessageSize(string(body), attrs) > s.cfg.MaxMessageBytes && refs != nil {
			r.Outputs, r.Ref = nil, refs[i]
			body, err = encodeResult(&r)
		}
		if size := job.MessageSize(string(body), attrs); err != nil || size > s.cfg.MaxMessageBytes {
			reason := fmt.Sprintf("result message of %d bytes exceeds the %d-byte message limit", size, s.cfg.MaxMessageBytes)
			if refs == nil {
				reason += " and no payload bucket is configured"
			}
			if err != nil {
				reason = "encoding the result's reference: " + err.Error()
			}
			s.deadLetter(t.lease, "result_too_large", reason)
			s.settle(t)
			continue
		}
		out = append(out, outResult{msg: Outgoing{Body: string(body), Attributes: attrs}, t: t})
	}
	s.outbox.add(out, len(tasks))
}

// encodeResult is the JSON of r as it is stored and sent: with every
// character SQS may refuse escaped (job.EncodeForSQS), since item ids and
// outputs repeat what the message's sender chose.
func encodeResult(r *job.Result) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return job.EncodeForSQS(b), nil
}

// unencodable names the first output that does not encode, for the reason.
func unencodable(outs []job.Output, err error) string {
	for _, o := range outs {
		if _, e := json.Marshal(o); e != nil {
			return fmt.Sprintf("the output of item %s cannot be encoded: %v", job.QuoteID(o.ID), e)
		}
	}
	return "the result cannot be encoded: " + err.Error()
}

// maxReasonLen keeps the reason attribute readable and well inside SQS's
// limits.
const maxReasonLen = 1024

// AttrBodyTruncated, on a dead letter, gives the size in bytes of the
// original body when the copy carries only its beginning: the body, the
// reason and the attributes did not fit in one message together.
const AttrBodyTruncated = "vramq-body-truncated"

// deadLetter copies a message to the DLQ with why, writes the chunk's failed
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
func (s *Subscriber) deadLetter(l *lease, kind, reason string) {
	reason = truncateUTF8(job.AttributeSafe(kind+": "+reason), maxReasonLen)
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	var err error
	for try := range 3 {
		errs, e := s.dlq.Send(ctx, []Outgoing{s.deadLetterCopy(l, reason, try)})
		if err = e; err == nil {
			err = errs[0]
		}
		if !permanent(err) {
			break
		}
		s.log.Warn("the DLQ refuses the copy; sending it again cut to fit", "message_id", l.msg.ID, "reason", kind, "try", try+1, "err", err)
	}
	if err != nil {
		delay := s.retryDelay(l.msg.ReceiveCount)
		s.log.Error("dead-lettering failed; message released for a retry", "message_id", l.msg.ID, "reason", kind, "err", err, "retry_in", delay)
		s.keeper.finish(l, true, delay)
		return
	}
	s.m.deadLettered.WithLabelValues(kind).Inc()
	k, _ := chunkOf(l.msg)
	s.log.Warn("message dead-lettered", "message_id", l.msg.ID, "reason", kind, "detail", reason,
		"job_id", k.JobID, "chunk", k.Chunk)
	if s.payloads != nil {
		// Before the delete, so that a crash in between redelivers the
		// message (a second DLQ copy) rather than leaving the chunk
		// dead-lettered without its marker.
		s.markFailed(l, reason)
	}
	s.keeper.finish(l, false, 0)
}

// deadLetterCopy is the DLQ copy of l's message with reason: whole on try 0,
// cut to MaxMessageBytes on try 1, cut and escaped with only vramq's
// attributes on try 2.
func (s *Subscriber) deadLetterCopy(l *lease, reason string, try int) Outgoing {
	// SQS allows ten attributes a message: ours first, then the original's,
	// in name order (one is kept for AttrBodyTruncated when cutting).
	attrs := map[string]string{job.AttrReason: reason, job.AttrSource: job.AttributeSafe(l.msg.ID)}
	const truncatedReserve = len(AttrBodyTruncated) + len(job.AttrDataType) + 20
	limit := s.cfg.MaxMessageBytes - truncatedReserve
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
		return Outgoing{Body: body, Attributes: attrs}
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
	return Outgoing{Body: body, Attributes: attrs}
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
