package subscriber

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	// Named apart from this package's own batcher, which forms device batches.
	callbatch "github.com/vramq/vramq/internal/batcher"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
	"golang.org/x/sync/errgroup"
)

// The send stage: results are encoded, stored when large, and sent in batches (outbox); a message is acked
// once its result is out.

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
	model := s.cfg.Backend.Name()
	results := make([]job.Result, len(tasks))
	var keep []*task
	var kept []job.Result
	var keptBodies [][]byte
	for i, t := range tasks {
		outs[i] = t.whole(outs[i]) // with what it kept through a wait, if anything
		results[i] = job.Result{
			V: job.Version, JobID: t.work.JobID, Chunk: t.work.Chunk, Model: model,
			Outputs: outs[i], ItemsFailed: itemsFailed(outs[i]), Attempt: t.lease.msg.ReceiveCount,
			WorkerMS: time.Since(t.lease.received).Milliseconds(),
		}
		body, err := encodeResult(&results[i])
		switch {
		case err != nil:
			s.end(t, endDeadLetter("invalid_output", unencodable(outs[i], err)))
			continue
		case len(body) > s.cfg.MaxResultBytes:
			s.end(t, endDeadLetter("result_too_large", fmt.Sprintf("result of %d bytes (%d items) exceeds the %d-byte result limit",
				len(body), len(outs[i]), s.cfg.MaxResultBytes)))
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
				s.end(t, endDeadLetter("result_refused", "the payload bucket refuses the result: "+refusalCode(storeErrs[i])))
				continue
			}
			// Consumers of the bucket expect every result in it.
			s.log.Warn("result not stored; message released for a retry", "message_id", t.lease.msg.ID)
			s.end(t, endFailed())
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
			s.end(t, endDeadLetter("result_too_large", reason))
			continue
		}
		out = append(out, outResult{msg: queue.Outgoing{Body: string(body), Attributes: attrs}, t: t})
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

// resultLinger is the longest a result waits for others to share its
// SendMessageBatch call, and it waits only while other messages are running
// or waiting to run, whose results may join it. Under load ten results come
// sooner and the call goes when full; with nothing else in progress (light
// traffic, or the last batch of a burst) the call goes at once.
const resultLinger = 100 * time.Millisecond

// An outbox sends result messages in SendMessageBatch calls shared across
// device batches, as the keeper does for deletes. Under vram admission a
// device batch holds a few messages, and a call per batch made results the
// largest share of the subscriber's requests (bench/overhead.md counts the
// calls per message); here a call goes when it is full (job.MaxBatch results,
// or fewer when fewer messages may be held at once) or holds a message's
// worth of payload, or when its first result has waited the linger.
//
// A full call is sent by the goroutine whose result filled it (a runner,
// whose admission is already given back), so it costs no extra goroutine;
// a partial one by the linger timer's. Once the call has answered, done is
// told each entry's outcome: the subscriber deletes a message only after
// SQS accepted its result, and releases it for a retry otherwise. Until
// then its lease is held by the keeper and not ending, so heartbeats go
// on extending it while it waits here.
//
// Call close after the last add: it sends what is left and waits for every
// call.
type outbox struct {
	send func(context.Context, []queue.Outgoing) ([]error, error)
	done func(t *task, err error)
	// calls gathers results into calls (sendCall), on the caller's
	// goroutine.
	calls *callbatch.Batcher[outResult]
	// more reports whether other results may come soon: messages running
	// or waiting to run. Without, a partial call goes at once rather than
	// wait out the linger for company that is not coming. Nil: always.
	more func() bool
	// stamp, when set, is told when each call starts (message.go).
	stamp func([]outResult, time.Time)

	mu sync.Mutex // guards more and coming
	// coming counts results promised and not yet added: those of batches
	// that have returned, and so no longer count in more, and are still
	// encoding theirs. Two batches that return together would otherwise
	// each see the other gone and send a call apiece.
	coming int
}

// outboxWith returns an outbox without more or stamp. A call holds up to
// full results and maxBytes of payload (bodies and attributes), and waits
// up to linger for them.
func outboxWith(send func(context.Context, []queue.Outgoing) ([]error, error), done func(*task, error),
	full, maxBytes int, linger time.Duration) *outbox {
	o := &outbox{send: send, done: done}
	o.calls = o.newCalls(full, maxBytes, linger)
	return o
}

