package subscriber

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"golang.org/x/sync/semaphore"
)

// The admit stage: a message is admitted when everything it needs, its device memory or tokens and the
// resources its backend offers (request slots, rate-limit tokens), is free at once (admission, the
// weighted semaphore under it).

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
					"message_id", t.lease.msg.ID, "cost", s.amount(t.cost), "admit_timeout", s.cfg.AdmitTimeout)
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

// giveBack releases what t holds in admission (hold.release), and its
// share of its batch's per-batch part, as every end of a message does first
// (message.go), so that no path can forget it.
func (s *Subscriber) giveBack(t *task) {
	t.hold.release()
	s.leaveBatch(t)
}

// A batchShare is the part of a batch's cost that the batch needs once
// (gpu.BatchCoster), held in a hold of its own, for as long as any of its
// messages still holds its own part: the batch's messages end at different
// times (a split after out-of-memory runs its halves in turn), and the
// part is needed until the last of them has let go of the device. Admission
// weighs each message with its whole cost, the part included, so that no
// batch is ever admitted short of it; the batcher then moves the part of the
// first message to join a batch into the share and gives back the others'
// (batcher.gather).
type batchShare struct {
	h       *hold
	members atomic.Int64
}

// batchPart is what of t's cost its batch needs once: none unless under
// vram with a model that has a per-batch part, and never more than t's own
// estimate.
func (s *Subscriber) batchPart(t *task) int64 {
	if s.batchCoster == nil || s.adm.strategy != AdmitVRAM || t.hold == nil {
		return 0
	}
	return max(min(s.batchCoster.BatchBytes(), t.raw), 0)
}

// joinBatch makes t a member of sh, which already holds the per-batch part
// t's cost carries: t gives its own back.
func (s *Subscriber) joinBatch(t *task, sh *batchShare, part int64) {
	t.hold.shed(part)
	sh.members.Add(1)
	t.batch.Store(sh)
}

// openBatch is a share funded by t's per-batch part, moved out of its hold,
// with t its first member.
func (s *Subscriber) openBatch(t *task, part int64) *batchShare {
	sh := &batchShare{h: t.hold.split(part)}
	sh.members.Add(1)
	t.batch.Store(sh)
	return sh
}

// leaveBatch ends t's membership of its batch's share, once; the last
// member to leave releases it. A message that runs alone after
// out-of-memory leaves before it waits for the whole budget, or it would
// wait for its own batch's part.
func (s *Subscriber) leaveBatch(t *task) {
	if sh := t.batch.Swap(nil); sh != nil && sh.members.Add(-1) == 0 {
		sh.h.release()
	}
}

// batchHolds is the holds of tasks' batch shares, for handOver: a run that
// outlived its timeout still needs its batch's part.
func batchHolds(tasks []*task) []*hold {
	var hs []*hold
	for _, t := range tasks {
		if sh := t.batch.Load(); sh != nil && !slices.Contains(hs, sh.h) {
			hs = append(hs, sh.h)
		}
	}
	return hs
}

// split moves up to w of h's weight, and as many of its bytes in flight,
// into a new hold, which from then on gives them back itself: admission
// and the in-flight count see no change.
func (h *hold) split(w int64) *hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	if !h.released && !h.exclusive {
		n = max(min(w, h.need.weight), 0)
	}
	b := min(n, h.bytes)
	h.need.weight -= n
	h.bytes -= b
	h.s.adm.holds.Add(1)
	return &hold{s: h.s, need: need{weight: n}, bytes: b}
}

// held is the weight h holds in admission now.
func (h *hold) held() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.need.weight
}

// shed gives back up to w of h's weight, and as many of its bytes in
// flight, while its message still runs: an item's share, its answer in. An
// exclusive run keeps the whole budget until its release.
func (h *hold) shed(w int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released || h.exclusive || w <= 0 {
		return
	}
	n := min(w, h.need.weight)
	h.need.weight -= n
	h.setBytes(h.bytes - min(n, h.bytes))
	if n > 0 {
		h.s.adm.giveBack(n)
	}
}

