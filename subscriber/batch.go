package subscriber

import (
	"context"
	"math"
	"slices"
	"time"
)

// The batch stage: admitted messages are put together into the device batches the model runs, by size and
// delay (batcher).

// A batcher packs admitted messages into device batches: a batch goes when
// it reaches the batch limit, MaxBatchDelay after its first message, at
// once when admission is full (nothing more can join it until something
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
// when the last batch returns whatever has gathered goes at once rather
// than at its delay.
//
// With a model of length classes (gpu.LengthClasser) there is one pending
// batch per class, each with its own delay and limits: a transformer pads
// a batch's items to a common length, so a short message batched with a
// long one either waits for the long one's work or, split into
// sub-batches by the model, gains nothing from sharing the batch.
//
// A message launched ahead while it waited (admit), run in parts
// (admit.go), or in a batch that failed (see suspects) runs on its own,
// after what was pending in its class.
//
// One goroutine, run, owns all of this state: the pending batches, the
// timer of the earliest, and the count of batches running. What it acts
// on comes to it on channels: admission hands it each admitted message
// (add) and says when it has no room for the next (admissionFull), and
// each batch says when it has returned. So, like text-embeddings-
// inference's batching task, which owns its queue and takes the next batch
// from it when the backend is free, it sees the device free up as an event
// of its own rather than in counters other stages write.
//
// Each batch runs in its own goroutine under the work context; admission
// already bounds what runs at once.
type batcher struct {
	s        *Subscriber
	work     context.Context                // batches run under it
	runBatch func(context.Context, []*task) // s.runBatch; another in tests of the batcher alone

	in       chan *task    // admitted messages; closed after admission's last
	took     chan struct{} // the message add handed over is in a batch, its per-batch part given back
	full     chan struct{} // admission waits for room for its next message
	returned chan struct{} // a batch has returned from runBatch

	// Owned by run.
	pending  map[int]*pendingBatch // by length class
	gathered int                   // messages in pending batches
	running  int                   // batches started and not returned
	timer    *time.Timer           // the earliest pending batch's delay; nil when none
}

// pendingBatch is a batch gathering messages of one length class.
type pendingBatch struct {
	tasks []*task
	cost  int64       // the per-batch part (share) once
	share *batchShare // nil while no message has brought a per-batch part
	due   time.Time   // MaxBatchDelay after its first message
}

// newBatcher returns a batcher whose batches run under work.
func (s *Subscriber) newBatcher(work context.Context) *batcher {
	return &batcher{s: s, work: work, runBatch: s.runBatch,
		in: make(chan *task), took: make(chan struct{}), full: make(chan struct{}), returned: make(chan struct{}), pending: map[int]*pendingBatch{}}
}

// add hands the batcher t, admitted. It always takes it, also during
// shutdown, and returns once t is in a batch: what t gives back of its
// per-batch part (gather) is then free for admission's next message.
func (b *batcher) add(t *task) {
	b.in <- t
	<-b.took
}

// admissionFull tells the batcher that admission has no room for its next
// message: no message can join a pending batch until something finishes,
// so waiting for company only delays. Like add it returns once the batcher
// has taken it, so the two reach it in the order admission sends them.
func (b *batcher) admissionFull() { b.full <- struct{}{} }

// close tells the batcher that admission has admitted its last message.
func (b *batcher) close() { close(b.in) }

// run batches until admission has closed (after ctx ends) and every batch
// it started has returned. Once ctx has ended, what it holds and what
// comes is handed back unstarted.
func (b *batcher) run(ctx context.Context) {
	in, done := b.in, ctx.Done()
	for in != nil || b.running > 0 {
		select {
		case t, ok := <-in:
			if !ok {
				// Closed only after shutdown began; select may see this
				// before done, so hand back what has not started.
				b.releaseAll()
				in = nil
				continue
			}
			if ctx.Err() != nil {
				b.s.releaseWaiting(t, "shutdown")
			} else {
				b.gather(t)
			}
			b.took <- struct{}{}
		case <-b.full:
			b.sendAll()
		case <-b.returned:
			b.running--
			if b.idle() {
				b.sendAll()
			}
		case <-b.fired():
			b.timer = nil
			b.sendDue(time.Now(), false)
		case <-done:
			b.releaseAll()
			done = nil
		}
	}
}