// newCalls is the batcher of o's calls.
func (o *outbox) newCalls(full, maxBytes int, linger time.Duration) *callbatch.Batcher[outResult] {
	return callbatch.New(callbatch.Options{MaxItems: full, MaxBytes: maxBytes, MaxDelay: linger, OnCaller: true}, o.sendCall)
}

// outResult is one result message on its way, and the task it is for.
type outResult struct {
	msg queue.Outgoing
	t   *task
}

// promise says that results for n tasks will be added soon. A batch makes
// it before it stops counting in more, and keeps it in add.
func (o *outbox) promise(n int) {
	o.mu.Lock()
	o.coming += n
	o.mu.Unlock()
}

// add queues results and sends the calls they fill. promised is what the
// caller promised for them, whether or not every task has a result here;
// once every promised result is in and nothing else is running, what is
// pending goes at once.
func (o *outbox) add(rs []outResult, promised int) {
	for _, r := range rs {
		// What SQS counts: the body and every attribute's name, type and
		// value. A count that left the attributes out let calls go over the
		// limit, refused as a whole with every result in them.
		o.calls.Add(r, job.MessageSize(r.msg.Body, r.msg.Attributes))
	}
	o.mu.Lock()
	o.coming -= promised
	last := o.coming == 0 && o.more != nil && !o.more()
	o.mu.Unlock()
	if last {
		o.calls.Flush()
	}
}

// close sends what is pending at once and waits until every call has
// answered and its entries are told (done). Shutdown calls it after the last
// batch has finished and before the keeper drains, so that no result is
// left behind and every delete it leads to is flushed.
func (o *outbox) close() {
	// Each call is bounded by sendTimeout.
	_ = o.calls.Shutdown(context.Background())
}

// sendCall sends one call and tells done how each entry went.
func (o *outbox) sendCall(c []outResult) {
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	o.deliver(ctx, c)
}

// deliver sends c in one call and tells done how each entry went. A call SQS
// refuses as a whole and for good (too long, or a message it cannot take)
// is sent again in halves, down to single entries: one result that cannot
// be sent must not take its neighbours down with it, call after call.
func (o *outbox) deliver(ctx context.Context, c []outResult) {
	msgs := make([]queue.Outgoing, len(c))
	for i := range c {
		msgs[i] = c[i].msg
	}
	if o.stamp != nil {
		o.stamp(c, time.Now())
	}
	errs, err := o.send(ctx, msgs)
	if err != nil && len(c) > 1 && permanent(err) {
		half := len(c) / 2
		o.deliver(ctx, c[:half])
		o.deliver(ctx, c[half:])
		return
	}
	for i, r := range c {
		e := err
		if e == nil {
			e = errs[i]
		}
		o.done(r.t, e)
	}
}

// newOutbox is the subscriber's outbox for its results queue. A call's
// payload is bounded like one message's: SQS caps a batch at the queue's
// maximum message size in all (256 KiB, or up to 1 MiB where the queue
// allows it), which MaxMessageBytes stands for.
func (s *Subscriber) newOutbox() *outbox {
	o := outboxWith(s.results.Send, s.resultSent, s.fullCall(), s.cfg.MaxMessageBytes, resultLinger)
	// Admitted messages (running, or in a batch about to) count in inflight
	// until their batch returns, which is before their results reach add:
	// the batch's promise covers the gap. Waiting ones are received and not
	// admitted.
	o.more = func() bool { return s.inflight.Load() > 0 || s.waiting.Load() > 0 }
	o.stamp = s.m.stampSending
	return o
}

// resultSent deletes t's message now that its result is on the results
// queue, or, when the send failed, releases it for a retry after a delay
// that grows with its receive count.
func (s *Subscriber) resultSent(t *task, err error) {
	if permanent(err) {
		// Sending it again would fail the same way, until the queue's
		// redrive policy moved it to the DLQ without a reason.
		s.end(t, endDeadLetter("result_refused", "the results queue refuses the result: "+refusalCode(err)))
		return
	}
	if err != nil {
		s.log.Warn("sending result failed; message released for a retry", "message_id", t.lease.msg.ID, "err", err)
		s.end(t, endFailed())
		return
	}
	s.stampSent(t)
	s.ends.ended.add(t.lease.msg.ID)
	s.answers.forget(t)
	s.m.results.Inc()
	s.m.tenantDone.WithLabelValues(s.m.tenants.Label(t.lease.msg.Attributes[job.AttrTenant])).Inc()
	s.end(t, endAck())
}