// fit makes h's weight w: it gives back any excess at once; short of w, it
// gives back all it has and acquires w.
func (h *hold) fit(ctx context.Context, w int64) error {
	h.mu.Lock()
	if h.released || h.exclusive {
		h.mu.Unlock()
		return nil
	}
	if h.need.weight >= w {
		excess := h.need.weight - w
		h.need.weight = w
		h.setBytes(w)
		h.mu.Unlock()
		if excess > 0 {
			h.s.adm.giveBack(excess)
		}
		return nil
	}
	had := h.need.weight
	h.need.weight = 0
	h.setBytes(0)
	h.mu.Unlock()
	if had > 0 {
		h.s.adm.giveBack(had)
	}
	if err := h.s.adm.acquire(ctx, w); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		h.s.adm.giveBack(w)
		return errReleased
	}
	h.need.weight = w
	h.setBytes(w)
	return nil
}

// setBytes makes h's bytes in flight n, keeping the in-flight count (and
// gauge) in step. h.mu is held.
func (h *hold) setBytes(n int64) {
	if d := n - h.bytes; d != 0 {
		h.s.m.inflight.Add(float64(d))
		h.s.inflight.Add(d)
		h.bytes = n
	}
}

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

// admission hands out named resources, each a weighted semaphore: the
// weight, whose units depend on the strategy (bytes for vram, messages for
// count and none), and under vram the resources the model offers besides
// memory (backend.Offerer: a model server's request slots and rate-limit
// tokens), each a resizable admission of its own. A message needs some of
// each (need), taken together by take or tryTake and given back together
// by putBack, so that no path holds one without the others.
//
// semaphore.Weighted is FIFO: a large message at the head waits for room and
// the smaller ones behind it wait too. That is deliberate: skipping ahead
// would starve large messages, and the backpressure bound releases a head
// that waits too long.
//
// Under vram the budget changes while running (another process on the GPU
// takes or gives back memory), and a semaphore.Weighted cannot be resized. So
// the semaphore is sized at the largest budget the device could ever give
// (size), and the admission itself holds the difference between that and the
// budget now as withheld weight. Growing releases withheld weight. Shrinking
// acquires more of it, in the semaphore's FIFO like any message: it waits
// until running work lets go of enough, and every message that asks after it
// waits behind it, so nothing new is admitted until what is in flight is
// under the new budget. A shrink still waiting is a pending one; a newer
// target or close cancels it.
type admission struct {
	strategy Strategy
	// size is the semaphore's: the largest budget (vram), the count, or
	// unbounded (none).
	size int64
	sem  *semaphore.Weighted
	// pools are the resources the model offers (backend.Offerer), nil for
	// one it does not; offerer is nil when it offers none. How much of
	// each changes with what the model says it can take now (resized by
	// the budget refresh, as the weight is), up to most.
	offerer backend.Offerer
	pools   [backend.NumResources]*admission
	most    backend.Vector

	// held is the weight work holds (not the withheld weight) and acquires
	// counts work's acquisitions: together they tell the budget refresh
	// that none of this process's work was on the device during a read.
	held     atomic.Int64
	acquires atomic.Int64
	// holds counts the holds (admit.go) taken and not yet released:
	// none once the last message has ended, and a run that outlived its
	// timeout has returned.
	holds atomic.Int64
	// target is the budget admission works towards: size less withheld
	// weight, once pending shrinks are through.
	target atomic.Int64

	mu       sync.Mutex
	withheld int64     // weight the admission holds itself
	pending  []*shrink // acquisitions of more withheld weight still waiting, oldest first
	// exclusive counts exclusive runs waiting or running: resizes wait
	// for them to end (see acquireAll).
	exclusive int
	closed    bool
}

// need is what one message takes of admission's resources: its weight
// and what it takes of each resource the model offers (0 of one it does
// not).
type need struct {
	weight int64
	res    backend.Vector
}

// offer gives admission the resources o offers, a pool for each with a
// most above 0.
func (a *admission) offer(o backend.Offerer) error {
	now, most := o.Offers()
	for r := range backend.NumResources {
		if most[r] <= 0 {
			continue
		}
		p, err := newResizableAdmission(AdmitVRAM, offered(now[r], most[r]), most[r], 0)
		if err != nil {
			return fmt.Errorf("the model's %s: %w", r, err)
		}
		a.pools[r] = p
		a.offerer = o
	}
	a.most = most
	return nil
}

// offered is the size of a pool for an offer of now, at most most: never
// below 1, so that a message is always admitted, alone, however little a
// model offers. A model server whose rate limits are spent by other
// clients offers nothing, and learns its share again only from the
// answers to requests it sends: a pool of none would admit no message,
// and no answer would ever raise it.
func offered(now, most int64) int64 { return min(max(now, 1), most) }

