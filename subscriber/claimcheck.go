package subscriber

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// Payloads is the bucket that holds what does not fit in a message: items
// the publisher claim-checked, results too large to send, and the results
// and failure markers the publisher reads back. *payload.Store implements it
// on S3; its methods must be safe for concurrent use, must not retry
// beyond their client's own retryer, and must return a queue.ErrRefused
// (a *queue.Error) where the bucket refuses what was sent for good.
type Payloads interface {
	// Bucket names the bucket, for the references written to messages.
	Bucket() string
	// Get fetches what ref names, verified against its size and SHA-256;
	// errors wrap payload.ErrMissing or payload.ErrCorrupt when the object
	// cannot be trusted, anything else may pass.
	Get(ctx context.Context, ref job.PayloadRef) ([]byte, error)
	// Put stores body at key, replacing what is there.
	Put(ctx context.Context, key string, body []byte) (job.PayloadRef, error)
	// PutIfAbsent stores body at key unless an object is there already, in
	// which case it returns that object's content.
	PutIfAbsent(ctx context.Context, key string, body []byte) (created bool, existing []byte, err error)
	// Create is PutIfAbsent with the conditional write first and a read
	// only when it is refused (payload.Store.Create), for done markers: it
	// works where a missing key reads as 403.
	Create(ctx context.Context, key string, body []byte) (created bool, existing []byte, err error)
	// Read fetches key, unverified; an error wraps payload.ErrMissing when
	// there is no object there. For records such as a job's cancel record.
	Read(ctx context.Context, key string) ([]byte, error)
}

var _ Payloads = (*payload.Store)(nil)

// maxFetches bounds the claim-check fetches in flight at once, across
// messages: each holds a whole object in memory until its message runs.
const maxFetches = 8

// maxResultWrites bounds the result writes of one batch in flight at once.
const maxResultWrites = 8

// errBadObject marks an object that passed verification but does not stand
// for the item that references it: the publisher wrote the wrong thing, and
// no retry will change that.
var errBadObject = errors.New("object is not the referenced item")

// errBadRef marks a reference that names something other than this item's
// object in the payload bucket.
var errBadRef = errors.New("reference outside this job's payloads")

// maxClaimBytes bounds the object a reference may name. The publisher
// claim-checks items of a request body, which it bounds at 32 MiB by
// default; a reference is read up to its size, and anyone who can send to
// the queue writes the size.
const maxClaimBytes = 64 << 20

// A claimRefused is a claim-checked item that can never be fetched as it is
// referenced. Its Error is the dead letter's reason, and it is the same
// whether the object is missing, of another size or SHA-256, or not the
// item: the reason is stored in the chunk's failed marker and served by the
// publisher's GET, and must tell whoever sent the message nothing about an
// object they did not already know (not that it exists, nor its size, hash
// or content). What happened is in err, for the log and the metrics.
type claimRefused struct {
	id  string
	why string
	err error
}

func (e *claimRefused) Error() string { return "item " + job.QuoteID(e.id) + ": " + e.why }
func (e *claimRefused) Unwrap() error { return e.err }

const (
	whyNoMatch = "no object in the payload bucket matches the reference"
	whyBadRef  = "the reference does not name this item's object in the payload bucket"
	whyTooBig  = "the reference names an object larger than a claim-checked item can be"
)

func hasRefs(w *job.Work) bool {
	for _, it := range w.Items {
		if it.Ref != nil {
			return true
		}
	}
	return false
}

// claim fetches the claim-checked items of w off the poll loop and sends the
// message on to admission. The message was counted as waiting before this
// started, so the poller never receives more than the buffer can take, and
// its lease is extended by the keeper all along. Fetching is part of getting
// to admission, so it shares the admission deadline: a fetch that hangs past
// AdmitTimeout releases the message for a retry instead of holding a
// prefetch slot.
func (s *Subscriber) claim(ctx context.Context, t *task) {
	l, w := t.lease, t.work
	fctx, cancel := context.WithDeadline(ctx, l.received.Add(s.cfg.AdmitTimeout))
	defer cancel()
	err := s.fetchItems(fctx, w)
	var refused *claimRefused
	switch {
	case ctx.Err() != nil:
		s.startTasks(1)
		s.release(t, 0)
	case err == nil:
		s.enqueue(t)
	case errors.As(err, &refused):
		s.log.Warn("claim-checked item refused", "message_id", l.msg.ID, "job_id", w.JobID, "chunk", w.Chunk, "err", refused.err)
		s.startTasks(1)
		s.deadLetterAsync(t, "claim_check", refused.Error())
	default:
		delay := s.retryDelay(l.msg.ReceiveCount)
		s.log.Warn("fetching a claim-checked item failed; message released for a retry", "message_id", l.msg.ID,
			"receive_count", l.msg.ReceiveCount, "retry_in", delay, "err", err)
		s.startTasks(1)
		s.release(t, delay)
	}
}