// fullCall is the most entries a result or delete call can gather: the
// SQS limit, or -max-inflight when that is lower, since no more messages can
// be held at once to join it.
func (s *Subscriber) fullCall() int {
	return min(job.MaxBatch, s.cfg.MaxInflight)
}

// maxResultWrites bounds the result writes of one batch in flight at once.
const maxResultWrites = 8

// storeResults writes each result to results/{job_id}/{chunk}.json, in
// parallel, and returns a reference to each object, nil where the write
// failed, with that write's error. The first write of a chunk wins: a
// redelivered chunk reuses the object already there, so a result message
// sent earlier with a reference to it still verifies (a rewrite with another
// attempt number would change its SHA-256 under that message).
func (s *Subscriber) storeResults(results []job.Result, bodies [][]byte) ([]*job.PayloadRef, []error) {
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	refs := make([]*job.PayloadRef, len(results))
	errs := make([]error, len(results))
	var g errgroup.Group
	g.SetLimit(maxResultWrites)
	for i := range results {
		g.Go(func() error {
			ref, err := s.storeResult(ctx, &results[i], bodies[i])
			if err != nil {
				s.log.Warn("storing the result failed", "job_id", results[i].JobID, "chunk", results[i].Chunk, "err", err)
				errs[i] = err
				return nil
			}
			s.m.resultsStored.Inc()
			refs[i] = &ref
			return nil
		})
	}
	_ = g.Wait()
	seen := make(map[string]bool)
	for i, r := range results {
		if refs[i] != nil && !seen[r.JobID] {
			seen[r.JobID] = true
			s.jobSettling(r.JobID)
		}
	}
	return refs, errs
}

func (s *Subscriber) storeResult(ctx context.Context, r *job.Result, body []byte) (job.PayloadRef, error) {
	// The item-error marker before the result: whoever sees the chunk done
	// (GET's count lists results, then reads markers) sees its failed
	// items too. Written after it, a job polled in between read complete
	// with every item done (TestPipelineItemErrors, 1 run in a few under
	// load). On every delivery: a crash between the two redelivers the
	// message, which writes both then.
	mine := itemErrors(r)
	if mine > 0 {
		if err := s.markItemErrors(ctx, r.Key(), mine); err != nil {
			return job.PayloadRef{}, err
		}
	}
	ref, failed, err := s.storeResultObject(ctx, r, body)
	if err == nil && failed != mine {
		// The chunk's result was there already with another count (a
		// redelivery that is not what ran first): the marker is the stored
		// result's, 0 included (a marker of 0 counts none).
		err = s.markItemErrors(ctx, r.Key(), failed)
	}
	return ref, err
}

// storeResultObject stores r unless the chunk's result is there already,
// and returns a reference to the stored result and how many of its items
// failed. The count is the stored result's, not r's: a redelivery of the
// chunk that is not what ran first (anyone who can send to the queue can
// send one, with other items) must not change the chunk's item-error
// marker, so the marker always says what the result GET serves says.
func (s *Subscriber) storeResultObject(ctx context.Context, r *job.Result, body []byte) (job.PayloadRef, int, error) {
	key := job.ResultKey(r.JobID, r.Chunk)
	created, existing, err := s.payloads.PutIfAbsent(ctx, key, body)
	if err != nil {
		return job.PayloadRef{}, 0, err
	}
	if created {
		return refTo(s.payloads.Bucket(), key, body), itemErrors(r), nil
	}
	var old job.Result
	if json.Unmarshal(existing, &old) == nil && old.Key() == r.Key() && old.Ref == nil {
		return refTo(s.payloads.Bucket(), key, existing), itemErrors(&old), nil
	}
	// Not a result of this chunk: whatever it is, ours replaces it.
	s.log.Warn("replacing an object that is not this chunk's result", "key", key, "bytes", len(existing))
	ref, err := s.payloads.Put(ctx, key, body)
	return ref, itemErrors(r), err
}

func refTo(bucket, key string, body []byte) job.PayloadRef {
	sum := sha256.Sum256(body)
	return job.PayloadRef{Bucket: bucket, Key: key, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])}
}
