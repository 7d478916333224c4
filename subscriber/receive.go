package subscriber

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queue"
)

// The receive stage: long polls (the poller), what a received message needs before admission (its job's
// cancel checked, its claim-checked items fetched, its cost estimated), the calls into the model, each behind
// a recover, and the counted SQS and S3 clients every stage calls through. The leases it holds on what it
// received are lease.go's.

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
		// A backoff or a needed operator (pause.go) holds receives back:
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
	if l.msg.ReceiveCount > 1 && s.ends.ended.has(l.msg.ID) {
		// Its result or DLQ copy went out from an earlier receive whose
		// delete was lost: only the delete is left. Run again, it could
		// answer a chunk already dead-lettered.
		s.startTasks(1)
		s.end(t, endAck())
		return
	}
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
// answers kept for it when it was received before (answers.go) and a
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
// (admit.go). Its cost is estimated from its content, so claim-checked
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
		// In parts that fit, if any item does (admit.go).
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

func (r *receiving) pokeRoom() {
	select {
	case r.roomKick <- struct{}{}:
	default:
	}
}

// room is how many messages the next receive may ask for: no more than the
// prefetch buffer (as deep as the starts keep it: prefetchNow) and the
// in-flight bound have room for.
func (r *receiving) room() int {
	n := min(job.MaxBatch, r.prefetchNow()-int(r.waiting.Load()), r.maxInflight-int(r.keeper.held.Load()))
	return max(n, 0)
}

// prefetchNow is how many messages may wait received and not started:
// Prefetch, or as many as start in half of AdmitTimeout at the rate they
// have started while some waited (Little's law), at least one. A message
// received is invisible to every other consumer until it starts or its
// AdmitTimeout hands it back: Prefetch of them held where each runs for
// minutes (a model server's share of a rate limit) sat out a whole
// AdmitTimeout, were handed back and received again, while another
// subscriber with the same queue found it empty. In a real-time run of
// three subscribers sharing one sliding window (bench/modelserver.md),
// two held 20 and 10 of the 39 messages in their buffers, handing back
// 20 and 10 a minute, and the third, out of work, sat idle for 50–56 s at
// a time; its part of the limit went to the others.
func (r *receiving) prefetchNow() int {
	r.flow.mu.Lock()
	n := r.flow.depth(time.Now(), r.waiting.Load() > 0, r.prefetch, r.flow.tau/2)
	r.flow.mu.Unlock()
	r.prefetchGauge.Set(float64(n))
	return n
}

// fullReceive is the most one receive can ask for under the bounds as
// they are now: with fewer let wait (prefetchNow), a top-up waits for no
// more room than that.
func (r *receiving) fullReceive() int {
	return min(job.MaxBatch, r.prefetchNow(), r.maxInflight)
}

// addWaiting counts a message as waiting: received and not started.
func (r *receiving) addWaiting() { r.changeWaiting(1, false) }

// startTasks marks tasks as no longer waiting: ended without running;
// startedTasks, started.
func (r *receiving) startTasks(n int)   { r.changeWaiting(-n, false) }
func (r *receiving) startedTasks(n int) { r.changeWaiting(-n, true) }

// changeWaiting adds d to the messages waiting, -d of them started when
// started, and tells the start flow (prefetchNow) what waited until now.
func (r *receiving) changeWaiting(d int, started bool) {
	r.flow.mu.Lock()
	r.flow.advance(time.Now(), r.waiting.Load() > 0)
	if started {
		r.flow.starts -= float64(d)
	}
	n := r.waiting.Add(int64(d))
	r.flow.mu.Unlock()
	r.waitingGauge.Set(float64(n))
	if d < 0 {
		r.pokeRoom()
	}
}

// startFlow is how fast waiting messages start: starts, over the time in
// which some waited (busy), each decayed by e^(-age/tau), so that the rate
// is the recent one and an hour with an empty queue, when nothing waited,
// does not read as slow starts.
type startFlow struct {
	mu           sync.Mutex
	tau          time.Duration
	starts, busy float64 // busy in seconds
	at           time.Time
}

