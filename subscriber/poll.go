package subscriber

import (
	"context"
	"fmt"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// poll receives while ctx lasts, asking only for what the buffers have room
// for. The receive itself runs under recvCtx, which shutdown does not cancel
// at once: a long poll cut off mid-flight can lose the messages SQS already
// took for it (they stay invisible for a whole timeout), so shutdown lets it
// answer and hands its messages straight back.
func (s *Subscriber) poll(ctx, recvCtx context.Context) {
	defer close(s.buffer)
	failures := 0
	for ctx.Err() == nil {
		n := s.room()
		if n == 0 {
			select {
			case <-s.roomKick:
			case <-ctx.Done():
			}
			continue
		}
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
// it can never run, or straight back when shutting down.
func (s *Subscriber) accept(ctx context.Context, m Message, start time.Time) {
	l := s.keeper.hold(m, start)
	s.m.received.Inc()
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
	cost := s.cfg.Model.Cost(w.Items)
	if !s.adm.fits(cost) {
		s.deadLetterAsync(l, "too_large", fmt.Sprintf(
			"estimated working memory %s exceeds the whole VRAM budget %s (%d items)",
			gpu.FormatBytes(cost), gpu.FormatBytes(s.budget), len(w.Items)))
		return
	}
	s.waiting.Add(1)
	s.m.waiting.Set(float64(s.waiting.Load()))
	// Never blocks: room() kept waiting within the buffer's capacity.
	s.buffer <- &task{lease: l, work: w, cost: cost}
}

func (s *Subscriber) deadLetterAsync(l *lease, kind, reason string) {
	s.aux.Go(func() { s.deadLetter(l, kind, reason) })
}
