package batches

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/jobs"
)

// A batch is a state machine kept in its record, each transition made by
// one owner with a conditional write (If-Match on the record's ETag), so
// that of two that try the same step one wins and the other, refused with
// S3's 412, leaves the batch to it:
//
//	validating  -> in_progress  its validator, once every chunk is sent (batchvalidate.go)
//	validating  -> failed       its validator (a bad file, a failed send); the sweeper, once the
//	                            validator's claim is stale (batchSendStale)
//	in_progress -> finalizing   the finalizer's claim, once the job has settled
//	finalizing  -> completed | cancelled | expired
//	                            the claim's holder, having written the output and error files;
//	                            the sweeper takes over a claim older than finalizeStale (a restart)
//
// Cancelling is no state of the record: a cancel's command is the job's
// cancel record (written once, create-if-absent), which the subscribers
// obey and reads show as cancelling; the finalizer then ends the batch
// cancelled. The window's end is the same command, written by the sweeper,
// and ends the batch expired. A batch not yet ended has a marker
// (job.OpenBatchKey) that the sweeper lists; the batch's last transition
// deletes it.

// finalizeStale is how long a finalizing claim stands before the sweeper
// takes it for one whose finalizer died (a restart, a Lambda invocation cut
// off): far longer than writing the files of the largest batch takes.
const finalizeStale = 10 * time.Minute

// openBatch marks b open, for the sweeper: before its record is written,
// so that no batch is left without one.
func (p *Service) openBatch(ctx context.Context, b *batchRecord) error {
	_, err := p.store.Put(ctx, job.OpenBatchKey(b.Owner, b.ID), nil)
	if err != nil {
		p.log.Error("marking a batch open", "batch_id", b.ID, "err", err)
	}
	return err
}

// putBatchIf writes b's record if it is still at etag, and returns the new
// ETag: payload.ErrPrecondition (wrapped) when another owner moved it first.
func (p *Service) putBatchIf(ctx context.Context, b *batchRecord, etag string) (string, error) {
	raw, err := json.Marshal(b)
	if err != nil {
		return "", err
	}
	return p.store.PutIfMatch(ctx, job.BatchKey(b.Owner, b.ID), raw, etag)
}

// batchView is b as it stands, read and never written: an ended batch is
// its record; one validating is its record (the sweeper fails it once
// stale); one in progress or finalizing is counted from its job, and shown
// finalizing once its job has settled or its window has passed, which the
// finalizer and the sweeper act on (a settled one is nudged to the
// finalizer at once, in server mode).
func (p *Service) batchView(ctx context.Context, b *batchRecord) (*batchObject, error) {
	switch b.Status {
	case batchValidating:
		return b.object(batchCounts{Total: b.Lines}), nil
	case batchInProgress, batchFinalizing:
	default:
		return b.object(batchCounts{}), nil
	}
	m, st, err := p.jobs.Progress(ctx, b.ID)
	if err != nil {
		return nil, err
	}
	c := batchCounts{Total: b.Lines, Completed: st.ItemsDone, Failed: st.ItemsFailed + st.UnsettledItems(m)}
	o := b.object(c)
	if b.Status == batchFinalizing {
		return o, nil
	}
	now := p.now().Unix()
	switch {
	case st.ChunksPending == 0:
		o.Status, o.FinalizingAt = batchFinalizing, &now
		p.nudge(job.BatchKey(b.Owner, b.ID))
	case st.CancelledAt != nil && st.CancelledAt.Unix() < b.ExpiresAt:
		ca := st.CancelledAt.Unix()
		o.Status, o.CancellingAt = batchCancelling, &ca
	case st.CancelledAt != nil:
		ca := st.CancelledAt.Unix()
		o.Status, o.FinalizingAt = batchFinalizing, &ca
	case now >= b.ExpiresAt:
		// The sweeper's next pass cancels the job.
		o.Status, o.FinalizingAt = batchFinalizing, &b.ExpiresAt
	}
	return o, nil
}