// take waits, under ctx, until all of n is free and takes it; on an error
// it holds none of it. The model's resources are taken before the weight:
// a model server's slots and rate tokens run out long before its memory,
// and a message waiting for them must not hold weight that messages of
// the other endpoints could run with.
func (a *admission) take(ctx context.Context, n need) error {
	var got need
	for r, p := range a.pools {
		if p == nil || n.res[r] <= 0 {
			continue
		}
		if err := p.acquire(ctx, n.res[r]); err != nil {
			a.putBack(got)
			return err
		}
		got.res[r] = n.res[r]
	}
	if err := a.acquire(ctx, n.weight); err != nil {
		a.putBack(got)
		return err
	}
	return nil
}

// tryTake takes all of n if it is free now, else nothing.
func (a *admission) tryTake(n need) bool {
	var got need
	for r, p := range a.pools {
		if p == nil || n.res[r] <= 0 {
			continue
		}
		if !p.tryAcquire(n.res[r]) {
			a.putBack(got)
			return false
		}
		got.res[r] = n.res[r]
	}
	if !a.tryAcquire(n.weight) {
		a.putBack(got)
		return false
	}
	return true
}

// putBack gives back n, taken by take or tryTake (the weight also by
// acquireAll).
func (a *admission) putBack(n need) {
	if n.weight > 0 {
		a.giveBack(n.weight)
	}
	for r, p := range a.pools {
		if p != nil && n.res[r] > 0 {
			p.giveBack(n.res[r])
		}
	}
}

// fit is n with what it takes of each resource no more than is offered
// now, and nothing of one that is not: a message that needs more than
// there is takes it all, and one waiting for more than a shrink left would
// wait until the admit timeout.
func (a *admission) fit(n need) need {
	for r, p := range a.pools {
		if p == nil {
			n.res[r] = 0
			continue
		}
		n.res[r] = min(n.res[r], max(p.budget(), 1))
	}
	return n
}

// shrink is one acquisition of withheld weight, in its own goroutine so
// that the semaphore's FIFO decides when it goes through.
type shrink struct {
	n      int64
	cancel context.CancelFunc
	done   chan struct{}
	got    bool // whether it acquired; written before done closes
}

// newResizableAdmission returns an admission that starts at budget and can be
// resized up to largest (vram only; the other strategies ignore both).
func newResizableAdmission(s Strategy, budget, largest int64, count int) (*admission, error) {
	a := &admission{strategy: s}
	switch s {
	case AdmitVRAM:
		// A budget of 0 waits for the refresh to grow it; a device that
		// could never give one is refused.
		if budget < 0 || max(largest, budget) <= 0 {
			return nil, fmt.Errorf("admission: VRAM budget is %d bytes; the device has no room for work", budget)
		}
		a.size = max(largest, budget)
	case AdmitCount:
		if count <= 0 {
			return nil, fmt.Errorf("admission: count strategy needs a positive count, got %d", count)
		}
		a.size = int64(count)
		budget = a.size
	case AdmitNone:
		// Effectively unbounded, yet still a semaphore so that an exclusive
		// run can wait for everything else to drain.
		a.size = math.MaxInt64
		budget = a.size
	default:
		return nil, fmt.Errorf("admission: unknown strategy %q (want vram, count or none)", s)
	}
	a.sem = semaphore.NewWeighted(a.size)
	a.withheld = a.size - budget
	a.sem.TryAcquire(a.withheld) // a fresh semaphore has it all
	a.target.Store(budget)
	return a, nil
}

// weight is what a message of the given estimated cost takes from the
// semaphore.
func (a *admission) weight(cost int64) int64 {
	if a.strategy == AdmitVRAM {
		return max(cost, 1)
	}
	return 1
}

// fits reports whether a message of this cost can ever be admitted: under
// vram, whether it fits the largest budget, not the budget now, since memory
// another process holds for a while may come back. Only the vram strategy
// knows: the others learn by running out of memory.
func (a *admission) fits(cost int64) bool {
	return a.strategy != AdmitVRAM || cost <= a.size
}

// budget is the budget now: what admission hands out once pending shrinks
// are through (nothing new is admitted until then).
func (a *admission) budget() int64 { return a.target.Load() }

func (a *admission) acquire(ctx context.Context, w int64) error {
	if err := a.sem.Acquire(ctx, w); err != nil {
		return err
	}
	a.took(w)
	return nil
}

