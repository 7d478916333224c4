package subscriber

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// A lease is the subscriber's hold on one received message, from receipt until
// SQS confirms its delete or release. The keeper extends it while it is held,
// whether the message is waiting for admission or running.
type lease struct {
	msg      queue.Message
	received time.Time
	lost     atomic.Bool // the handle no longer holds the message, or max hold passed

	// Guarded by keeper.mu.
	visibleAt time.Time // when SQS will hand the message out again unless extended
	extending bool      // a ChangeMessageVisibility call for it is in flight
	ending    bool      // an ack or release was asked for: never extend again
	// resultSent is when SQS accepted the message's result, for the delete
	// stage (stages.go); zero for a message that ends otherwise. Set before
	// its ack.
	resultSent time.Time
	release    bool // the end is a release (visibility = delay), not an ack (delete)
	delay      time.Duration
	attempts   int
}

// keeper owns every lease: one heartbeat extends all held messages that need
// it, and ends (acks, which delete, and releases) are batched in tens.
// Because a lease in flight for an extension is never sent for deletion, and
// an ending lease is never extended, no visibility change ever follows a
// delete.
type keeper struct {
	q          queue.Queue
	m          *metrics
	log        *slog.Logger
	visibility time.Duration
	maxHold    time.Duration
	flushDelay time.Duration // how long an end waits for others to share its call
	callTO     time.Duration // bound on one SQS call, retries included
	onHold     func()        // called after a lease enters the table
	onRemove   func()        // called after a lease leaves the table
	// fullCall is the most ends a call gathers before it goes at once:
	// MaxBatch, or fewer when fewer messages may be held at once.
	fullCall int

	mu         sync.Mutex
	leases     map[*lease]struct{}
	pending    []*lease
	flushArmed bool
	flushTimer *time.Timer // the armed flush, stopped when a flush comes first
	calls      sync.WaitGroup
	kick       chan struct{}
	held       atomic.Int64
	// How leases ended, for the ledger.
	deleted, released, lost, abandoned atomic.Int64
}

func newKeeper(q queue.Queue, m *metrics, log *slog.Logger, visibility, maxHold time.Duration) *keeper {
	return &keeper{
		q: q, m: m, log: log,
		visibility: visibility, maxHold: maxHold,
		flushDelay: 200 * time.Millisecond,
		callTO:     15 * time.Second,
		leases:     make(map[*lease]struct{}),
		kick:       make(chan struct{}, 1),
		onHold:     func() {},
		onRemove:   func() {},
		fullCall:   job.MaxBatch,
	}
}