// flowTrust is the least busy time, in seconds, the flow's rate is read
// from: before it, Prefetch.
const flowTrust = 5.0

// advance decays the flow to now, waiting telling whether messages waited
// since the last advance. f.mu is held.
func (f *startFlow) advance(now time.Time, waiting bool) {
	if f.at.IsZero() {
		f.at = now
		return
	}
	dt := now.Sub(f.at).Seconds()
	if dt <= 0 {
		return
	}
	decay := math.Exp(-dt / f.tau.Seconds())
	f.starts *= decay
	f.busy *= decay
	if waiting {
		// The decayed integral of the seconds waited, from at to now.
		f.busy += f.tau.Seconds() * (1 - decay)
	}
	f.at = now
}

// depth is how many may wait so that they start within target at the
// flow's rate, within 1 and most. f.mu is held.
func (f *startFlow) depth(now time.Time, waiting bool, most int, target time.Duration) int {
	f.advance(now, waiting)
	if f.busy < flowTrust {
		return most
	}
	n := math.Ceil(f.starts / f.busy * target.Seconds())
	return int(max(1, min(float64(most), n)))
}

// maxFetches bounds the claim-check fetches in flight at once, across
// messages: each holds a whole object in memory until its message runs.
const maxFetches = 8

// errBadObject marks an object that passed verification but does not stand
// for the item that references it: the publisher wrote the wrong thing, and
// no retry will change that.
var errBadObject = errors.New("object is not the referenced item")

// errBadRef marks a reference that names something other than this item's
// object in the payload bucket.
var errBadRef = errors.New("reference outside this job's payloads")

// maxClaimBytes bounds the object a reference may name. The publisher
// claim-checks items of a request body, which it bounds at 32 MiB by
// default; a reference is read up to its size, and anyone who can send to
// the queue writes the size.
const maxClaimBytes = 64 << 20

// A claimRefused is a claim-checked item that can never be fetched as it is
// referenced. Its Error is the dead letter's reason, and it is the same
// whether the object is missing, of another size or SHA-256, or not the
// item: the reason is stored in the chunk's failed marker and served by the
// publisher's GET, and must tell whoever sent the message nothing about an
// object they did not already know (not that it exists, nor its size, hash
// or content). What happened is in err, for the log and the metrics.
type claimRefused struct {
	id  string
	why string
	err error
}

func (e *claimRefused) Error() string { return "item " + job.QuoteID(e.id) + ": " + e.why }
func (e *claimRefused) Unwrap() error { return e.err }

const (
	whyNoMatch = "no object in the payload bucket matches the reference"
	whyBadRef  = "the reference does not name this item's object in the payload bucket"
	whyTooBig  = "the reference names an object larger than a claim-checked item can be"
)

func hasRefs(w *job.Work) bool {
	for _, it := range w.Items {
		if it.Ref != nil {
			return true
		}
	}
	return false
}

// claim fetches the claim-checked items of w off the poll loop and sends the
// message on to admission. The message was counted as waiting before this
// started, so the poller never receives more than the buffer can take, and
// its lease is extended by the keeper all along. Fetching is part of getting
// to admission, so it shares the admission deadline: a fetch that hangs past
// AdmitTimeout releases the message for a retry instead of holding a
// prefetch slot.
func (s *Subscriber) claim(ctx context.Context, t *task) {
	l, w := t.lease, t.work
	fctx, cancel := context.WithDeadline(ctx, l.received.Add(s.cfg.AdmitTimeout))
	defer cancel()
	err := s.fetchItems(fctx, w)
	var refused *claimRefused
	switch {
	case ctx.Err() != nil:
		s.startTasks(1)
		s.end(t, endHandBack(0, "shutdown"))
	case err == nil:
		s.enqueue(t)
	case errors.As(err, &refused):
		s.log.Warn("claim-checked item refused", "message_id", l.msg.ID, "job_id", w.JobID, "chunk", w.Chunk, "err", refused.err)
		s.startTasks(1)
		s.endAsync(t, endDeadLetter("claim_check", refused.Error()))
	default:
		delay := t.retryAfter()
		s.log.Warn("fetching a claim-checked item failed; message released for a retry", "message_id", l.msg.ID,
			"receive_count", l.msg.ReceiveCount, "retry_in", delay, "err", err)
		s.startTasks(1)
		s.end(t, endFailed())
	}
}