func (a *admission) tryAcquire(w int64) bool {
	if !a.sem.TryAcquire(w) {
		return false
	}
	a.took(w)
	return true
}

func (a *admission) took(w int64) {
	a.held.Add(w)
	a.acquires.Add(1)
}

// giveBack returns weight taken by acquire, tryAcquire or acquireAll.
func (a *admission) giveBack(w int64) {
	a.held.Add(-w)
	a.sem.Release(w)
}

// resize makes target the budget (clamped to 0..size) and returns the one
// it replaces. While an exclusive run waits or runs, the change only waits
// for it to end.
func (a *admission) resize(target int64) (old int64) {
	target = min(max(target, 0), a.size)
	a.mu.Lock()
	defer a.mu.Unlock()
	old = a.target.Swap(target)
	if a.exclusive == 0 && !a.closed {
		a.apply()
	}
	return old
}

// apply moves the withheld weight, with what is pending, to size − target.
// A further shrink keeps the pending ones where they are in the FIFO and
// queues the difference behind them. A growth cancels the pending shrinks it
// makes needless, newest first; one it only partly undoes stays queued, and
// what it withholds beyond the target is released once it goes through:
// cancelling it and queueing a smaller one at the back would let the
// messages queued meanwhile in past both budgets. Called with mu held.
func (a *admission) apply() {
	want := a.size - a.target.Load()
	a.fold()
	for n := len(a.pending); n > 0 && a.withheld+a.pendingSum()-a.pending[n-1].n >= want; n = len(a.pending) {
		a.cancelNewest()
	}
	if a.withheld > want { // nothing is pending here
		a.sem.Release(a.withheld - want)
		a.withheld = want
	}
	more := want - a.withheld - a.pendingSum()
	if more > 0 && len(a.pending) == 0 && a.sem.TryAcquire(more) {
		a.withheld += more // room already: nothing to wait for
		return
	}
	// Queued from a goroutine of its own, the shrink may take a moment to
	// be in the FIFO, and a message asking meanwhile may still be admitted
	// within the old budget: a moment more than the readings take anyway
	// to notice another process.
	if more > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		p := &shrink{n: more, cancel: cancel, done: make(chan struct{})}
		a.pending = append(a.pending, p)
		go func() {
			p.got = a.sem.Acquire(ctx, p.n) == nil
			// done closes before mu is taken: cancelNewest waits for
			// it with mu held.
			close(p.done)
			if !p.got {
				return
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.exclusive == 0 && !a.closed {
				a.apply() // releases what a growth meanwhile left over
			} else {
				a.fold()
			}
		}()
	}
}

// fold moves shrinks that went through from pending to withheld. Called
// with mu held.
func (a *admission) fold() {
	left := a.pending[:0]
	for _, p := range a.pending {
		select {
		case <-p.done:
			p.cancel()
			if p.got {
				a.withheld += p.n
			}
		default:
			left = append(left, p)
		}
	}
	clear(a.pending[len(left):])
	a.pending = left
}

// cancelNewest cancels the newest pending shrink and waits for it, which is
// prompt: Acquire returns as soon as its context ends. Called with mu held.
func (a *admission) cancelNewest() {
	p := a.pending[len(a.pending)-1]
	a.pending[len(a.pending)-1] = nil
	a.pending = a.pending[:len(a.pending)-1]
	p.cancel()
	<-p.done
	if p.got { // it went through as it was cancelled
		a.withheld += p.n
	}
}

func (a *admission) pendingSum() int64 {
	var n int64
	for _, p := range a.pending {
		n += p.n
	}
	return n
}

// acquireAll waits until no other work is admitted and takes the whole
// budget: the exclusive run after an out-of-memory error. It returns the
// weight taken, to be released like any other; call endExclusive after
// that, whatever acquireAll returned.
//
// The weight is size less what is withheld and pending: the budget the
// pending shrinks lead to. They stay ahead of it in the FIFO, so it goes
// through once they have and nothing else holds anything, and no resize may
// change the withheld weight from here to endExclusive: a growth would let
// other work in beside the exclusive run, and a shrink queued ahead of it
// would leave it waiting for weight that never comes back.
func (a *admission) acquireAll(ctx context.Context) (int64, error) {
	a.mu.Lock()
	a.exclusive++
	a.fold()
	n := a.size - a.withheld - a.pendingSum()
	a.mu.Unlock()
	if err := a.acquire(ctx, n); err != nil {
		return 0, err
	}
	return n, nil
}