// advanceBatch moves the batch whose record is at key as far as it can go
// now, making each transition only if no one else has made it since the
// record was read. The sweeper runs it for every open batch; a nudge for
// one.
func (p *Service) advanceBatch(ctx context.Context, key string) error {
	// A pass and a nudge may reach the same batch at once: this process
	// advances it once, whatever its store makes of conditional writes
	// (the emulator ignores them).
	if !p.advancing.add(key) {
		return nil
	}
	defer p.advancing.remove(key)
	raw, etag, err := p.store.ReadVersion(ctx, key, maxBatchRecord)
	if errors.Is(err, payload.ErrMissing) {
		return nil // its marker outlived it (create failed after the marker)
	}
	if err != nil {
		return err
	}
	var b batchRecord
	if err := json.Unmarshal(raw, &b); err != nil {
		return fmt.Errorf("batch record %s: %w", key, err)
	}
	now := p.now()
	switch b.Status {
	case batchValidating:
		claimed := b.ValidatingAt
		if b.V < batchRecordVersion {
			claimed = b.CreatedAt // validated before it was recorded, and being sent
		}
		switch {
		case claimed == 0:
			if ended, err := p.validateBatch(ctx, &b, etag); err != nil || !ended {
				return err
			}
		case now.Unix()-claimed <= int64(batchSendStale/time.Second):
			return nil // its validator is at work
		default:
			// Its validator died, perhaps while sending: what it sent
			// must not run, and the batch failed.
			if err := p.jobs.Cancel(ctx, b.ID); err != nil {
				return err
			}
			b.Status, b.FailedAt = batchFailed, now.Unix()
			b.Errors = []batchError{{Code: CodeEnqueueInterrupted,
				Message: "the publisher stopped while validating or sending the batch's requests; create the batch again"}}
			if _, err := p.putBatchIf(ctx, &b, etag); err != nil {
				return ignoreLost(err)
			}
			p.ended(&b)
		}
	case batchInProgress:
		m, st, err := p.jobs.Progress(ctx, b.ID)
		if err != nil {
			return err
		}
		if st.ChunksPending > 0 {
			if st.CancelledAt == nil && now.Unix() >= b.ExpiresAt {
				// The window is over: the job is cancelled as DELETE
				// cancels it; a cancel record at or after expires_at is
				// the expiry, and the finalizer ends the batch expired
				// once the subscribers have settled every chunk.
				return p.jobs.Cancel(ctx, b.ID)
			}
			return nil
		}
		prev := b
		b.Status, b.FinalizingAt = batchFinalizing, now.Unix()
		if etag, err = p.putBatchIf(ctx, &b, etag); err != nil {
			return ignoreLost(err) // another finalizer claimed it
		}
		if err := p.finalizeBatch(ctx, &b, etag, m, st); err != nil {
			if !errors.Is(err, payload.ErrPrecondition) {
				p.release(ctx, &prev, etag)
			}
			return ignoreLost(err)
		}
		p.ended(&b)
	case batchFinalizing:
		if now.Unix()-b.FinalizingAt < int64(finalizeStale/time.Second) {
			return nil // its finalizer is at work
		}
		p.log.Warn("resuming a batch's finalization", "batch_id", b.ID, "finalizing_at", b.FinalizingAt)
		b.FinalizingAt = now.Unix()
		if etag, err = p.putBatchIf(ctx, &b, etag); err != nil {
			return ignoreLost(err)
		}
		m, st, err := p.jobs.Progress(ctx, b.ID)
		if err != nil {
			return err
		}
		if err := p.finalizeBatch(ctx, &b, etag, m, st); err != nil {
			return ignoreLost(err)
		}
		p.ended(&b)
	}
	// Ended, here or before.
	return p.store.Delete(ctx, job.OpenBatchKey(b.Owner, b.ID))
}

// ended counts b, which has just ended by this process's write, and sends
// its webhook event: the owner of a batch's last transition is the one
// that announces it.
func (p *Service) ended(b *batchRecord) {
	p.m.batchesEnded.WithLabelValues(b.Status).Inc()
	p.hooks.batchEnded(b)
}

// release gives back the finalizing claim at etag of a finalizer that
// failed (an S3 error), putting prev, the record as it was before the claim,
// so that the next pass tries again rather than waiting for the claim to go
// stale. A claim it cannot give back goes stale (finalizeStale).
func (p *Service) release(ctx context.Context, prev *batchRecord, etag string) {
	ctx, cancel := jobs.Detach(ctx)
	defer cancel()
	if _, err := p.putBatchIf(ctx, prev, etag); err != nil {
		p.log.Warn("giving back a batch's finalizing claim", "batch_id", prev.ID, "err", err)
	}
}

// ignoreLost is err, or nil when it is a conditional write that another
// owner won: the batch is theirs to move.
func ignoreLost(err error) error {
	if errors.Is(err, payload.ErrPrecondition) {
		return nil
	}
	return err
}