// fetchItems replaces every item of w that has a Ref with the item stored in
// the payload bucket, verified. The first error stops the others.
func (s *Subscriber) fetchItems(ctx context.Context, w *job.Work) error {
	g, ctx := errgroup.WithContext(ctx)
	for i := range w.Items {
		ref := w.Items[i].Ref
		if ref == nil {
			continue
		}
		id := w.Items[i].ID
		g.Go(func() error {
			if err := s.fetchSlots.Acquire(ctx, 1); err != nil {
				return fmt.Errorf("item %q: waiting to fetch s3://%s/%s: %w", id, ref.Bucket, ref.Key, err)
			}
			defer s.fetchSlots.Release(1)
			it, err := s.fetchItem(ctx, w.JobID, w.Endpoint, id, *ref)
			s.m.claimChecks.WithLabelValues(claimOutcome(err)).Inc()
			if errors.As(err, new(*claimRefused)) {
				return err
			}
			if err != nil {
				return fmt.Errorf("item %s: %w", job.QuoteID(id), err)
			}
			w.Items[i] = it // each goroutine writes its own element
			return nil
		})
	}
	return g.Wait()
}

// fetchItem fetches the item a reference stands for, verified. A
// reference must name exactly where the publisher puts this item of this
// job (job.ItemKey of the message's job id and the item's id, in the
// payload bucket): anyone who can send to the queue could otherwise point
// the subscriber at any object its role can read, other items, other jobs'
// payloads and results among them. Then the content: its size and SHA-256
// must be the reference's, and it must decode as exactly this item (same
// id, no reference of its own, content by the rule of job.Item.CheckFor
// the message's endpoint).
func (s *Subscriber) fetchItem(ctx context.Context, jobID, endpoint, id string, ref job.PayloadRef) (job.Item, error) {
	switch {
	case ref.Bucket != s.payloads.Bucket() || ref.Key != job.ItemKey(jobID, id):
		return job.Item{}, &claimRefused{id, whyBadRef, fmt.Errorf("%w: s3://%s/%s", errBadRef, ref.Bucket, ref.Key)}
	case ref.Size > maxClaimBytes:
		return job.Item{}, &claimRefused{id, whyTooBig, fmt.Errorf("%w: %d bytes", errBadRef, ref.Size)}
	}
	b, err := s.payloads.Get(ctx, ref)
	if errors.Is(err, payload.ErrMissing) || errors.Is(err, payload.ErrCorrupt) || errors.Is(err, job.ErrMalformed) {
		return job.Item{}, &claimRefused{id, whyNoMatch, err}
	}
	if err != nil {
		return job.Item{}, err
	}
	var it job.Item
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&it); err != nil {
		return job.Item{}, &claimRefused{id, whyNoMatch,
			fmt.Errorf("%w: s3://%s/%s is not item JSON: %v", errBadObject, ref.Bucket, ref.Key, err)}
	}
	switch {
	case it.ID != id:
		return job.Item{}, &claimRefused{id, whyNoMatch, fmt.Errorf("%w: s3://%s/%s holds another item", errBadObject, ref.Bucket, ref.Key)}
	case it.Ref != nil:
		return job.Item{}, &claimRefused{id, whyNoMatch,
			fmt.Errorf("%w: s3://%s/%s holds another reference, not the item", errBadObject, ref.Bucket, ref.Key)}
	}
	if err := it.CheckFor(endpoint); err != nil {
		return job.Item{}, &claimRefused{id, whyNoMatch, fmt.Errorf("%w: s3://%s/%s: %w", errBadObject, ref.Bucket, ref.Key, err)}
	}
	return it, nil
}

func claimOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, payload.ErrMissing):
		return "missing"
	case errors.Is(err, payload.ErrCorrupt):
		return "corrupt"
	case errors.Is(err, errBadObject), errors.Is(err, errBadRef):
		return "invalid"
	}
	return "error"
}

// cancels answers whether a job is cancelled (DELETE /v1/jobs/{id} wrote
// its job.CancelRecord), cheaply: the answer for a job is read from the
// bucket at most once per ttl, not once per message, and concurrent askers
// about one job share one read (singleflight). A job found cancelled stays
// so (the record is never removed), so only "not cancelled" expires; the
// table is bounded by maxEntries, expired answers going first.
//
// A read that fails counts as "not cancelled" for ttl: the chunk runs, as it
// would have before the cancel, and a bucket that is down costs one read
// per job per ttl, not one per message.
type cancels struct {
	read       func(ctx context.Context, key string) ([]byte, error)
	ttl        time.Duration
	maxEntries int
	now        func() time.Time
	log        *slog.Logger

	mu      sync.Mutex
	answers map[string]cancelAnswer
	reads   singleflight.Group
}

type cancelAnswer struct {
	cancelled bool
	until     time.Time // when a "no" expires; a "yes" never does
}

// maxCancelEntries bounds the cache: far more jobs than a subscriber sees
// in one ttl.
const maxCancelEntries = 4096

// cancelReadTimeout bounds one read of a cancel record.
const cancelReadTimeout = 5 * time.Second

func newCancels(read func(ctx context.Context, key string) ([]byte, error), ttl time.Duration, log *slog.Logger) *cancels {
	return &cancels{read: read, ttl: ttl, maxEntries: maxCancelEntries, now: time.Now, log: log,
		answers: map[string]cancelAnswer{}}
}

// cached is the answer for jobID when one is known and fresh, without any
// read.
func (c *cancels) cached(jobID string) (cancelled, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.answers[jobID]
	if !ok || (!a.cancelled && !c.now().Before(a.until)) {
		return false, false
	}
	return a.cancelled, true
}

// cancelled reports whether jobID is cancelled, from the cache or, when the
// cache has no fresh answer, from one read of its record.
func (c *cancels) cancelled(ctx context.Context, jobID string) bool {
	if yes, known := c.cached(jobID); known {
		return yes
	}
	v, _, _ := c.reads.Do(jobID, func() (any, error) {
		if yes, known := c.cached(jobID); known { // answered while this one waited
			return yes, nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelReadTimeout)
		defer cancel()
		_, err := c.read(rctx, job.CancelKey(jobID))
		yes := err == nil
		if err != nil && !errors.Is(err, payload.ErrMissing) {
			c.log.Warn("reading a job's cancel record failed; its chunks run", "job_id", jobID, "err", err, "retry_in", c.ttl)
		}
		c.store(jobID, yes)
		return yes, nil
	})
	return v.(bool)
}

func (c *cancels) store(jobID string, cancelled bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if _, ok := c.answers[jobID]; !ok && len(c.answers) >= c.maxEntries {
		for id, a := range c.answers {
			if !a.cancelled && !now.Before(a.until) {
				delete(c.answers, id)
			}
		}
		for id := range c.answers { // still full: any one goes (it is read again when needed)
			if len(c.answers) < c.maxEntries {
				break
			}
			delete(c.answers, id)
		}
	}
	c.answers[jobID] = cancelAnswer{cancelled: cancelled, until: now.Add(c.ttl)}
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
