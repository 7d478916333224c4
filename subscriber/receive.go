package subscriber

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/backoff"

	// Named apart from this package's own batcher, which forms device batches.
	callbatch "github.com/vramq/vramq/internal/batcher"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queue"
)

// The receive stage: long polls (the poller), the leases it holds on what it received (the keeper: visibility
// extended while a message is held, deletes and hand-backs batched), the check of what a message asks for
// (modelguard) and the counted SQS and S3 clients every stage calls through.

// fillWait is the longest the poller waits for room for a full receive
// while messages are still waiting to start.
const fillWait = 500 * time.Millisecond

// receiveRetry is the wait after failed receives in a row: 1 s, doubled up
// to 20 s, without jitter (one poller per process, and the SDK has jittered
// its own retries already).
var receiveRetry = backoff.Policy{First: time.Second, Max: 20 * time.Second}

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
	// What a receive brings is decoded and sent on by accept, in order, in
	// a goroutine of its own, so that the next receive goes out meanwhile
	// rather than after the decoding. The poller takes the leases and counts
	// the messages as waiting first, so that room() is right for the next
	// receive. No more than Prefetch messages wait, so no more than Prefetch
	// receives are queued here, and sending never blocks. Fetches start in
	// accept: the acceptor is done before they are waited for.
	received := make(chan []*lease, s.cfg.Prefetch)
	var acceptor sync.WaitGroup
	acceptor.Go(func() {
		for ls := range received {
			for _, l := range ls {
				s.accept(ctx, l)
			}
		}
	})
	defer acceptor.Wait()
	defer close(received)
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
		// A backoff or a needed operator (run.go) holds receives back:
		// what they would bring could not run; a probe of an open circuit
		// may take one message.
		allowed, ok := s.waitToReceive(ctx)
		if !ok {
			return
		}
		if allowed > 0 {
			n = min(n, allowed)
		}
		start := time.Now()
		rctx, stopRecv := s.receiveContext(recvCtx)
		msgs, err := s.queue.Receive(rctx, n, s.cfg.WaitTime, s.cfg.Visibility)
		cut := rctx.Err() != nil && recvCtx.Err() == nil
		stopRecv()
		if allowed > 0 && len(msgs) == 0 {
			s.pause.gotNothing()
		}
		if err != nil {
			if recvCtx.Err() != nil {
				return
			}
			if cut {
				continue // the circuit opened: an operator stop does not wait out a long poll
			}
			failures++
			s.pollErrSince.CompareAndSwap(0, start.UnixNano())
			// The SDK has already retried; this only keeps a dead endpoint
			// from being hammered.
			wait := receiveRetry.Delay(failures)
			s.log.Error("receive failed", "err", err, "consecutive", failures, "retry_in", wait)
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
			continue
		}
		failures = 0
		s.pollErrSince.Store(0)
		if len(msgs) == 0 {
			continue
		}
		ls := make([]*lease, len(msgs))
		for i, m := range msgs {
			ls[i] = s.keeper.hold(m, start)
			s.m.received.Inc()
			if m.ReceiveCount > 1 {
				s.m.redelivered.Inc()
			}
			s.received.Add(1)
			s.addWaiting()
		}
		received <- ls
	}
}

// accept sends on a received message, leased and counted as waiting: to the
// buffer, to the DLQ when it can never run, or straight back when shutting
// down. A message with claim-checked items is fetched off the accept loop,
// so a slow bucket does not hold up the messages behind it.
func (s *Subscriber) accept(ctx context.Context, l *lease) {
	t := &task{lease: l, ends: s.ends}
	if ctx.Err() != nil {
		s.startTasks(1)
		s.end(t, endHandBack(0, "shutdown"))
		return
	}
	w, err := job.DecodeWork([]byte(l.msg.Body))
	if err != nil {
		s.startTasks(1)
		s.endAsync(t, endDeadLetter("malformed", err.Error()))
		return
	}
	t.work = w
	// A chunk of a cancelled job ends here, before any fetch or admission.
	// The answer is usually cached; when it is not, the read runs off the
	// accept loop, as a claim-check fetch does.
	if s.cancels != nil {
		yes, known := s.cancels.cached(w.JobID)
		switch {
		case yes:
			s.startTasks(1)
			s.endAsync(t, endCancel())
			return
		case !known:
			s.fetches.Go(func() {
				if s.cancels.cancelled(ctx, w.JobID) {
					s.startTasks(1)
					s.end(t, endCancel())
					return
				}
				s.sendOn(ctx, t)
			})
			return
		}
	}
	s.sendOn(ctx, t)
}

