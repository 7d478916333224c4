package batches

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/job"
)

// The sweeper is the owner that advances batches without anyone reading
// them (batchstate.go): each pass lists the open batches' markers and
// advances each, which fails a batch left validating, cancels the job of
// one past its window, finalizes one whose job has settled, and resumes a
// stale finalization. In server mode it runs every -batch-sweep-interval
// (RunSweeper), and finalizes at once a batch that a read found settled
// (a nudge); under Lambda, an EventBridge schedule invokes one pass
// (LambdaEvents).

// DefaultSweepInterval is -batch-sweep-interval's default: how late, at
// most, a batch nobody reads is finalized after its job settles, or
// expired after its window (a read of a settled batch nudges it at once).
// A pass costs each open batch a few S3 requests (its record, its
// manifest, and the lists and reads of its job's status: about 3 GETs and 4
// LISTs), in every publisher process; a minute is also the finest rate an
// EventBridge schedule offers, so both modes keep the same promise.
const DefaultSweepInterval = time.Minute

// sweepConcurrency is how many batches a pass advances at once: each is a
// few reads and lists, and a finalization streams its results.
const sweepConcurrency = 4

// nudgeBuffer is how many nudges wait for RunSweeper; more are dropped, and
// the next pass finds those batches anyway.
const nudgeBuffer = 64

// Sweep advances every open batch once, and returns the errors of those it
// could not advance (they are tried again at the next pass).
func (p *Service) Sweep(ctx context.Context) error {
	if p.store == nil {
		return nil
	}
	keys, err := p.store.List(ctx, job.OpenBatchesPrefix)
	if err != nil {
		return err
	}
	errs := make([]error, len(keys))
	var g errgroup.Group
	g.SetLimit(sweepConcurrency)
	for i, k := range keys {
		key, ok := job.OpenBatchRecord(k)
		if !ok {
			continue
		}
		g.Go(func() error {
			if errs[i] = p.advanceBatch(ctx, key); errs[i] != nil {
				p.m.sweepErrors.Inc()
				p.log.Warn("advancing a batch", "key", key, "err", errs[i])
			}
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

// RunSweeper sweeps every interval, and advances each batch it is nudged
// about, until ctx ends. Nudged batches are advanced by sweepConcurrency
// workers of their own, beside the passes: a nudge may start a long step
// (a batch's validation reads its whole file), and that must hold back
// neither the passes nor the other nudged batches.
func (p *Service) RunSweeper(ctx context.Context, interval time.Duration) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for range sweepConcurrency {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case key := <-p.nudges:
					if err := p.advanceBatch(ctx, key); err != nil {
						p.m.sweepErrors.Inc()
						p.log.Warn("advancing a batch", "key", key, "err", err)
					}
				}
			}
		})
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	_ = p.Sweep(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = p.Sweep(ctx)
		}
	}
}

// nudge asks RunSweeper to advance the batch whose record is at key now
// rather than at its next pass; it never waits (under Lambda nothing takes
// nudges, and the schedule's pass does the work).
func (p *Service) nudge(key string) {
	select {
	case p.nudges <- key:
	default:
	}
}

// AdvanceBatch advances batch id now, as a sweep would: what its completion
// event triggers. Its marker names its owner, so it is found by a List of
// the open batches; a batch with none has ended already.
func (p *Service) AdvanceBatch(ctx context.Context, id string) error {
	if p.store == nil || !validBatchID(id) && !validMessageBatchID(id) {
		return nil
	}
	keys, err := p.store.List(ctx, job.OpenBatchesPrefix)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if key, ok := job.OpenBatchRecord(k); ok && strings.HasSuffix(k, "/"+id) {
			return p.advanceBatch(ctx, key)
		}
	}
	return nil
}