// hold starts a lease on m, received by a call that started at start (the
// visibility timeout runs from about then).
func (k *keeper) hold(m queue.Message, start time.Time) *lease {
	l := &lease{msg: m, received: time.Now(), visibleAt: start.Add(k.visibility)}
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

func (k *keeper) end(l *lease, release bool, delay time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.ending {
		return
	}
	l.ending, l.release, l.delay = true, release, delay
	k.pending = append(k.pending, l)
	if len(k.pending) >= k.fullCall {
		k.poke()
	} else {
		k.armFlush(k.flushDelay)
	}
}

// armFlush schedules a flush; k.mu must be held. One timer is reused: a
// timer armed for an earlier end and left running after a flush would
// otherwise fire early for the next ones and send them in small calls.
func (k *keeper) armFlush(after time.Duration) {
	if k.flushArmed {
		return
	}
	k.flushArmed = true
	if k.flushTimer == nil {
		k.flushTimer = time.AfterFunc(after, k.poke)
	} else {
		k.flushTimer.Reset(after)
	}
}

func (k *keeper) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// run is the heartbeat and flush loop. It returns when ctx ends; close drains
// what is left.
func (k *keeper) run(ctx context.Context) {
	tick := time.NewTicker(k.visibility / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			k.heartbeat()
			k.flush()
		case <-k.kick:
			k.flush()
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
		if now.Sub(l.received) >= k.maxHold {
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
	for len(due) > 0 {
		n := min(len(due), job.MaxBatch)
		chunk := due[:n:n]
		due = due[n:]
		k.calls.Add(1)
		go func() {
			defer k.calls.Done()
			k.extend(chunk, now)
		}()
	}
}

func (k *keeper) extend(ls []*lease, start time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), k.callTO)
	defer cancel()
	errs, err := k.q.ChangeVisibility(ctx, handles(ls), k.visibility)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		// The whole call failed: the next tick tries again, and the leases
		// still have at least a third of their timeout.
		k.log.Warn("visibility extension failed", "messages", len(ls), "err", err)
	}
	for i, l := range ls {
		l.extending = false
		if l.ending {
			k.armFlush(0) // its end was waiting for this call
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
}

// flush sends every pending end whose lease has no extension in flight.
func (k *keeper) flush() {
	k.mu.Lock()
	k.flushArmed = false
	if k.flushTimer != nil {
		k.flushTimer.Stop()
	}
	var deletes, releases []*lease
	rest := k.pending[:0]
	for _, l := range k.pending {
		switch {
		case l.extending:
			rest = append(rest, l)
		case l.release:
			releases = append(releases, l)
		default:
			deletes = append(deletes, l)
		}
	}
	clear(k.pending[len(rest):])
	k.pending = rest
	k.mu.Unlock()

	send := func(ls []*lease, release bool) {
		for len(ls) > 0 {
			n := 1
			// A batch of releases shares one timeout: group equal delays.
			for n < len(ls) && n < job.MaxBatch && (!release || ls[n].delay == ls[0].delay) {
				n++
			}
			chunk := ls[:n:n]
			ls = ls[n:]
			k.calls.Add(1)
			go func() {
				defer k.calls.Done()
				k.sendEnds(chunk, release)
			}()
		}
	}
	send(deletes, false)
	send(releases, true)
}

const maxEndAttempts = 5

// sendEnds deletes or releases ls and takes them out of the table, or puts
// them back for another try with backoff.
func (k *keeper) sendEnds(ls []*lease, release bool) {
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
	var retry []*lease
	for i, l := range ls {
		e := err
		if e == nil {
			e = errs[i]
		}
		switch {
		case e == nil:
			if release {
				k.m.released.WithLabelValues(releaseReason(l.delay)).Inc()
				k.released.Add(1)
			} else {
				k.m.deleted.Inc()
				k.deleted.Add(1)
				k.m.observeStage(stageDelete, l.resultSent, time.Now())
			}
			k.remove(l)
		case errors.Is(e, queue.ErrLeaseLost):
			// The message expired and may be with another consumer: a
			// delete that comes too late means a duplicate result, which
			// consumers collapse by (job_id, chunk).
			k.m.leasesLost.WithLabelValues(action).Inc()
			k.log.Warn("lease lost before "+action, "message_id", l.msg.ID, "err", e)
			k.lost.Add(1)
			k.remove(l)
		default:
			l.attempts++
			if l.attempts >= maxEndAttempts {
				k.log.Error(action+" failed; the message comes back when its visibility expires",
					"message_id", l.msg.ID, "attempts", l.attempts, "err", e)
				k.abandoned.Add(1)
				k.remove(l)
				continue
			}
			k.log.Warn(action+" failed; retrying", "message_id", l.msg.ID, "attempt", l.attempts, "err", e)
			retry = append(retry, l)
		}
	}
	if len(retry) > 0 {
		k.mu.Lock()
		k.pending = append(k.pending, retry...)
		backoff := min(k.flushDelay<<retry[0].attempts*10, 5*time.Second)
		k.mu.Unlock()
		time.AfterFunc(backoff, k.poke)
	}
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
// ends its lease), then flushes until every end is sent or ctx ends.
func (k *keeper) close(ctx context.Context) error {
	k.mu.Lock()
	var orphans []*lease
	for l := range k.leases {
		if !l.ending {
			orphans = append(orphans, l)
		}
	}
	k.mu.Unlock()
	for _, l := range orphans {
		k.log.Warn("releasing a message still held at shutdown", "message_id", l.msg.ID)
		k.release(l, 0)
	}
	for {
		k.flush()
		k.calls.Wait()
		k.mu.Lock()
		left := len(k.pending)
		k.mu.Unlock()
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(),
				errors.New("messages still pending delete or release at exit; they come back after their visibility timeout"))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func handles(ls []*lease) []string {
	hs := make([]string, len(ls))
	for i, l := range ls {
		hs[i] = l.msg.Handle
	}
	return hs
}