// sendOn sends a decoded message on: to admission, through a read of the
// answers kept for it when it was received before (run.go) and a
// claim-check fetch when it has claim-checked items.
func (s *Subscriber) sendOn(ctx context.Context, t *task) {
	if s.answers.mayHold(t) {
		s.fetches.Go(func() {
			if s.answers.recall(ctx, t) != nil {
				s.startTasks(1)
				s.end(t, endHandBack(0, "shutdown"))
				return
			}
			if len(t.work.Items) == 0 {
				// Every item was answered: the result goes out as a
				// batch's would.
				s.startTasks(1)
				s.outbox.promise(1)
				s.complete([]*task{t}, [][]job.Output{nil})
				return
			}
			s.fetchOrEnqueue(ctx, t)
		})
		return
	}
	s.fetchOrEnqueue(ctx, t)
}

// fetchOrEnqueue sends t on to admission, through a claim-check fetch when
// it has claim-checked items.
func (s *Subscriber) fetchOrEnqueue(ctx context.Context, t *task) {
	w := t.work
	if !hasRefs(w) {
		s.enqueue(t)
		return
	}
	if s.payloads == nil {
		s.startTasks(1)
		s.endAsync(t, endDeadLetter("claim_check", unconfigured(w)))
		return
	}
	s.fetches.Go(func() { s.claim(ctx, t) })
}

// enqueue sends a decoded message, already counted as waiting, on to
// admission, or to the DLQ when none of its items can ever fit; a message of
// several items that does not fit whole goes on to run in parts
// (parts.go). Its cost is estimated from its content, so claim-checked
// items must have been fetched.
//
// Never fitting is exceeding the largest budget the device could give, not
// the budget now: that may be smaller because another process holds memory
// for a while, and dead-lettering would lose work that fits once it lets
// go. Such a message waits in admission, and the admit timeout hands it
// back for later or for another consumer.
func (s *Subscriber) enqueue(t *task) {
	w := t.work
	cost, err := s.modelCost(w.Endpoint, w.Items)
	var class int
	if err == nil {
		class, err = s.modelClass(w.Endpoint, w.Items)
	}
	if err != nil {
		s.startTasks(1)
		s.endAsync(t, endDeadLetter("invalid_input", err.Error()))
		return
	}
	if !s.adm.fits(cost) || (len(w.Items) > 1 && !s.fitsPart(cost)) {
		// In parts that fit, if any item does (parts.go).
		var parts []part
		var largest int64
		if len(w.Items) > 1 {
			parts, largest, err = s.cutParts(w.Endpoint, w.Items, cost)
		}
		if err != nil {
			s.startTasks(1)
			s.endAsync(t, endDeadLetter("invalid_input", err.Error()))
			return
		}
		if parts == nil {
			none := ""
			if len(w.Items) > 1 {
				none = ", none fits alone"
			}
			s.startTasks(1)
			s.endAsync(t, endDeadLetter("too_large", fmt.Sprintf(
				"estimated working memory %s exceeds the largest VRAM budget the device can give, %s (%d items%s)",
				s.amount(cost), s.amount(s.adm.size), len(w.Items), none)))
			return
		}
		t.parts, cost = parts, largest
	}
	// Never blocks: room() kept waiting, which counts this message, within
	// the buffer's capacity.
	t.cost, t.raw, t.class = cost, cost, class
	t.needs = s.modelNeeds(w.Endpoint, w.Items)
	s.buffer <- t
}

func unconfigured(w *job.Work) string {
	for _, it := range w.Items {
		if it.Ref != nil {
			return fmt.Sprintf("item %s is claim-checked but no payload bucket is configured", job.QuoteID(it.ID))
		}
	}
	return "no payload bucket is configured"
}

