package subscriber

import (
	"context"
	"fmt"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// fillWait is the longest the poller waits for room for a full receive
// while messages are still waiting to start.
const fillWait = 500 * time.Millisecond

// poll receives while ctx lasts, asking only for what the buffers have room
// for. The receive itself runs under recvCtx, which shutdown does not cancel
// at once: a long poll cut off mid-flight can lose the messages SQS already
// took for it (they stay invisible for a whole timeout), so shutdown lets it
// answer and hands its messages straight back.
func (s *Subscriber) poll(ctx, recvCtx context.Context) {
	defer close(s.buffer)
	// Fetches send to the buffer, so it closes only after they are done;
	// shutdown cancels them through ctx.
	defer s.fetches.Wait()
	failures := 0
	var topUp time.Time // when a partial receive may go, while waiting for room for a full one
	for ctx.Err() == nil {
		n := s.room()
		if n == 0 {
			select {
			case <-s.roomKick:
			case <-ctx.Done():
			}
			continue
		}
		// A receive costs one request for one message or ten. While
		// messages are still waiting to start there is no hurry, so wait a
		// little for room for a full receive rather than asking each time
		// one slot frees, which under load makes a request per message.
		// Waiting ends when the buffer runs dry, and after fillWait in any
		// case, in case what waits is stuck (a slow claim-check fetch).
		if n < s.fullReceive() && s.waiting.Load() > 0 {
			if topUp.IsZero() {
				topUp = time.Now().Add(fillWait)
			}
			if wait := time.Until(topUp); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-s.roomKick:
				case <-t.C:
				case <-ctx.Done():
				}
				t.Stop()
				continue
			}
		}
		topUp = time.Time{}
		start := time.Now()
		msgs, err := s.queue.Receive(recvCtx, n, s.cfg.WaitTime, s.cfg.Visibility)
		if err != nil {
			if recvCtx.Err() != nil {
				return
			}
			failures++
			s.pollErrSince.CompareAndSwap(0, start.UnixNano())
			// The SDK has already retried; this only keeps a dead endpoint
			// from being hammered.
			wait := min(time.Second<<min(failures-1, 5), 20*time.Second)
			s.log.Error("receive failed", "err", err, "consecutive", failures, "retry_in", wait)
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
			continue
		}
		failures = 0
		s.pollErrSince.Store(0)
		for _, m := range msgs {
			s.accept(ctx, m, start)
		}
	}
}

// accept takes a lease on m and sends it on: to the buffer, to the DLQ when
// it can never run, or straight back when shutting down. A message with
// claim-checked items is fetched off the poll loop, so a slow bucket does not
// hold up receiving.
func (s *Subscriber) accept(ctx context.Context, m Message, start time.Time) {
	l := s.keeper.hold(m, start)
	s.m.received.Inc()
	if m.ReceiveCount > 1 {
		s.m.redelivered.Inc()
	}
	s.received.Add(1)
	if ctx.Err() != nil {
		s.keeper.finish(l, true, 0)
		return
	}
	w, err := job.DecodeWork([]byte(m.Body))
	if err != nil {
		s.deadLetterAsync(l, "malformed", err.Error())
		return
	}
	s.addWaiting()
	if !hasRefs(w) {
		s.enqueue(l, w)
		return
	}
	if s.payloads == nil {
		s.startTasks(1)
		s.deadLetterAsync(l, "claim_check", unconfigured(w))
		return
	}
	s.fetches.Go(func() { s.claim(ctx, l, w) })
}

// enqueue sends a decoded message, already counted as waiting, on to
// admission, or to the DLQ when it can never fit. Its cost is estimated from
// its content, so claim-checked items must have been fetched.
func (s *Subscriber) enqueue(l *lease, w *job.Work) {
	cost := s.cfg.Model.Cost(w.Items)
	if !s.adm.fits(cost) {
		s.startTasks(1)
		s.deadLetterAsync(l, "too_large", fmt.Sprintf(
			"estimated working memory %s exceeds the whole VRAM budget %s (%d items)",
			gpu.FormatBytes(cost), gpu.FormatBytes(s.budget), len(w.Items)))
		return
	}
	// Never blocks: room() kept waiting, which counts this message, within
	// the buffer's capacity.
	s.buffer <- &task{lease: l, work: w, cost: cost}
}

func unconfigured(w *job.Work) string {
	for _, it := range w.Items {
		if it.Ref != nil {
			return fmt.Sprintf("item %q references s3://%s/%s but no payload bucket is configured", it.ID, it.Ref.Bucket, it.Ref.Key)
		}
	}
	return "no payload bucket is configured"
}

func (s *Subscriber) deadLetterAsync(l *lease, kind, reason string) {
	s.aux.Go(func() { s.deadLetter(l, kind, reason) })
}
