package subscriber

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/job"
)

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

// sendOn sends a decoded message on: to admission, through a claim-check
// fetch when it has claim-checked items.
func (s *Subscriber) sendOn(ctx context.Context, t *task) {
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
	if !s.adm.fits(cost) {
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
				bytesize.Format(cost), bytesize.Format(s.adm.size), len(w.Items), none)))
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