// A lease is the subscriber's hold on one received message, from receipt until
// SQS confirms its delete or release. The keeper extends it while it is held,
// whether the message is waiting for admission or running.
type lease struct {
	msg      queue.Message
	received time.Time
	lost     atomic.Bool // the handle no longer holds the message, or max hold passed
	// answersKept: answers of its items are in the answer store
	// (run.go), to delete once its result is out.
	answersKept atomic.Bool

	// Guarded by keeper.mu.
	visibleAt time.Time // when SQS will hand the message out again unless extended
	extending bool      // a ChangeMessageVisibility call for it is in flight
	ending    bool      // an ack or release was asked for: never extend again
	// waiting: the message waits for its model server (a backoff, a needed
	// operator), which is not its own doing, so max hold does not count
	// while it waits; holdFrom is where max hold counts from: its receive,
	// or the end of its last wait.
	waiting  bool
	holdFrom time.Time
	sent     bool // a hand-back's copy is on the queue: only the delete is left

	// Set once, before the lease is handed to keeper.ends.
	// resultSent is when SQS accepted the message's result, for the delete
	// stage (message.go); zero for a message that ends otherwise.
	resultSent time.Time
	release    bool // the end is a release (visibility = delay), not an ack (delete)
	handBack   bool // the end is a copy sent back (with delay), then a delete
	delay      time.Duration
}

// keeper owns every lease: one heartbeat extends all held messages that need
// it, and ends (acks, which delete, and releases) are batched in tens.
// Because a lease in flight for an extension is handed to the batcher only
// once that call has answered, and an ending lease is never extended, no
// visibility change ever follows a delete.
type keeper struct {
	q          queue.Queue
	m          *metrics
	log        *slog.Logger
	visibility time.Duration
	maxHold    time.Duration
	callTO     time.Duration // bound on one SQS call, retries included
	onHold     func()        // called after a lease enters the table
	onRemove   func()        // called after a lease leaves the table
	// ends gathers acks and releases into calls (sendEnds).
	ends *callbatch.Batcher[*lease]
	// giveUp is closed when close gives up on the ends still failing:
	// their retries stop.
	giveUp     chan struct{}
	extensions sync.WaitGroup // extend calls in flight

	mu     sync.Mutex
	leases map[*lease]struct{}
	held   atomic.Int64
	// How leases ended, for the ledger.
	deleted, released, lost, abandoned atomic.Int64
}

// endDelay is the longest an end waits for others to share its call.
const endDelay = 200 * time.Millisecond

// newKeeper returns a keeper whose calls to end messages hold up to fullCall
// entries: job.MaxBatch, or fewer when fewer messages may be held at once, since
// an end that waited for company that cannot come would hold up the next
// receive for nothing.
func newKeeper(q queue.Queue, m *metrics, log *slog.Logger, visibility, maxHold time.Duration, fullCall int) *keeper {
	k := &keeper{
		q: q, m: m, log: log,
		visibility: visibility, maxHold: maxHold,
		callTO:   15 * time.Second,
		leases:   make(map[*lease]struct{}),
		giveUp:   make(chan struct{}),
		onHold:   func() {},
		onRemove: func() {},
	}
	k.ends = k.newEnds(fullCall, endDelay)
	return k
}

// newEnds is the batcher of k's ends: a call goes when it holds fullCall
// ends, or delay after its first.
func (k *keeper) newEnds(fullCall int, delay time.Duration) *callbatch.Batcher[*lease] {
	return callbatch.New(callbatch.Options{MaxItems: fullCall, MaxDelay: delay}, k.sendEnds)
}

// hold starts a lease on m, received by a call that started at start (the
// visibility timeout runs from about then).
func (k *keeper) hold(m queue.Message, start time.Time) *lease {
	now := time.Now()
	l := &lease{msg: m, received: now, holdFrom: now, visibleAt: start.Add(k.visibility)}
	k.mu.Lock()
	k.leases[l] = struct{}{}
	k.mu.Unlock()
	k.held.Add(1)
	k.m.held.Inc()
	k.onHold()
	return l
}

// ack asks for l's message to be deleted. It returns at once; the call is
// batched. Only the first ack or release of a lease counts.
func (k *keeper) ack(l *lease) { k.end(l, false, 0) }

