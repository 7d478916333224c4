package subscriber

import (
	"context"
	"math"
	"slices"
	"time"
)

// batch packs admitted messages into device batches: a batch goes when it
// reaches the batch limit, MaxBatchDelay after its first message, at once
// when admission is full (nothing more can join it until something
// finishes), or, under vram, when it holds MaxBatchBytes (a quarter of the
// budget as it is then, by default), so that the next batch can start, and
// pay its fixed launch time, while others work.
//
// And pending batches go at once when the device is idle (no batch running)
// and nothing else is on its way: every message received and not started
// is already in a pending batch, none being fetched, decoded, in the
// buffer, waiting for admission or still in the current receive's
// remainder (the poller counts a whole receive as waiting before passing
// it on). Waiting for company then only delays: nobody is coming, and the
// device does nothing meanwhile. This is the rule of Triton's dynamic
// batcher and text-embeddings-inference: batch what is queued when the
// device frees, never hold an idle device back. Under load a batch is
// running, so messages still gather up to the delay and the limits; and
// when the last batch returns (idleKick) whatever has gathered goes at
// once rather than at its delay. Under light load that brought latency
// below what a 1 ms delay gave (bench/README.md, "Adaptive batch delay",
// has the figures and the commands).
//
// With a model of length classes (gpu.LengthClasser) there is one pending
// batch per class, each with its own delay and limits: a transformer pads
// a batch's items to a common length, so a short message batched with a
// long one either waits for the long one's work or, split into
// sub-batches by the model, gains nothing from sharing the batch.
//
// Each batch runs in its own goroutine under workCtx; admission already
// bounds what runs at once.
func (s *Subscriber) batch(ctx, workCtx context.Context, in <-chan *task) {
	type pendingBatch struct {
		tasks []*task
		cost  int64
		due   time.Time // MaxBatchDelay after its first message
	}
	pending := map[int]*pendingBatch{} // by class
	var timer *time.Timer
	var fire <-chan time.Time
	done := ctx.Done()
	// rearm sets the timer to the earliest due batch, or stops it.
	rearm := func() {
		if timer != nil {
			timer.Stop()
			timer, fire = nil, nil
		}
		var next time.Time
		for _, b := range pending {
			if next.IsZero() || b.due.Before(next) {
				next = b.due
			}
		}
		if !next.IsZero() {
			timer = time.NewTimer(time.Until(next))
			fire = timer.C
		}
	}
	flush := func(class int) {
		b := pending[class]
		delete(pending, class)
		if b == nil || len(b.tasks) == 0 {
			return
		}
		s.startTasks(len(b.tasks))
		s.running.Add(1)
		s.runners.Go(func() {
			defer s.batchReturned()
			s.runBatch(workCtx, b.tasks)
		})
	}
	// idle reports whether the device is idle and every waiting message is
	// in a pending batch (see above).
	idle := func() bool {
		var n int64
		for _, b := range pending {
			n += int64(len(b.tasks))
		}
		return n > 0 && s.running.Load() == 0 && s.waiting.Load() == n
	}
	// flushWhere sends every pending batch that keep says to, oldest
	// first, and rearms the timer for the rest.
	flushWhere := func(keep func(b *pendingBatch) bool) {
		classes := make([]int, 0, len(pending))
		for c, b := range pending {
			if keep(b) {
				classes = append(classes, c)
			}
		}
		slices.SortFunc(classes, func(a, b int) int { return pending[a].due.Compare(pending[b].due) })
		for _, c := range classes {
			flush(c)
		}
		rearm()
	}
	all := func(*pendingBatch) bool { return true }
	releaseAll := func() {
		for _, b := range pending {
			for _, t := range b.tasks {
				s.releaseWaiting(t, "shutdown")
			}
		}
		clear(pending)
		rearm()
	}
	for {
		select {
		case t, ok := <-in:
			if !ok {
				// Closed only after shutdown began; select may see this
				// before done, so hand back what has not started.
				releaseAll()
				return
			}
			if ctx.Err() != nil {
				s.releaseWaiting(t, "shutdown")
				continue
			}
			if t.ahead != nil || t.parts != nil || s.suspects.has(t.lease.msg.ID) {
				// Launched as a batch of one while it waited, run in
				// parts (parts.go), or in a batch that failed (see
				// suspects): runs on its own, after what was pending in
				// its class.
				flush(t.class)
				pending[t.class] = &pendingBatch{tasks: []*task{t}, cost: t.cost}
				flush(t.class)
				rearm()
				continue
			}
			b := pending[t.class]
			if b == nil {
				b = &pendingBatch{due: time.Now().Add(s.cfg.MaxBatchDelay)}
				pending[t.class] = b
			}
			b.tasks = append(b.tasks, t)
			b.cost += t.cost
			switch {
			case s.admitBlocked.Load() && len(in) == 0, idle():
				flushWhere(all)
			case len(b.tasks) >= s.state.batchLimit() || b.cost >= s.batchCap():
				flush(t.class)
				rearm()
			case len(b.tasks) == 1:
				rearm()
			}
		case <-fire:
			timer, fire = nil, nil
			now := time.Now()
			flushWhere(func(b *pendingBatch) bool { return !b.due.After(now) })
		case <-s.idleKick:
			if idle() {
				flushWhere(all)
			}
		case <-s.admitKick:
			if s.admitBlocked.Load() && len(in) == 0 {
				flushWhere(all)
			}
		case <-done:
			// Admitted but not started: hand back at once.
			releaseAll()
			done = nil
		}
	}
}

// batchReturned counts a batch as returned and, when it was the last one
// running, tells the batcher that the device is idle.
func (s *Subscriber) batchReturned() {
	if s.running.Add(-1) == 0 {
		select {
		case s.idleKick <- struct{}{}:
		default:
		}
	}
}

// batchCap is the most estimated memory a batch gathers before it goes:
// under vram MaxBatchBytes, by default a quarter of the budget now.
func (s *Subscriber) batchCap() int64 {
	switch {
	case s.adm.strategy != AdmitVRAM:
		return math.MaxInt64
	case s.cfg.MaxBatchBytes > 0:
		return s.cfg.MaxBatchBytes
	}
	return max(s.adm.budget()/4, 1)
}
