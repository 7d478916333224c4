package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/internal/batcher"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
)

// sender puts a job's chunks on the queue. The SDK retries whole calls that
// failed (throttling, 5xx, broken connections); what it cannot see are the
// entries a successful SendMessageBatch lists in Failed, so those, and only
// those, are retried here, with jittered exponential backoff: all but the
// ones whose kind (job/fault) says sending again cannot help, an entry
// refused for good and a setup that needs an operator.
type sender struct {
	queue         Queue
	attempts      int            // per entry, the first send included
	retry         backoff.Policy // the wait before each retry
	maxBatchBytes int            // total payload of one SendMessageBatch
	concurrency   int            // batches in flight at once for one job
	m             *metrics
	log           *slog.Logger
}

// batches groups chunks into SendMessageBatch calls: ten entries at most,
// and no more payload than one call may carry. All of a job's chunks are
// known at once, so the batches are cut by the shared rule (batcher.Split)
// rather than gathered by a batcher, and send runs them itself: it stops at
// the first that fails for good, and a FIFO queue takes them in order.
func (s *sender) batches(jobID, tenant string, chunks []Chunk) [][]Entry {
	entries := make([]Entry, len(chunks))
	for i, c := range chunks {
		entries[i] = Entry{Body: c.Body, JobID: jobID, Chunk: c.Index, Tenant: tenant}
	}
	return batcher.Split(entries, entrySize, batcher.Options{MaxItems: job.MaxBatch, MaxBytes: s.maxBatchBytes})
}

// entrySize is an entry's payload as SQS counts it against maxBatchBytes:
// the body and every attribute's name, type and value (job.MessageSize).
func entrySize(e Entry) int { return job.MessageSize(e.Body, attributes(e.JobID, e.Chunk, e.Tenant)) }

// send puts every chunk on the queue and returns how many SQS confirmed. An
// error means some chunk is not known to be on the queue; the job is then
// incomplete and the caller says so. On a FIFO queue batches go one at a
// time, in order.
func (s *sender) send(ctx context.Context, jobID, tenant string, chunks []Chunk) (int, error) {
	var sent atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	limit := s.concurrency
	if f, ok := s.queue.(interface{ FIFO() bool }); ok && f.FIFO() {
		limit = 1
	}
	g.SetLimit(limit)
	for _, b := range s.batches(jobID, tenant, chunks) {
		if gctx.Err() != nil {
			break // a batch failed for good: the job is incomplete whatever follows
		}
		g.Go(func() error { return s.sendBatch(gctx, b, &sent) })
	}
	err := g.Wait()
	return int(sent.Load()), err
}

func (s *sender) sendBatch(ctx context.Context, pending []Entry, sent *atomic.Int64) error {
	for attempt := 1; ; attempt++ {
		errs, err := s.queue.SendBatch(ctx, pending)
		if err != nil {
			s.m.sqsCalls.WithLabelValues("error").Inc()
			return fmt.Errorf("SendMessageBatch: %w", err)
		}
		s.m.sqsCalls.WithLabelValues("ok").Inc()
		var retry []Entry
		var firstErr, permanent error
		for i, e := range errs {
			if e == nil {
				sent.Add(1)
				s.m.chunksSent.Inc()
				continue
			}
			code := "other"
			var ee *EntryError
			if errors.As(e, &ee) {
				code = ee.Code
			}
			s.m.failedEntries.WithLabelValues(code).Inc()
			if firstErr == nil {
				firstErr = e
			}
			if errors.Is(e, fault.ErrInvalidInput) || errors.Is(e, fault.ErrNeedsOperator) {
				if permanent == nil {
					permanent = fmt.Errorf("chunk %d of job %s refused by the queue: %w", pending[i].Chunk, pending[i].JobID, e)
				}
				continue
			}
			retry = append(retry, pending[i])
		}
		if permanent != nil {
			// Sending the rest again cannot make the job whole.
			return permanent
		}
		if len(retry) == 0 {
			return nil
		}
		if attempt >= s.attempts {
			return fmt.Errorf("%d chunks still failing after %d attempts, first: %w", len(retry), attempt, firstErr)
		}
		s.log.Warn("retrying failed SendMessageBatch entries", "job_id", retry[0].JobID, "entries", len(retry),
			"attempt", attempt, "err", firstErr)
		s.m.sendRetries.Add(float64(len(retry)))
		if err := backoff.Sleep(ctx, s.retry.Delay(attempt)); err != nil {
			return err
		}
		pending = retry
	}
}

// sendRetry is the backoff between tries of failed entries: first
// (Config.SendBackoff), doubled up to 2 s, with "equal jitter" so that a
// burst of failed entries from many requests does not come back in lockstep.
func sendRetry(first time.Duration) backoff.Policy {
	return backoff.Policy{First: first, Max: 2 * time.Second, Jitter: backoff.Equal}
}