// release asks for l's message to be made visible again after delay. It
// returns at once; the call is batched. Only the first ack or release of a
// lease counts.
func (k *keeper) release(l *lease, delay time.Duration) { k.end(l, true, delay) }

// handBack gives l's message back to the queue at no cost to its receive
// count: a copy goes to the queue, visible after delay (at most
// job.MaxDelay), and then l's message is deleted. SQS counts every
// receive of a message towards its redrive, and a release is received
// again, so a message that waits for something that is not its fault (a
// rate limit, a restart, admission) is handed back this way. It returns at
// once; the calls are batched. Only the first end of a lease counts.
func (k *keeper) handBack(l *lease, delay time.Duration) {
	k.mu.Lock()
	if !l.ending {
		l.handBack = true
	}
	k.mu.Unlock()
	k.end(l, false, min(max(delay, 0), job.MaxDelay))
}

// setWaiting marks ls as waiting for the model (true) or no longer
// (false): max hold does not count while a lease waits, and counts afresh
// from the end of its wait.
func (k *keeper) setWaiting(ls []*lease, waiting bool) {
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range ls {
		if l.waiting && !waiting {
			l.holdFrom = now
		}
		l.waiting = waiting
	}
}

func (k *keeper) end(l *lease, release bool, delay time.Duration) {
	k.mu.Lock()
	if l.ending {
		k.mu.Unlock()
		return
	}
	l.ending, l.release, l.delay = true, release, delay
	// An extension on the wire hands the lease over when it answers.
	waits := l.extending
	k.mu.Unlock()
	if !waits {
		k.ends.Add(l, 0)
	}
}

// run is the heartbeat loop. It returns when ctx ends; close drains what is
// left. Each heartbeat also sends the ends waiting for company: an ending
// lease is no longer extended, so its end must not wait longer than the
// visibility a heartbeat leaves it.
func (k *keeper) run(ctx context.Context) {
	tick := time.NewTicker(k.visibility / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			k.heartbeat()
			k.ends.Flush()
		}
	}
}

// heartbeat extends every held lease that would have less than a tick of
// visibility left at the next tick, so each is extended with at least a third
// of its visibility timeout to spare. Leases held past maxHold are let go.
func (k *keeper) heartbeat() {
	now := time.Now()
	period := k.visibility / 3
	var due []*lease
	k.mu.Lock()
	for l := range k.leases {
		if l.ending || l.extending || l.lost.Load() {
			continue
		}
		if !l.waiting && now.Sub(l.holdFrom) >= k.maxHold {
			l.lost.Store(true)
			k.m.leasesLost.WithLabelValues("max_hold").Inc()
			k.log.Warn("lease held past max hold; no longer extended", "message_id", l.msg.ID,
				"held", now.Sub(l.received).Round(time.Millisecond), "max_hold", k.maxHold)
			continue
		}
		if l.visibleAt.Sub(now) < 2*period {
			l.extending = true
			due = append(due, l)
		}
	}
	k.mu.Unlock()
	for chunk := range slices.Chunk(due, job.MaxBatch) {
		k.extensions.Go(func() { k.extend(chunk, now) })
	}
}

func (k *keeper) extend(ls []*lease, start time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), k.callTO)
	defer cancel()
	errs, err := k.q.ChangeVisibility(ctx, handles(ls), k.visibility)
	if err != nil {
		// The whole call failed: the next tick tries again, and the leases
		// still have at least a third of their timeout.
		k.log.Warn("visibility extension failed", "messages", len(ls), "err", err)
	}
	var ended []*lease
	k.mu.Lock()
	for i, l := range ls {
		l.extending = false
		if l.ending {
			ended = append(ended, l)
		}
		switch {
		case err != nil:
		case errs[i] == nil:
			l.visibleAt = start.Add(k.visibility)
			k.m.extensions.Inc()
		case errors.Is(errs[i], queue.ErrLeaseLost):
			l.lost.Store(true)
			k.m.leasesLost.WithLabelValues("extend").Inc()
			k.log.Warn("lease lost on extension", "message_id", l.msg.ID, "err", errs[i])
		default:
			k.log.Warn("visibility extension of one message failed", "message_id", l.msg.ID, "err", errs[i])
		}
	}
	k.mu.Unlock()
	if len(ended) > 0 {
		for _, l := range ended {
			k.ends.Add(l, 0)
		}
		// Their ends have waited for this call already.
		k.ends.Flush()
	}
}