// gather adds t to its class's pending batch, or runs it on its own, and
// sends what that makes ready.
func (b *batcher) gather(t *task) {
	s := b.s
	if t.ahead != nil || t.parts != nil || s.suspects.has(t.lease.msg.ID) {
		b.send(t.class)
		b.start([]*task{t})
		b.rearm()
		return
	}
	p := b.pending[t.class]
	if p == nil {
		p = &pendingBatch{due: time.Now().Add(s.cfg.MaxBatchDelay)}
		b.pending[t.class] = p
	}
	p.tasks = append(p.tasks, t)
	p.cost += t.cost
	if part := s.batchPart(t); part > 0 {
		if p.share == nil {
			p.share = s.openBatch(t, part)
		} else {
			s.joinBatch(t, p.share, part)
			p.cost -= part
		}
	}
	b.gathered++
	switch {
	case b.idle():
		b.sendAll()
	case len(p.tasks) >= s.state.batchLimit() || p.cost >= s.batchCap():
		b.send(t.class)
		b.rearm()
	case len(p.tasks) == 1:
		b.rearm()
	}
}

// idle reports whether the device is idle and every waiting message is in
// a pending batch (see batcher). waiting is the one count read here that
// the batcher does not own: every stage a message passes before it starts
// lowers it when the message ends there, and the poller sizes its receives
// by it.
func (b *batcher) idle() bool {
	return b.gathered > 0 && b.running == 0 && b.s.waiting.Load() == int64(b.gathered)
}

// sendAll sends every pending batch, oldest first.
func (b *batcher) sendAll() { b.sendDue(time.Time{}, true) }

// sendDue sends the pending batches due by now, or all of them, oldest
// first, and rearms the timer for the rest.
func (b *batcher) sendDue(now time.Time, all bool) {
	classes := make([]int, 0, len(b.pending))
	for c, p := range b.pending {
		if all || !p.due.After(now) {
			classes = append(classes, c)
		}
	}
	slices.SortFunc(classes, func(x, y int) int { return b.pending[x].due.Compare(b.pending[y].due) })
	for _, c := range classes {
		b.send(c)
	}
	b.rearm()
}

// send starts class's pending batch, if any.
func (b *batcher) send(class int) {
	p := b.pending[class]
	delete(b.pending, class)
	if p == nil || len(p.tasks) == 0 {
		return
	}
	b.gathered -= len(p.tasks)
	b.start(p.tasks)
}

// start runs tasks as a batch in a goroutine of its own, which tells run
// when it has returned.
func (b *batcher) start(tasks []*task) {
	b.s.startedTasks(len(tasks))
	b.running++
	b.s.runners.Go(func() {
		defer func() { b.returned <- struct{}{} }()
		b.runBatch(b.work, tasks)
	})
}

// releaseAll hands back every pending message unstarted: shutdown.
func (b *batcher) releaseAll() {
	for _, p := range b.pending {
		for _, t := range p.tasks {
			b.s.releaseWaiting(t, "shutdown")
		}
	}
	clear(b.pending)
	b.gathered = 0
	b.rearm()
}

// rearm sets the timer to the earliest pending batch's delay, or stops it.
func (b *batcher) rearm() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	var next time.Time
	for _, p := range b.pending {
		if next.IsZero() || p.due.Before(next) {
			next = p.due
		}
	}
	if !next.IsZero() {
		b.timer = time.NewTimer(time.Until(next))
	}
}

// fired is the timer's channel; nil, never ready, when none is armed.
func (b *batcher) fired() <-chan time.Time {
	if b.timer == nil {
		return nil
	}
	return b.timer.C
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