// fetchItems replaces every item of w that has a Ref with the item stored in
// the payload bucket, verified. The first error stops the others.
func (s *Subscriber) fetchItems(ctx context.Context, w *job.Work) error {
	g, ctx := errgroup.WithContext(ctx)
	for i := range w.Items {
		ref := w.Items[i].Ref
		if ref == nil {
			continue
		}
		id := w.Items[i].ID
		g.Go(func() error {
			if err := s.fetchSlots.Acquire(ctx, 1); err != nil {
				return fmt.Errorf("item %q: waiting to fetch s3://%s/%s: %w", id, ref.Bucket, ref.Key, err)
			}
			defer s.fetchSlots.Release(1)
			it, err := s.fetchItem(ctx, w.JobID, w.Endpoint, id, *ref)
			s.m.claimChecks.WithLabelValues(claimOutcome(err)).Inc()
			if errors.As(err, new(*claimRefused)) {
				return err
			}
			if err != nil {
				return fmt.Errorf("item %s: %w", job.QuoteID(id), err)
			}
			w.Items[i] = it // each goroutine writes its own element
			return nil
		})
	}
	return g.Wait()
}

// fetchItem fetches the item a reference stands for, verified. A
// reference must name exactly where the publisher puts this item of this
// job (job.ItemKey of the message's job id and the item's id, in the
// payload bucket): anyone who can send to the queue could otherwise point
// the subscriber at any object its role can read, other items, other jobs'
// payloads and results among them. Then the content: its size and SHA-256
// must be the reference's, and it must decode as exactly this item (same
// id, no reference of its own, content by the rule of job.Item.CheckFor
// the message's endpoint).
func (s *Subscriber) fetchItem(ctx context.Context, jobID, endpoint, id string, ref job.PayloadRef) (job.Item, error) {
	switch {
	case ref.Bucket != s.payloads.Bucket() || ref.Key != job.ItemKey(jobID, id):
		return job.Item{}, &claimRefused{id, whyBadRef, fmt.Errorf("%w: s3://%s/%s", errBadRef, ref.Bucket, ref.Key)}
	case ref.Size > maxClaimBytes:
		return job.Item{}, &claimRefused{id, whyTooBig, fmt.Errorf("%w: %d bytes", errBadRef, ref.Size)}
	}
	b, err := s.payloads.Get(ctx, ref)
	if errors.Is(err, payload.ErrMissing) || errors.Is(err, payload.ErrCorrupt) || errors.Is(err, job.ErrMalformed) {
		return job.Item{}, &claimRefused{id, whyNoMatch, err}
	}
	if err != nil {
		return job.Item{}, err
	}
	var it job.Item
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&it); err != nil {
		return job.Item{}, &claimRefused{id, whyNoMatch,
			fmt.Errorf("%w: s3://%s/%s is not item JSON: %v", errBadObject, ref.Bucket, ref.Key, err)}
	}
	switch {
	case it.ID != id:
		return job.Item{}, &claimRefused{id, whyNoMatch, fmt.Errorf("%w: s3://%s/%s holds another item", errBadObject, ref.Bucket, ref.Key)}
	case it.Ref != nil:
		return job.Item{}, &claimRefused{id, whyNoMatch,
			fmt.Errorf("%w: s3://%s/%s holds another reference, not the item", errBadObject, ref.Bucket, ref.Key)}
	}
	if err := it.CheckFor(endpoint); err != nil {
		return job.Item{}, &claimRefused{id, whyNoMatch, fmt.Errorf("%w: s3://%s/%s: %w", errBadObject, ref.Bucket, ref.Key, err)}
	}
	return it, nil
}

func claimOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, payload.ErrMissing):
		return "missing"
	case errors.Is(err, payload.ErrCorrupt):
		return "corrupt"
	case errors.Is(err, errBadObject), errors.Is(err, errBadRef):
		return "invalid"
	}
	return "error"
}

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
	ref, failed, err := s.storeResultObject(ctx, r, body)
	if err == nil && failed > 0 {
		// After the result, and on every delivery: a crash in between
		// redelivers the message, which writes it then.
		err = s.markItemErrors(ctx, r.Key(), failed)
	}
	return ref, err
}