// sendEnds is the handler of k.ends: it deletes the acked leases in one
// call and releases the others in one call per delay, since a call sets
// one visibility timeout for all its entries.
func (k *keeper) sendEnds(ls []*lease) {
	slices.SortStableFunc(ls, func(a, b *lease) int { return cmp.Compare(endKind(a), endKind(b)) })
	n := sameKind(ls)
	if n == len(ls) { // the usual batch: deletes alone
		k.sendEnd(ls)
		return
	}
	var wg sync.WaitGroup
	for ; len(ls) > 0; ls = ls[n:] {
		n = sameKind(ls)
		call := ls[:n:n]
		wg.Go(func() { k.sendEnd(call) })
	}
	wg.Wait()
}

// endKind tells the calls of sendEnds apart: -1 for a delete, -2 for a
// hand-back (its copies' delays are per entry), the delay of a release.
func endKind(l *lease) time.Duration {
	switch {
	case l.handBack:
		return -2
	case !l.release:
		return -1
	}
	return l.delay
}

// sameKind is how many of ls, from the first, share its kind of end.
func sameKind(ls []*lease) int {
	n := 1
	for n < len(ls) && endKind(ls[n]) == endKind(ls[0]) {
		n++
	}
	return n
}

// maxEndAttempts is the most calls that try to delete or release a
// message, the first included. A batch call may fail some entries (SQS's
// Failed list, which the SDK's retryer does not retry), and an end given up
// on is processed again after its visibility: 8 attempts span 13.5 to 27 s
// of waits, within the 30 s a shutdown gives its ends. Where a call fails
// an entry 30% of the time (TestE2EFaultKinds/partial_batch), an end alone in
// its call is given up on with odds of 0.3^5, 1 in 412, after 5 attempts,
// which failed that test in some runs; after 8, 0.3^8, 1 in 15,242.
const maxEndAttempts = 8

// endRetry is the backoff of a failed delete or release, by retry (below
// maxEndAttempts), with "equal jitter" so that the ends of one failed call,
// or of an SQS outage, do not all come back at once. Retries 1 to 7 wait
// 0.5–1 s, 1–2 s, 2–4 s, then 2.5–5 s.
var endRetry = backoff.Policy{First: time.Second, Max: 5 * time.Second, Jitter: backoff.Equal}

// sendEnd deletes or releases ls, all of one kind (and one delay), in one
// call, and takes each out of the table once it is done with, retrying
// those whose entry failed with backoff, up to maxEndAttempts calls, or
// until close gives up on them.
func (k *keeper) sendEnd(ls []*lease) {
	for attempt := 1; ; attempt++ {
		ls = k.tryEnd(ls, attempt)
		if len(ls) == 0 {
			return
		}
		select {
		case <-time.After(endRetry.Delay(attempt)):
		case <-k.giveUp:
			return
		}
	}
}