// endExclusive ends what acquireAll began and applies the latest budget if
// it changed meanwhile.
func (a *admission) endExclusive() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.exclusive--
	if a.exclusive == 0 && !a.closed {
		a.apply()
	}
}

// close cancels pending shrinks, so that no goroutine outlives the
// subscriber, and stops further resizes.
func (a *admission) close() {
	for _, p := range a.pools {
		if p != nil {
			p.close()
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	for len(a.pending) > 0 {
		a.cancelNewest()
	}
}

// part is a run of a message's items, [lo, hi), that runs as one batch; or,
// with err set, one item too large to run at all, answered with err.
type part struct {
	lo, hi int
	err    *job.ItemError
}

// cutParts plans a message of several items whose estimate together,
// cost, exceeds the largest budget the device can give: a chunk of 100
// texts estimated at 237 MiB against a 179 MiB budget, each text fitting
// on its own, is no reason to dead-letter it. It halves the items until
// each run of them fits that budget, so the parts come out about even
// (none below half of what fits, when the items weigh alike) and the
// message weighs in admission no more than its largest part, of which it
// runs one at a time; then it joins neighbours whose estimate together is
// no more than that, so that an uneven message does not run in needless
// small parts. An item that alone exceeds the budget is the only thing
// too large, and becomes a part of its own with an item error
// (job.ItemTooLarge), as an item the model refuses does: the others run.
//
// It returns the parts in item order and the largest estimate among those
// that run; no parts when no item fits (the message is too large as a
// whole, and dead-lettered so). err is the model's, from Cost.
func (s *Subscriber) cutParts(endpoint string, items []job.Item, cost int64) (parts []part, largest int64, err error) {
	var cut func(lo, hi int, cost int64) error
	cut = func(lo, hi int, cost int64) error {
		if s.fitsPart(cost) || (hi-lo == 1 && s.adm.fits(cost)) {
			parts = append(parts, part{lo: lo, hi: hi})
			largest = max(largest, cost)
			return nil
		}
		if hi-lo == 1 {
			parts = append(parts, part{lo: lo, hi: hi, err: job.NewItemError(job.ItemTooLarge, fmt.Sprintf(
				"estimated working memory %s exceeds the largest VRAM budget the device can give, %s",
				s.amount(cost), s.amount(s.adm.size)))})
			return nil
		}
		mid := lo + (hi-lo)/2
		for _, h := range [][2]int{{lo, mid}, {mid, hi}} {
			c, err := s.modelCost(endpoint, items[h[0]:h[1]])
			if err != nil {
				return err
			}
			if err := cut(h[0], h[1], c); err != nil {
				return err
			}
		}
		return nil
	}
	if err := cut(0, len(items), cost); err != nil {
		return nil, 0, err
	}
	if !hasRunnable(parts) {
		return nil, 0, nil
	}
	joined := parts[:1]
	for _, p := range parts[1:] {
		last := &joined[len(joined)-1]
		if p.err == nil && last.err == nil {
			c, err := s.modelCost(endpoint, items[last.lo:p.hi])
			if err != nil {
				return nil, 0, err
			}
			if c <= largest {
				last.hi = p.hi
				continue
			}
		}
		joined = append(joined, p)
	}
	return joined, largest, nil
}

func hasRunnable(parts []part) bool {
	for _, p := range parts {
		if p.err == nil {
			return true
		}
	}
	return false
}

// itemPartDiv sets the largest part of a message an itemwise model runs at
// once: a part takes its whole weight from admission before it starts, in
// the admission's FIFO, so a part of half the budget holds back every
// message behind it until half the pool is free; parts of an eighth keep
// the pool filling as requests end.
const itemPartDiv = 8

// fitsPart reports whether a message, or a part of one, of this cost runs
// whole: whether it fits admission (admission.fits), and for an itemwise
// model under vram admission whether it is at most an itemPartDiv-th of
// the largest budget.
func (s *Subscriber) fitsPart(cost int64) bool {
	if _, ok := capabilities(s.cfg.Backend).(gpu.Itemwise); ok && s.adm.strategy == AdmitVRAM {
		return cost <= max(1, s.adm.size/itemPartDiv)
	}
	return s.adm.fits(cost)
}
