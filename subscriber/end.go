package subscriber

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// A message ends in one of three ways, and only through this file:
//
//   - ack: its result, or its DLQ copy, is out; the message is deleted.
//   - release(delay): it is handed back to the queue, visible again after
//     delay (0: at once, for another consumer or a retry), for a failure
//     that may be its own (a timeout, a model error): the next receive
//     counts towards its redrive.
//   - handBack(delay, why): a wait that is not its fault; a fresh copy goes
//     to the queue and the message is deleted, so its receive count starts
//     again.
//
// Two paths lead to them:
//
//   - deadLetter(kind, reason): it can never succeed; a copy goes to the DLQ
//     with the reason, then it is acked (or released, when the DLQ cannot
//     be reached).
//   - cancelChunk: its job was cancelled (DELETE /v1/jobs/{id}) before it
//     ran; its cancelled marker is written, then it is acked (or released,
//     when the marker cannot be written).
//
// (The keeper also lets go of a lease SQS reports lost, and releases any
// still held at shutdown.)
//
// ack, release and handBack give back what the message still holds in admission
// (giveBack, admission.go), so that no path can forget it, and leave the SQS call to the
// keeper, which batches it with others (keeper.ack, keeper.release);
// deadLetter ends through them once its copy is out. Only a message's first
// end counts.

// sendTimeout bounds sending results or a DLQ copy. It is not tied to
// shutdown: work that finished deserves its result.
const sendTimeout = 30 * time.Second

// ack deletes t's message: its result or its DLQ copy is out.
func (s *Subscriber) ack(t *task) {
	s.giveBack(t)
	s.keeper.ack(t.lease)
}

// release hands t's message back to the queue, visible again after delay.
func (s *Subscriber) release(t *task, delay time.Duration) {
	s.giveBack(t)
	s.keeper.release(t.lease, delay)
}

// handBack hands t's message back to the queue at no cost to its receive
// count (keeper.handBack: a fresh copy, visible after delay, then a delete
// of this one), for why: a wait that is not the message's fault
// (backpressure, a shutdown, a wait for the model longer than a lease
// holds, a lost or shrunk device). A release would be received again, one
// receive nearer the DLQ each time.
func (s *Subscriber) handBack(t *task, delay time.Duration, why string) {
	s.giveBack(t)
	s.m.handedBack.WithLabelValues(why).Inc()
	s.keeper.handBack(t.lease, delay)
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
func (s *Subscriber) deadLetter(t *task, kind, reason string) {
	l := t.lease
	reason = truncateUTF8(job.AttributeSafe(kind+": "+reason), maxReasonLen)
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	var err error
	for try := range 3 {
		errs, e := s.dlq.Send(ctx, []queue.Outgoing{s.deadLetterCopy(l, reason, try)})
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
		s.release(t, delay)
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
		s.markFailed(t, reason)
	}
	s.ack(t)
}

// cancelChunk ends t, a chunk of a cancelled job that has not run: it writes
// the chunk's cancelled marker, which the publisher counts, then deletes the
// message. Written before the delete, so that a crash in between redelivers
// the message (and its marker is written then) rather than leaving the
// chunk gone and uncounted; when it cannot be written the message is
// released for a later try. The marker is written only where none is, so a
// redelivery keeps the first one.
func (s *Subscriber) cancelChunk(t *task) {
	l, w := t.lease, t.work
	body, err := json.Marshal(job.CancelledMarker{V: job.Version, JobID: w.JobID, Chunk: w.Chunk, MessageID: l.msg.ID,
		At: time.Now().UTC().Format(time.RFC3339)})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
		_, _, err = s.payloads.PutIfAbsent(ctx, job.CancelledKey(w.JobID, w.Chunk), body)
		cancel()
	}
	if err != nil {
		delay := s.retryDelay(l.msg.ReceiveCount)
		s.log.Warn("writing a cancelled marker failed; message released for a retry", "message_id", l.msg.ID,
			"job_id", w.JobID, "chunk", w.Chunk, "err", err, "retry_in", delay)
		s.release(t, delay)
		return
	}
	s.m.cancelled.Inc()
	s.jobSettling(w.JobID)
	s.log.Info("chunk of a cancelled job deleted unrun", "message_id", l.msg.ID, "job_id", w.JobID, "chunk", w.Chunk)
	s.ack(t)
}

// deadLetterCopy is the DLQ copy of l's message with reason: whole on try 0,
// cut to MaxMessageBytes on try 1, cut and escaped with only vramq's
// attributes on try 2.
func (s *Subscriber) deadLetterCopy(l *lease, reason string, try int) queue.Outgoing {
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
