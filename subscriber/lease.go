package subscriber

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vramq/vramq/internal/backoff"
	// Named apart from this package's own batcher, which forms device batches.
	callbatch "github.com/vramq/vramq/internal/batcher"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// The leases the receive stage holds on what it received (the keeper: visibility extended while a message is
// held, deletes, releases and hand-backs batched in tens).

// A lease is the subscriber's hold on one received message, from receipt until
// SQS confirms its delete or release. The keeper extends it while it is held,
// whether the message is waiting for admission or running.
type lease struct {
	msg      queue.Message
	received time.Time
	lost     atomic.Bool // the handle no longer holds the message, or max hold passed
	// answersKept: answers of its items are in the answer store
	// (answers.go), to delete once its result is out.
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