// markItemErrors writes the item-error marker of chunk k, for the counts of
// GET and of the completion event.
func (s *Subscriber) markItemErrors(ctx context.Context, k job.Key, failed int) error {
	body, err := json.Marshal(job.ItemErrorsMarker{V: job.Version, JobID: k.JobID, Chunk: k.Chunk, ItemsFailed: failed})
	if err != nil {
		return err
	}
	_, err = s.payloads.Put(ctx, job.ItemErrorsKey(k.JobID, k.Chunk), body)
	return err
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

// itemErrors is how many of r's outputs carry an error.
func itemErrors(r *job.Result) int {
	n := 0
	for _, o := range r.Outputs {
		if o.Error != nil {
			n++
		}
	}
	return n
}

func refTo(bucket, key string, body []byte) job.PayloadRef {
	sum := sha256.Sum256(body)
	return job.PayloadRef{Bucket: bucket, Key: key, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])}
}

// markFailed writes the failed marker of t's chunk. Best effort: the DLQ
// copy is the record that matters, so a failure is only logged.
//
// Only for a message that decoded as work (t.work): anyone who can send to
// the queue can send a body that names any job and chunk and decodes as
// nothing, and a marker for it would settle that job before its real
// chunk runs. Only for a chunk of the job's manifest, when it has one: a
// chunk at or past its count is none of the job's, and no count would use
// the marker. And only where none is: a sender must not replace the reason
// a real failure left there. A result still wins over a marker, in GET and
// in the completion event, and a result stored after a marker corrects the
// event (events.go).
func (s *Subscriber) markFailed(t *task, reason string) {
	w, l := t.work, t.lease
	if w == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	if n, ok := s.manifestChunks(ctx, w.JobID); ok && w.Chunk >= n {
		s.log.Info("no failed marker for a chunk past its job's last", "message_id", l.msg.ID, "job_id", w.JobID,
			"chunk", w.Chunk, "chunks", n)
		return
	}
	body, err := json.Marshal(job.FailedMarker{V: job.Version, JobID: w.JobID, Chunk: w.Chunk, Reason: reason,
		MessageID: l.msg.ID, At: time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		return
	}
	created, _, err := s.payloads.PutIfAbsent(ctx, job.FailedKey(w.JobID, w.Chunk), body)
	switch {
	case err != nil:
		s.log.Warn("writing the failed marker failed; the DLQ copy stands",
			"message_id", l.msg.ID, "job_id", w.JobID, "chunk", w.Chunk, "err", err)
	case !created:
		s.log.Info("the chunk has a failed marker already; kept", "message_id", l.msg.ID, "job_id", w.JobID, "chunk", w.Chunk)
	}
	if err == nil {
		s.jobSettling(w.JobID)
	}
}

// manifestChunks is the chunk count of jobID's manifest, when it can be
// read: a job without one (a publisher without a bucket) or a read that
// fails says nothing.
func (s *Subscriber) manifestChunks(ctx context.Context, jobID string) (int, bool) {
	raw, err := s.payloads.Read(ctx, job.ManifestKey(jobID))
	if err != nil {
		return 0, false
	}
	var m job.Manifest
	if json.Unmarshal(raw, &m) != nil || m.JobID != jobID || m.Chunks < 1 {
		return 0, false
	}
	return m.Chunks, true
}

// chunkOf finds the chunk a message is for in whatever of its body parses (a
// malformed message may still name its job), with a job id of the grammar.
// Never from its attributes: the body is what was validated and run, and
// attributes may say anything.
func chunkOf(m queue.Message) (job.Key, bool) {
	var b struct {
		JobID string `json:"job_id"`
		Chunk *int   `json:"chunk"`
	}
	if json.Unmarshal([]byte(m.Body), &b) != nil || !job.ValidJobID(b.JobID) || b.Chunk == nil || *b.Chunk < 0 {
		return job.Key{}, false
	}
	return job.Key{JobID: b.JobID, Chunk: *b.Chunk}, true
}

// typedNil reports a nil *payload.Store put in the interface: a caller that
// builds the store only when a bucket is configured and assigns it either
// way means "no bucket", not a store that panics on first use.
func typedNil(p Payloads) bool {
	st, ok := p.(*payload.Store)
	return ok && st == nil
}