// tryEnd makes one call to delete or release ls and returns those to try
// again.
func (k *keeper) tryEnd(ls []*lease, attempt int) (retry []*lease) {
	if ls[0].handBack {
		var send []*lease
		ls, send = k.sendCopies(ls, attempt)
		retry = send
		if len(ls) == 0 {
			return retry
		}
	}
	release := ls[0].release
	ctx, cancel := context.WithTimeout(context.Background(), k.callTO)
	defer cancel()
	var errs []error
	var err error
	if release {
		errs, err = k.q.ChangeVisibility(ctx, handles(ls), ls[0].delay)
	} else {
		errs, err = k.q.Delete(ctx, handles(ls))
	}
	action := "delete"
	if release {
		action = "release"
	}
	for i, l := range ls {
		e := err
		if e == nil {
			e = errs[i]
		}
		switch {
		case e == nil:
			switch {
			case l.handBack:
				k.m.released.WithLabelValues("handed_back").Inc()
				k.released.Add(1)
			case release:
				k.m.released.WithLabelValues(releaseReason(l.delay)).Inc()
				k.released.Add(1)
			default:
				k.m.deleted.Inc()
				k.deleted.Add(1)
				k.m.observeStage(stageDelete, l.resultSent, time.Now())
			}
			k.remove(l)
		case errors.Is(e, queue.ErrLeaseLost) && l.handBack:
			// Its copy is on the queue and the original came back too: the
			// two run, and consumers collapse their results by (job_id,
			// chunk). Counted as handed back: the work is on the queue.
			k.m.leasesLost.WithLabelValues(action).Inc()
			k.log.Warn("lease lost before the delete of a message handed back: it is on the queue twice",
				"message_id", l.msg.ID, "err", e)
			k.released.Add(1)
			k.remove(l)
		case errors.Is(e, queue.ErrLeaseLost):
			// The message expired and may be with another consumer: a
			// delete that comes too late means a duplicate result, which
			// consumers collapse by (job_id, chunk).
			k.m.leasesLost.WithLabelValues(action).Inc()
			k.log.Warn("lease lost before "+action, "message_id", l.msg.ID, "err", e)
			k.lost.Add(1)
			k.remove(l)
		case attempt >= maxEndAttempts:
			k.log.Error(action+" failed; the message comes back when its visibility expires",
				"message_id", l.msg.ID, "attempts", attempt, "err", e)
			k.abandoned.Add(1)
			k.remove(l)
		default:
			k.log.Warn(action+" failed; retrying", "message_id", l.msg.ID, "attempt", attempt, "err", e)
			retry = append(retry, l)
		}
	}
	return retry
}

func releaseReason(delay time.Duration) string {
	if delay == 0 {
		return "now"
	}
	return "backoff"
}

func (k *keeper) remove(l *lease) {
	k.mu.Lock()
	_, ok := k.leases[l]
	delete(k.leases, l)
	k.mu.Unlock()
	if ok {
		k.held.Add(-1)
		k.m.held.Dec()
		k.onRemove()
	}
}

// close releases any lease still held (there should be none: every path
// ends its lease), then sends every end at once and waits until each is
// done with or ctx ends. Call it after run has returned.
func (k *keeper) close(ctx context.Context) error {
	// An end waiting for an extension joins the batcher when it answers.
	k.extensions.Wait()
	k.mu.Lock()
	var orphans []*lease
	for l := range k.leases {
		if !l.ending {
			orphans = append(orphans, l)
		}
	}
	k.mu.Unlock()
	for _, l := range orphans {
		k.log.Warn("handing back a message still held at shutdown", "message_id", l.msg.ID)
		k.handBack(l, 0)
	}
	if err := k.ends.Shutdown(ctx); err != nil {
		close(k.giveUp)
		return errors.Join(err,
			errors.New("messages still pending delete or release at exit; they come back after their visibility timeout"))
	}
	return nil
}

func handles(ls []*lease) []string {
	hs := make([]string, len(ls))
	for i, l := range ls {
		hs[i] = l.msg.Handle
	}
	return hs
}

// AttrHandedBack, on a message the subscriber handed back as a fresh copy
// (keeper.handBack), counts the hand-backs of the original: the copy's
// receive count starts again, so this is where the waits it went through
// show.
const AttrHandedBack = "vramq-handed-back"

// maxAttributes is SQS's limit on a message's attributes.
const maxAttributes = 10

// handBackCopy is the copy of l's message that a hand-back sends: the same
// body, attributes and group, with AttrHandedBack counted up (when SQS's
// ten attributes leave room for it), visible after l's delay.
func handBackCopy(l *lease) queue.Outgoing {
	n, _ := strconv.Atoi(l.msg.Attributes[AttrHandedBack])
	n++
	attrs := maps.Clone(l.msg.Attributes)
	if attrs == nil {
		attrs = map[string]string{}
	}
	if _, ok := attrs[AttrHandedBack]; ok || len(attrs) < maxAttributes {
		attrs[AttrHandedBack] = strconv.Itoa(n)
	}
	return queue.Outgoing{Body: l.msg.Body, Attributes: attrs, GroupID: l.msg.GroupID, Delay: l.delay,
		DedupID: l.msg.ID + "-h" + strconv.Itoa(n)}
}

