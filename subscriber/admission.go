package subscriber

import (
	"context"
	"errors"
	"sync"

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
// handed back for another consumer rather than kept waiting here
// (backpressure), as a fresh copy: waiting is not its fault.
func (s *Subscriber) admit(ctx context.Context, b *batcher) {
	defer b.close()
	for t := range s.buffer {
		if t.lease.lost.Load() {
			s.startTasks(1)
			s.end(t, endRelease(0)) // gone already: a copy would run it twice
			continue
		}
		if ctx.Err() != nil {
			s.releaseWaiting(t, "shutdown")
			continue
		}
		if s.adm.strategy == AdmitVRAM {
			t.cost, t.factor = s.corr.apply(t.raw, s.adm.size)
		}
		n := s.adm.fit(need{weight: s.adm.weight(t.cost), res: t.needs})
		var err error
		if !s.adm.tryTake(n) {
			b.admissionFull()
			if s.launchesAhead(t) {
				t.ahead = s.launchAhead(ctx, t)
			}
			actx, cancel := context.WithDeadline(ctx, t.lease.received.Add(s.cfg.AdmitTimeout))
			err = s.adm.take(actx, n)
			cancel()
		}
		if err != nil {
			reason := "shutdown"
			if ctx.Err() == nil {
				reason = "backpressure"
				s.log.Info("not admitted in time; handed back for another consumer",
					"message_id", t.lease.msg.ID, "cost", bytesize.Format(t.cost), "admit_timeout", s.cfg.AdmitTimeout)
			}
			s.releaseWaiting(t, reason)
			continue
		}
		s.stampAdmitted(t)
		s.m.admitted.Inc()
		t.hold = s.newHold(n, t.cost)
		b.add(t)
	}
}

// A hold is what one admitted message holds: its need in admission and
// its estimated bytes in flight (inflight_bytes, PeakBytes). Its task owns
// it from admission to the message's end, and every give-back goes through
// it. Each method gives back only what the hold still has, so a second
// release gives back nothing, and a release after the weight went
// elsewhere (yieldWeight, handOver) gives back the rest. A hold counts as
// open in admission (admission.holds) until its first release, so one
// that is never released shows once work is done.
type hold struct {
	s *Subscriber

	mu        sync.Mutex
	need      need  // what it holds in admission
	bytes     int64 // estimated bytes counted in flight
	exclusive bool  // the whole budget, taken by takeAll: release ends the exclusive run
	released  bool
}

// newHold is the hold of a message just admitted with n, counting its
// bytes in flight. Only the admission goroutine calls it with bytes, so
// only it raises the peak.
func (s *Subscriber) newHold(n need, bytes int64) *hold {
	s.adm.holds.Add(1)
	h := &hold{s: s, need: n, bytes: bytes}
	if bytes > 0 {
		s.m.inflight.Add(float64(bytes))
		if now := s.inflight.Add(bytes); now > s.peak.Load() {
			s.peak.Store(now)
			s.m.inflightPeak.Set(float64(now))
		}
	}
	return h
}

// release gives back everything h still holds, once; the message goes on
// (to the outbox, or to its end). The bytes leave the in-flight count
// before the weight goes back, or the next admission could be counted while
// this one still is, and the peak would show more than the budget for an
// instant; an exclusive run ends once its weight is back. A nil hold (a
// message never admitted) holds nothing.
func (h *hold) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return
	}
	h.released = true
	h.s.adm.holds.Add(-1)
	if h.bytes > 0 {
		h.s.m.inflight.Sub(float64(h.bytes))
		h.s.inflight.Add(-h.bytes)
		h.bytes = 0
	}
	h.s.adm.putBack(h.need)
	h.need = need{}
	if h.exclusive {
		h.exclusive = false
		h.s.adm.endExclusive()
	}
}

// yieldWeight gives back h's weight and keeps its bytes in flight: the
// message is still on its way, to run alone (takeAll).
func (h *hold) yieldWeight() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.s.adm.putBack(need{weight: h.need.weight})
	h.need.weight = 0
}

// errReleased is takeAll's on a hold released already.
var errReleased = errors.New("admission hold already released")

// takeAll waits until no other work is admitted and adds the whole budget
// to h (admission.acquireAll), which it holds until release; h should hold
// no weight then, or it would wait for itself. It returns the weight
// taken. On an error h holds no more than before and the exclusive run has
// ended.
func (h *hold) takeAll(ctx context.Context) (int64, error) {
	a := h.s.adm
	n, err := a.acquireAll(ctx)
	if err != nil {
		a.endExclusive()
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		a.giveBack(n)
		a.endExclusive()
		return 0, errReleased
	}
	h.need.weight += n
	h.exclusive = true
	return n, nil
}

// handOver moves the weight of from into a new hold, for a goroutine that
// waits for a run that outlived its timeout: until the model returns, the
// device memory it was admitted for is still in use, while the messages go
// on (released for a retry, with their bytes). An exclusive run stays with
// its message's hold.
func (s *Subscriber) handOver(from ...*hold) *hold {
	to := s.newHold(need{}, 0)
	for _, h := range from {
		h.mu.Lock()
		to.need.weight += h.need.weight
		for r, v := range h.need.res {
			to.need.res[r] += v // its requests are still out
		}
		h.need = need{}
		h.mu.Unlock()
	}
	return to
}

// giveBack releases what t holds in admission (hold.release), as every end
// of a message does first (message.go), so that no path can forget it.
func (s *Subscriber) giveBack(t *task) { t.hold.release() }

// launchesAhead reports whether t, waiting for admission, is launched
// meanwhile: under vram, with a model that launches in two phases, for a
// message that fills a batch on its own (so no batching is lost) and is not
// a suspect (which runs alone anyway, but only after its batch-mates have
// let go), nor run in parts (a launch is of a whole message). Its launch
// then overlaps the batches working on the device, and when memory frees it
// starts work at once; otherwise the device would idle through the launch of
// every large message, as two admitted together would launch together.
func (s *Subscriber) launchesAhead(t *task) bool {
	return s.launcher != nil && t.work.Endpoint == "" && s.adm.strategy == AdmitVRAM && t.cost >= s.batchCap() && t.parts == nil &&
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

// releaseWaiting hands back a message that never started, at no cost to
// its receive count: why is "shutdown" or "backpressure".
func (s *Subscriber) releaseWaiting(t *task, why string) {
	s.log.Debug("handing back unstarted message", "message_id", t.lease.msg.ID, "why", why)
	s.startTasks(1)
	s.end(t, endHandBack(0, why))
}
