package subscriber

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
)

// maxFetches bounds the claim-check fetches in flight at once, across
// messages: each holds a whole object in memory until its message runs.
const maxFetches = 8

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
		s.end(t, endHandBack(0, "shutdown"))
	case err == nil:
		s.enqueue(t)
	case errors.As(err, &refused):
		s.log.Warn("claim-checked item refused", "message_id", l.msg.ID, "job_id", w.JobID, "chunk", w.Chunk, "err", refused.err)
		s.startTasks(1)
		s.endAsync(t, endDeadLetter("claim_check", refused.Error()))
	default:
		delay := t.retryAfter()
		s.log.Warn("fetching a claim-checked item failed; message released for a retry", "message_id", l.msg.ID,
			"receive_count", l.msg.ReceiveCount, "retry_in", delay, "err", err)
		s.startTasks(1)
		s.end(t, endFailed())
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