// sendCopies sends the copies of the hand-backs in ls not sent yet, and
// returns those whose copy is out (to be deleted) and those to try again.
// A copy the queue refuses for good, or that keeps failing, falls back to
// a release with the same delay: it costs a receive, but the message stays
// on the queue.
func (k *keeper) sendCopies(ls []*lease, attempt int) (sent, retry []*lease) {
	var todo []*lease
	for _, l := range ls {
		if l.sent {
			sent = append(sent, l)
		} else {
			todo = append(todo, l)
		}
	}
	if len(todo) == 0 {
		return sent, nil
	}
	msgs := make([]queue.Outgoing, len(todo))
	for i, l := range todo {
		msgs[i] = handBackCopy(l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.callTO)
	errs, err := k.q.Send(ctx, msgs)
	cancel()
	var fallback []*lease
	for i, l := range todo {
		e := err
		if e == nil {
			e = errs[i]
		}
		switch {
		case e == nil:
			l.sent = true
			sent = append(sent, l)
		case errors.Is(e, queue.ErrRefused) || attempt >= maxEndAttempts:
			k.log.Warn("handing a message back as a copy failed; releasing it instead (this receive counts)",
				"message_id", l.msg.ID, "attempts", attempt, "err", e)
			l.handBack, l.release = false, true
			fallback = append(fallback, l)
		default:
			k.log.Warn("handing a message back as a copy failed; retrying", "message_id", l.msg.ID, "attempt", attempt, "err", e)
			retry = append(retry, l)
		}
	}
	if len(fallback) > 0 {
		k.sendEnds(fallback)
	}
	return sent, retry
}

// The model is the one part of the subscriber that reads what a message's
// sender chose, item by item, in code vramq does not control (tokenizers,
// image decoders, a CUDA backend). A panic there would end the process with
// up to -max-inflight messages held, every one of them redelivered to the
// next subscriber to panic again. So every call into the model (Cost, LengthClass,
// Run, Launch and the launched Run) recovers a panic into an error wrapping
// fault.ErrInvalidInput, which process and runAlone already answer: a batch is
// split in halves until the item that panics is alone, and that message is
// dead-lettered as invalid_input; the rest run. A panic in a goroutine the
// model starts itself cannot be recovered here.

// recovered turns a recovered panic value into the invalid-input error of
// the call, and logs its stack, which is for operators, not for the reason.
func (s *Subscriber) recovered(what string, p any, err *error) {
	s.log.Error("the model panicked; its batch is treated as invalid input",
		"call", what, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	*err = fmt.Errorf("%w: model %s panicked in %s: %v", fault.ErrInvalidInput, s.cfg.Backend.Name(), what, p)
}

// modelCost is the backend's estimate for items of a job that names
// endpoint ("" for none).
func (s *Subscriber) modelCost(endpoint string, items []job.Item) (cost int64, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.recovered("Cost", p, &err)
		}
	}()
	return s.cfg.Backend.Cost(endpoint, items), nil
}

// modelNeeds is what items take of the resources the model offers
// (backend.Offerer); none when it offers none.
func (s *Subscriber) modelNeeds(endpoint string, items []job.Item) (n backend.Vector) {
	if s.adm.offerer == nil {
		return n
	}
	defer func() {
		if recover() != nil {
			n = s.adm.most // a model that panics here is refused when it runs
		}
	}()
	return s.adm.offerer.Needs(endpoint, items)
}

// modelClass is the batcher's class for items of a job that names endpoint
// ("" for none): the model's length class, or for an endpoint job a class
// of that endpoint's own (negative, below every length class), so that a
// batch never mixes endpoints, nor endpoint requests with text items.
func (s *Subscriber) modelClass(endpoint string, items []job.Item) (class int, err error) {
	if endpoint != "" {
		return -1 - slices.Index(job.Endpoints, endpoint), nil
	}
	if s.classer == nil {
		return 0, nil
	}
	defer func() {
		if p := recover(); p != nil {
			s.recovered("LengthClass", p, &err)
		}
	}()
	return s.classer.LengthClass(items), nil
}

// modelRun runs items of a job that names endpoint ("" for none) as one
// batch on the backend.
func (s *Subscriber) modelRun(ctx context.Context, endpoint string, items []job.Item) (outs []job.Output, err error) {
	defer func() {
		if p := recover(); p != nil {
			outs = nil
			s.recovered("Run", p, &err)
		}
	}()
	return s.cfg.Backend.Run(ctx, endpoint, items)
}

