package subscriber

import (
	"context"

	"github.com/vramq/vramq/internal/bytesize"
)

// Strategy is how messages are admitted onto the device.
type Strategy string

const (
	// AdmitVRAM weighs each message by its estimated working memory against
	// the device's memory budget: what vramq is for.
	AdmitVRAM Strategy = "vram"
	// AdmitCount runs at most N messages at once, whatever their size: the
	// usual fixed-semaphore fix, kept for comparison.
	AdmitCount Strategy = "count"
	// AdmitNone runs every message as soon as it is received: the naive
	// consumer, kept for comparison.
	AdmitNone Strategy = "none"
)

func (s Strategy) valid() bool {
	return s == AdmitVRAM || s == AdmitCount || s == AdmitNone
}

// admit takes waiting messages in order and admits each once admission has
// room for it. A message not admitted within AdmitTimeout of its receipt is
// released for another consumer rather than kept waiting here (backpressure).
func (s *Subscriber) admit(ctx context.Context, out chan<- *task) {
	defer close(out)
	for t := range s.buffer {
		if ctx.Err() != nil || t.lease.lost.Load() {
			s.releaseWaiting(t, "shutdown or lost lease")
			continue
		}
		if s.adm.strategy == AdmitVRAM {
			t.cost, t.factor = s.corr.apply(t.raw, s.adm.size)
		}
		w := s.adm.weight(t.cost)
		var err error
		if !s.adm.tryAcquire(w) {
			s.admitBlocked.Store(true)
			select {
			case s.admitKick <- struct{}{}:
			default:
			}
			if s.launchesAhead(t) {
				t.ahead = s.launchAhead(ctx, t)
			}
			actx, cancel := context.WithDeadline(ctx, t.lease.received.Add(s.cfg.AdmitTimeout))
			err = s.adm.acquire(actx, w)
			cancel()
			s.admitBlocked.Store(false)
		}
		if err != nil {
			reason := "shutdown"
			if ctx.Err() == nil {
				reason = "backpressure"
				s.log.Info("not admitted in time; released for another consumer",
					"message_id", t.lease.msg.ID, "cost", bytesize.Format(t.cost), "admit_timeout", s.cfg.AdmitTimeout)
			}
			s.releaseWaiting(t, reason)
			continue
		}
		t.weight = w
		s.stampAdmitted(t)
		s.m.admitted.Inc()
		s.m.inflight.Add(float64(t.cost))
		if now := s.inflight.Add(t.cost); now > s.peak.Load() {
			s.peak.Store(now) // only this goroutine raises it
			s.m.inflightPeak.Set(float64(now))
		}
		out <- t // the batcher always takes it, also during shutdown
	}
}

// giveBack gives back what t holds in admission, once; the message goes on
// (to the outbox, or to its end). The bytes leave the in-flight count
// before the weight goes back, or the next admission could be counted while
// this one still is, and the peak would show more than the budget for an
// instant.
func (s *Subscriber) giveBack(t *task) {
	if t.cost > 0 {
		s.m.inflight.Sub(float64(t.cost))
		s.inflight.Add(-t.cost)
		t.cost = 0
	}
	if t.weight > 0 {
		s.adm.giveBack(t.weight)
		t.weight = 0
	}
}

// launchesAhead reports whether t, waiting for admission, is launched
// meanwhile: under vram, with a model that launches in two phases, for a
// message that fills a batch on its own (so no batching is lost) and is not
// a suspect (which runs alone anyway, but only after its batch-mates have
// let go), nor run in parts (a launch is of a whole message). Its launch then overlaps the batches working on the device, and
// when memory frees it starts work at once. Without it the device idled
// through the launch of every large message, since two large messages
// admitted together also launched together (bench/README.md, the strategy
// comparison's launch-ahead step, has the figures).
func (s *Subscriber) launchesAhead(t *task) bool {
	return s.launcher != nil && s.adm.strategy == AdmitVRAM && t.cost >= s.batchCap() && t.parts == nil &&
		!s.suspects.has(t.lease.msg.ID)
}

// launchAhead starts launching t's batch of one, under ctx: shutdown ends
// a launch whose message is then handed back unstarted.
func (s *Subscriber) launchAhead(ctx context.Context, t *task) *launched {
	a := &launched{done: make(chan struct{})}
	items := t.work.Items
	s.runners.Go(func() {
		defer close(a.done)
		a.l, a.err = s.modelLaunch(ctx, items)
	})
	return a
}

// releaseWaiting hands back a message that never started.
func (s *Subscriber) releaseWaiting(t *task, why string) {
	s.log.Debug("releasing unstarted message", "message_id", t.lease.msg.ID, "why", why)
	s.startTasks(1)
	s.release(t, 0)
}