// capabilities is what the backend's optional capabilities are asked of:
// an in-process backend's model (gpu.Launcher, gpu.LengthClasser,
// gpu.WorkingSet), or the backend itself.
func capabilities(b backend.Backend) any {
	if ip, ok := b.(backend.InProcess); ok {
		return ip.Model
	}
	return b
}

// weights is the device memory the backend's model holds: 0 but for a
// model in this process, whose weights are on the device.
func weights(b backend.Backend) int64 {
	if ip, ok := b.(backend.InProcess); ok {
		return ip.Model.Weights()
	}
	return 0
}

func (s *Subscriber) modelLaunch(ctx context.Context, items []job.Item) (l gpu.Launched, err error) {
	defer func() {
		if p := recover(); p != nil {
			l = nil
			s.recovered("Launch", p, &err)
		}
	}()
	return s.launcher.Launch(ctx, items)
}

func (s *Subscriber) launchedRun(ctx context.Context, l gpu.Launched) (outs []job.Output, err error) {
	defer func() {
		if p := recover(); p != nil {
			outs = nil
			s.recovered("Launched.Run", p, &err)
		}
	}()
	return l.Run(ctx)
}

// The subscriber reaches its queues and its bucket through these decorators,
// which count every call by outcome (vramq_subscriber_sqs_requests_total,
// vramq_subscriber_payload_requests_total) whatever implements them, so that
// the request counts hold for the in-memory fakes too.

// countedQueue counts every call by action and outcome, for any Queue.
type countedQueue struct {
	q queue.Queue
	m *metrics
}

func (c countedQueue) count(action string, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	c.m.requests.WithLabelValues(action, outcome).Inc()
}

func (c countedQueue) Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]queue.Message, error) {
	msgs, err := c.q.Receive(ctx, max, wait, visibility)
	c.count("ReceiveMessage", err)
	return msgs, err
}

func (c countedQueue) Delete(ctx context.Context, handles []string) ([]error, error) {
	errs, err := c.q.Delete(ctx, handles)
	c.count("DeleteMessageBatch", err)
	return errs, err
}

func (c countedQueue) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
	errs, err := c.q.ChangeVisibility(ctx, handles, timeout)
	c.count("ChangeMessageVisibilityBatch", err)
	return errs, err
}

func (c countedQueue) Send(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
	return countedSender{c.q, c.m}.Send(ctx, msgs)
}

type countedSender struct {
	s queue.Sender
	m *metrics
}

func (c countedSender) Send(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
	errs, err := c.s.Send(ctx, msgs)
	countedQueue{m: c.m}.count("SendMessageBatch", err)
	return errs, err
}

// countedPayloads counts every payload bucket operation by outcome.
type countedPayloads struct {
	p Payloads
	m *metrics
}

func (c countedPayloads) count(op string, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	c.m.payloadRequests.WithLabelValues(op, outcome).Inc()
}

func (c countedPayloads) Bucket() string { return c.p.Bucket() }

func (c countedPayloads) Get(ctx context.Context, ref job.PayloadRef) ([]byte, error) {
	b, err := c.p.Get(ctx, ref)
	c.count("get", err)
	return b, err
}

func (c countedPayloads) Put(ctx context.Context, key string, body []byte) (job.PayloadRef, error) {
	ref, err := c.p.Put(ctx, key, body)
	c.count("put", err)
	return ref, err
}

func (c countedPayloads) Read(ctx context.Context, key string) ([]byte, error) {
	b, err := c.p.Read(ctx, key)
	if errors.Is(err, payload.ErrMissing) {
		c.count("read", nil) // an answer: the object is not there
	} else {
		c.count("read", err)
	}
	return b, err
}

func (c countedPayloads) PutIfAbsent(ctx context.Context, key string, body []byte) (bool, []byte, error) {
	created, existing, err := c.p.PutIfAbsent(ctx, key, body)
	c.count("put_if_absent", err)
	return created, existing, err
}

func (c countedPayloads) Create(ctx context.Context, key string, body []byte) (bool, []byte, error) {
	created, existing, err := c.p.Create(ctx, key, body)
	c.count("create", err)
	return created, existing, err
}
