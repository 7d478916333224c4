package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
	"golang.org/x/sync/errgroup"
)

// The run stage: a batch runs on the backend (runner), waits that are not a message's fault hold it without
// a receive (pause: backoffs, the operator circuit), and what a backend has answered is kept, in memory and
// in the bucket, so that no answer is asked twice (answered, answer store, item-wise parts).

var errTimeout = errors.New("inference timed out")

// runBatch runs one batch and hands each of its messages on: with its
// result to the outbox, or to its end (message.go). Messages that ran out of
// memory even in a batch of their own are then run alone, with the whole
// budget, after this batch's other messages have let go of theirs: waiting
// for the whole budget while still holding part of it would wait forever.
//
// An out-of-memory error raises the estimate correction (correction.go) only
// once every message it hit has run, split or alone: a message that fails
// even with the device to itself is its own problem (it is dead-lettered),
// not evidence that the estimates are low, and a sender of such messages
// must not make the subscriber weigh everyone else's more. The same holds
// for the batch limit (learned.go): a split lowers it only when the batch
// that ran out of memory held no message that then failed alone, since its
// halves fitting says nothing about the batch's size when that message was
// the cause. Lowered at every split level regardless, a few such messages
// would hold the limit near 1, and save it so.
//
// While the model asks to wait (run.go) the batch waits before it runs,
// and the messages a backoff or a needed operator stopped wait and run
// again, holding their leases and their admission: nothing else could
// run meanwhile anyway.
func (s *Subscriber) runBatch(ctx context.Context, tasks []*task) {
	for len(tasks) > 0 {
		if tasks = s.dropCancelled(tasks); len(tasks) == 0 {
			return
		}
		run, rest, probe := s.awaitTurn(ctx, tasks)
		if len(run) == 0 {
			return
		}
		sp := s.runOnce(ctx, run)
		if probe && !sp.operator {
			s.probeDone()
		}
		tasks = append(sp.wait, rest...)
	}
}

// runOnce runs tasks as one batch, as runBatch describes, and returns what
// its splits found, with the tasks that must wait for the model.
func (s *Subscriber) runOnce(ctx context.Context, tasks []*task) *splits {
	factor := batchFactor(tasks)
	sp := &splits{}
	_, alone := s.process(ctx, tasks, sp)
	for _, t := range alone {
		t.hold.yieldWeight()
		s.leaveBatch(t)
	}
	failed := map[*task]bool{}
	for _, t := range alone {
		if !s.runAlone(ctx, t, sp) {
			failed[t] = true
		}
	}
	if sp.oomed && len(failed) == 0 {
		s.corr.outOfMemory(factor)
	}
	for _, l := range sp.lessons {
		if !slices.ContainsFunc(l.tasks, func(t *task) bool { return failed[t] }) {
			s.state.lower(l.worked, len(l.tasks), l.budget)
		}
	}
	// Only now, with the batch's results on their way: on a GPU the reading
	// is a driver call (NVML, per process too), which in line after the run
	// held every result back by its time.
	s.readDevice()
	return sp
}

// readDevice updates the device memory gauges from a reading now; a failed
// read leaves them to the budget refresh.
func (s *Subscriber) readDevice() {
	if mem, err := s.mem.Read(); err == nil && mem.Total > 0 {
		s.m.deviceFree.Set(float64(mem.Free))
		s.m.deviceProcess.Set(float64(mem.Process))
	}
}

// dropCancelled ends the tasks whose job was cancelled while they waited
// (checked again here: a message may wait in admission far longer than the
// cache's TTL) and returns the others. What a cancelled task holds in
// admission goes back at once; its marker and delete go off the runner.
func (s *Subscriber) dropCancelled(tasks []*task) []*task {
	if s.cancels == nil {
		return tasks
	}
	kept := tasks[:0:0]
	for _, t := range tasks {
		if !s.cancels.cancelled(context.Background(), t.work.JobID) {
			kept = append(kept, t)
			continue
		}
		s.endAsync(t, endCancel())
	}
	return kept
}

// splits is what the out-of-memory splits of one batch found out, for
// runBatch to act on once the messages that ran out of memory alone have
// run.
type splits struct {
	oomed bool // a batch ran out of memory
	// lessons are the splits where a smaller batch fitted after a larger
	// one ran out of memory, innermost first.
	lessons []sizeLesson
	// wait are the tasks a backoff or a needed operator stopped, still
	// holding their leases and admission: they run again after the wait.
	wait []*task
	// operator: the model said it needs an operator.
	operator bool
}

// sizeLesson is a batch, tasks, that ran out of memory with the budget at
// budget, while a batch of worked of its messages then fitted.
type sizeLesson struct {
	tasks  []*task
	worked int
	budget int64
}

// process runs tasks as one batch and hands each on, as runBatch does,
// splitting in halves on out-of-memory. It returns the size of the largest
// batch that succeeded and the tasks that ran out of memory on their own,
// still holding admission, and records its splits in sp.
func (s *Subscriber) process(ctx context.Context, tasks []*task, sp *splits) (ok int, alone []*task) {
	var outs [][]job.Output
	var err error
	if len(tasks) == 1 {
		outs, err = s.runOne(ctx, tasks[0], false)
	} else {
		outs, err = s.infer(ctx, tasks, false)
	}
	switch {
	case err == nil:
		// The model has returned, so the batch's device memory is free:
		// let the next batch in now rather than after the results are
		// encoded and sent, which would leave the device idle meanwhile.
		s.outbox.promise(len(tasks))
		s.corr.ran()
		for _, t := range tasks {
			s.giveBack(t)
			if len(tasks) == 1 {
				s.suspects.clear(t.lease.msg.ID)
			}
		}
		s.state.ran(len(tasks))
		s.complete(tasks, outs)
		return len(tasks), nil
	case errors.Is(err, gpu.ErrOutOfMemory):
		s.m.oomRetries.Inc()
		sp.oomed = true
		if len(tasks) == 1 {
			s.log.Warn("out of memory in a batch of one; will run it alone", "message_id", tasks[0].lease.msg.ID,
				"cost", s.amount(tasks[0].cost), "err", err)
			return 0, tasks
		}
		half := len(tasks) / 2
		s.log.Warn("out of memory; splitting the batch in halves", "messages", len(tasks),
			"cost", s.amount(sumCost(tasks)), "halves", []int{half, len(tasks) - half}, "err", err)
		ok1, alone1 := s.process(ctx, tasks[:half], sp)
		ok2, alone2 := s.process(ctx, tasks[half:], sp)
		ok = max(ok1, ok2)
		if ok > 0 {
			sp.lessons = append(sp.lessons, sizeLesson{tasks: tasks, worked: ok, budget: s.adm.budget()})
		}
		return ok, append(alone1, alone2...)
	case errors.Is(err, fault.ErrInvalidInput) && len(tasks) > 1:
		// Find the bad ones; the rest run.
		half := len(tasks) / 2
		ok1, alone1 := s.process(ctx, tasks[:half], sp)
		ok2, alone2 := s.process(ctx, tasks[half:], sp)
		return max(ok1, ok2), append(alone1, alone2...)
	}
	s.endAll(tasks, s.failure(ctx, tasks, outs, err, sp), sp)
	return 0, nil
}

// failure is what err, from a run of tasks that did not run out of memory,
// means for each of them: one outcome a task. What it means for the
// subscriber is done here: a lost device shuts it down, a backoff or a
// needed operator pauses it (run.go), and the messages of a batch that
// failed become suspects, to run alone next time.
//
// A failure that may pass (a timeout, a model error) releases its messages
// after a delay that grows with their receive count, and the queue's
// redrive policy dead-letters one that keeps failing; one cut off by the
// shutdown's grace is not the message's failure and goes back at once.
func (s *Subscriber) failure(ctx context.Context, tasks []*task, outs [][]job.Output, err error, sp *splits) []outcome {
	switch {
	case errors.Is(err, fault.ErrInvalidInput):
		return same(len(tasks), endDeadLetter("invalid_input", err.Error()))
	case errors.Is(err, gpu.ErrDeviceLost):
		s.loseDevice(len(tasks), err)
		return same(len(tasks), endHandBack(0, "device_lost"))
	case errors.Is(err, fault.ErrBackoff):
		return s.backOff(tasks, outs, err)
	case errors.Is(err, fault.ErrNeedsOperator):
		sp.operator = true
		s.needOperator(len(tasks), err)
		return same(len(tasks), outcome{kind: waits})
	case ctx.Err() != nil:
		for _, t := range tasks {
			s.log.Warn("batch cut off by shutdown; message handed back", "message_id", t.lease.msg.ID, "err", err)
		}
		return same(len(tasks), endHandBack(0, "shutdown"))
	}
	for _, t := range tasks {
		if len(tasks) > 1 {
			s.suspects.add(t.lease.msg.ID)
		}
		s.log.Warn("batch failed; message released", "message_id", t.lease.msg.ID, "receive_count", t.lease.msg.ReceiveCount,
			"retry_in", t.retryAfter(), "err", err)
	}
	return same(len(tasks), endFailed())
}

// same is n outcomes o.
func same(n int, o outcome) []outcome {
	os := make([]outcome, n)
	for i := range os {
		os[i] = o
	}
	return os
}

// endAll ends each of tasks as its outcome says; the ones that wait for the
// model join sp.wait, to run again after the wait.
func (s *Subscriber) endAll(tasks []*task, os []outcome, sp *splits) {
	for i, t := range tasks {
		if os[i].kind == waits {
			sp.wait = append(sp.wait, t)
			continue
		}
		s.end(t, os[i])
	}
}

// runAlone gives one message the whole device: it waits until every other
// admitted message has let go, so nothing else is running, and takes the
// whole budget as it is now. Out of memory then is a real failure and the
// message is dead-lettered.
//
// Unless the budget has shrunk below the message's estimate since it was
// admitted: another process holds part of the device, the out-of-memory
// error may be its doing, and the message is handed back for a retry rather
// than lost (the queue's redrive policy ends one that keeps failing).
//
// It reports whether the message ran; one that must wait for the model
// joins sp.wait.
func (s *Subscriber) runAlone(ctx context.Context, t *task, sp *splits) bool {
	if s.shrunkBelow(t, s.adm.budget()) {
		return false
	}
	n, err := t.hold.takeAll(ctx)
	if err != nil {
		s.end(t, endHandBack(0, "shutdown"))
		return false
	}
	if s.shrunkBelow(t, min(n, s.adm.budget())) {
		return false // the release gave the whole budget back, then ended the exclusive run
	}
	cost := t.raw
	outs, err := s.runOne(ctx, t, true) // its parts and item search still holding the device
	// Let go of the device before sending anything, as process does, and
	// let the budget follow the device again (the release ends the
	// exclusive run).
	if err == nil {
		s.outbox.promise(1)
	}
	s.giveBack(t)
	switch {
	case err == nil:
		s.log.Warn("ran alone after out of memory: succeeded", "message_id", t.lease.msg.ID, "cost", s.amount(cost))
		s.complete([]*task{t}, outs)
		return true
	case errors.Is(err, gpu.ErrOutOfMemory):
		s.m.oomRetries.Inc()
		s.end(t, endDeadLetter("out_of_memory", fmt.Sprintf(
			"out of memory with the device to itself: estimated %s, budget %s: %v",
			s.amount(cost), s.amount(n), err)))
	default:
		s.endAll([]*task{t}, s.failure(ctx, []*task{t}, outs, err, sp), sp)
	}
	return false
}

// shrunkBelow hands t back for a retry, and reports true, when the budget
// it would run alone with is below its estimate (vram only): another
// process's doing, not the message's, so at no cost to its receive count.
func (s *Subscriber) shrunkBelow(t *task, budget int64) bool {
	if s.adm.strategy != AdmitVRAM || t.raw <= budget {
		return false
	}
	delay := s.cfg.RetryDelay
	s.log.Warn("out of memory in a batch of one while another process holds device memory: "+
		"the budget is below its estimate; handed back for a retry",
		"message_id", t.lease.msg.ID, "cost", s.amount(t.raw), "budget", s.amount(budget), "retry_in", delay)
	s.end(t, endHandBack(delay, "device_shrunk"))
	return true
}

// infer runs tasks as one batch on the model under InferenceTimeout and
// splits the outputs back per task. When the model outlives its timeout, the
// tasks' admission weight is handed over to a goroutine that releases it
// only once the model returns: until then the device memory is still in use.
func (s *Subscriber) infer(ctx context.Context, tasks []*task, alone bool) ([][]job.Output, error) {
	var items []job.Item
	for _, t := range tasks {
		items = append(items, t.work.Items...)
	}
	cost := sumCost(tasks)
	// A line per batch, and the device reading before the batch for it,
	// are for debugging: with a fast model they would be a visible share of
	// the subscriber's own CPU.
	logBatch := s.log.Enabled(ctx, slog.LevelDebug)
	var before backend.Reading
	if logBatch {
		before, _ = s.mem.Read()
	}
	start := time.Now()
	s.stampStarted(tasks, start)
	rctx, cancel := context.WithTimeout(ctx, s.cfg.InferenceTimeout)
	rctx, stored := s.watchItems(rctx, tasks)
	type answer struct {
		outs []job.Output
		err  error
	}
	done := make(chan answer, 1)
	var ahead *launched
	if len(tasks) == 1 {
		ahead, tasks[0].ahead = tasks[0].ahead, nil // once: a retry launches afresh
	}
	go func() {
		if ahead != nil {
			<-ahead.done // launched under the subscriber's context: ends at shutdown
			if ahead.err == nil {
				outs, err := s.launchedRun(rctx, ahead.l)
				done <- answer{outs, err}
				return
			}
		}
		outs, err := s.modelRun(rctx, tasks[0].work.Endpoint, items) // the batcher never mixes endpoints
		done <- answer{outs, err}
	}()
	var a answer
	select {
	case a = <-done:
		cancel()
		stored() // before any of its messages can be handed back
	case <-rctx.Done():
		held := make([]*hold, len(tasks))
		for i, t := range tasks {
			held[i] = t.hold
		}
		h := s.handOver(append(held, batchHolds(tasks)...)...)
		go func() {
			<-done
			cancel()
			h.release()
		}()
		return nil, fmt.Errorf("%w after %v (%d messages, %d items)", errTimeout,
			time.Since(start).Round(time.Millisecond), len(tasks), len(items))
	}
	elapsed := time.Since(start)
	if logBatch {
		after, _ := s.mem.Read()
		s.log.Debug("batch", "messages", len(tasks), "items", len(items), "cost", s.amount(cost),
			"alone", alone, "took", elapsed.Round(time.Microsecond), "ok", a.err == nil,
			"device_free_before", s.amount(before.Free), "device_free_after", s.amount(after.Free),
			"device_process_before", s.amount(before.Process), "device_process_after", s.amount(after.Process),
			"simulated", s.mem.Simulated())
	}
	if a.err != nil {
		return s.finished(tasks, start, elapsed, a.err), a.err
	}
	s.m.batchSize.Observe(float64(len(tasks)))
	s.m.batchBytes.Observe(float64(cost))
	s.m.batchSeconds.Observe(elapsed.Seconds())
	if len(a.outs) != len(items) {
		return nil, fmt.Errorf("model %s returned %d outputs for %d items", s.cfg.Backend.Name(), len(a.outs), len(items))
	}
	s.stampRan(tasks, start, start.Add(elapsed))
	per := make([][]job.Output, len(tasks))
	for i, t := range tasks {
		n := len(t.work.Items)
		per[i], a.outs = a.outs[:n:n], a.outs[n:]
	}
	return per, nil
}

// finished returns, for a batch of tasks that failed with err after
// starting at start and running for elapsed, the outputs of the tasks
// whose items all finished before it, by the outputs err carries
// (fault.PartialError), nil for the others; nil when err carries none. A
// message's result is written once, whole, so a task with an item
// unfinished has nothing to keep.
func (s *Subscriber) finished(tasks []*task, start time.Time, elapsed time.Duration, err error) [][]job.Output {
	outs, done, ok := fault.Partial[job.Output](err)
	n := 0
	for _, t := range tasks {
		n += len(t.work.Items)
	}
	if !ok || len(outs) != n {
		return nil
	}
	// Tasks that wait for the model after this batch stay here, and keep
	// what their items got (run.go).
	waits := errors.Is(err, fault.ErrBackoff) || errors.Is(err, fault.ErrNeedsOperator)
	var per [][]job.Output
	at := 0
	for i, t := range tasks {
		k := len(t.work.Items)
		switch {
		case !slices.Contains(done[at:at+k], false):
			if per == nil {
				per = make([][]job.Output, len(tasks))
			}
			per[i] = outs[at : at+k : at+k]
			s.stampRan(tasks[i:i+1], start, start.Add(elapsed))
		case waits && t.parts == nil && t.keep(outs[at:at+k], done[at:at+k]):
			s.m.answersKept.Add(float64(countTrue(done[at : at+k])))
		}
		at += k
	}
	return per
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

func sumCost(tasks []*task) int64 {
	var c int64
	for _, t := range tasks {
		c += t.cost
	}
	return c
}

// What runs the model may say that nothing will run for a while, or until a
// person acts. No message is to blame for either, and SQS counts every
// receive of a message towards its redrive (a message handed back and
// received again is one receive nearer the DLQ), so a wait never hands a
// message back to be received again:
//
//   - fault.ErrBackoff (a rate limit's window, an overloaded server, a daily
//     quota, past the wait the model does inside Run): the batch's messages
//     that did not finish wait in their runner, holding their leases (the
//     keeper extends them; max hold does not count while they wait), until
//     the server's time, then run again. Nothing is received meanwhile,
//     and a batch that would start waits the same way.
//   - fault.ErrNeedsOperator (a spent quota, a refused key, an unknown
//     model): a circuit that opens. Nothing is received; held messages
//     wait as above; readiness fails with the reason (Ready), and one
//     ERROR log and the needs_operator gauge say so. Every OperatorProbe
//     one message runs as a probe (a message already held, or, with none
//     held, one received for it): when it gets through, the circuit
//     closes and work resumes without a restart; when it does not, the
//     next probe is an OperatorProbe later.
//
// A wait longer than a lease can hold (SQS keeps a message invisible for at
// most 12 hours from its receive) hands the message back as a fresh copy
// visible again when the wait ends, or in 15 minutes at most (SQS's longest
// delay), and deletes the original (keeper.handBack): a fresh copy starts
// a fresh receive count. A shutdown hands waiting messages back the same
// way, at once.
type pause struct {
	mu       sync.Mutex
	until    time.Time // nothing runs before; zero when not backing off
	reason   string
	operator error     // non-nil while the circuit is open: nothing runs but a probe
	probeAt  time.Time // with operator: when the next probe may run
	// probeReceive: the poller was let receive one message for a probe,
	// since no batch was waiting to be one.
	probeReceive bool
	probing      bool // a probe batch is running
	waiters      int  // batches waiting for the pause to end
	changed      chan struct{}
}

func newPause() *pause { return &pause{changed: make(chan struct{})} }

// notify wakes everything waiting on p's state. Call it with p.mu held.
func (p *pause) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// backOff pauses until until, or later if already so; it reports whether
// it moved the pause.
func (p *pause) backOff(until time.Time, reason string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !until.After(p.until) {
		return false
	}
	p.until, p.reason = until, reason
	p.notify()
	return true
}

// needOperator opens the circuit, or keeps it open after a failed probe,
// with the next probe every from now; it reports whether it opened it.
func (p *pause) needOperator(err error, now time.Time, every time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	first := p.operator == nil
	p.operator, p.probeAt, p.probing, p.probeReceive = err, now.Add(every), false, false
	p.notify()
	return first
}

// probed ends a probe that did not need an operator: the circuit closes.
// It reports whether the circuit was open.
func (p *pause) probed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probing = false
	if p.operator == nil {
		return false
	}
	p.operator, p.probeReceive = nil, false
	p.notify()
	return true
}

// turn says whether a batch may run now: go, as a probe of the open
// circuit when probe. Otherwise it must wait until wake (zero: until
// changed is closed).
func (p *pause) turn(now time.Time) (ok, probe bool, wake time.Time, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = p.changed
	switch {
	case now.Before(p.until):
		return false, false, p.until, changed
	case p.operator == nil:
		return true, false, time.Time{}, changed
	case !p.probing && (p.probeReceive || !now.Before(p.probeAt)):
		p.probing, p.probeReceive = true, false
		return true, true, time.Time{}, changed
	case p.probing:
		return false, false, time.Time{}, changed
	}
	return false, false, p.probeAt, changed
}

// wakeAt is when a wait that begins now ends at the earliest, for a message
// handed back meanwhile: the backoff's end, or the next probe.
func (p *pause) wakeAt(now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Before(p.until) {
		return p.until
	}
	if p.operator != nil {
		return p.probeAt
	}
	return now
}

// addWaiter counts a batch waiting for the pause (n = 1) or no longer
// (n = -1).
func (p *pause) addWaiter(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waiters += n
	p.notify()
}

// receive tells the poller how many messages it may receive now: -1 for
// no limit, 1 for a probe (the circuit is open, a probe is due and no
// batch waits to be it), 0 for none, until wake (zero: until changed). A
// probe's receive moves the next probe every on: should its message never
// reach a batch (a cancelled job's, a malformed one) or the receive bring
// none, the next probe is received then.
func (p *pause) receive(now time.Time, every time.Duration) (n int, wake time.Time, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = p.changed
	switch {
	case now.Before(p.until):
		return 0, p.until, changed
	case p.operator == nil:
		return -1, time.Time{}, changed
	case p.probing || p.waiters > 0:
		return 0, time.Time{}, changed
	case now.Before(p.probeAt):
		return 0, p.probeAt, changed
	}
	p.probeReceive, p.probeAt = true, now.Add(every)
	return 1, time.Time{}, changed
}

// gotNothing says a probe's receive brought no message: the next is
// received at the next probe.
func (p *pause) gotNothing() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probeReceive = false
}

// watch is a channel closed when p's state changes, and the operator's
// error now.
func (p *pause) watch() (changed <-chan struct{}, operator error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed, p.operator
}

// cause is the operator's error, nil while none is needed.
func (p *pause) cause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.operator
}

// leaseLimit is the latest a message received at received can wait holding
// its lease: the last extension, a visibility timeout long, must end within
// SQS's 12 hours, with a minute to spare for the clocks.
func (s *Subscriber) leaseLimit(l *lease) time.Time {
	return l.received.Add(job.MaxVisibility - s.cfg.Visibility - time.Minute)
}

// backoffReason is a metric label for a backoff's reason, which is the
// server's words: a few kinds, so that the series stay bounded.
func backoffReason(reason string) string {
	switch {
	case strings.HasPrefix(reason, "429"), strings.HasPrefix(reason, "rate limit"):
		return "rate_limit"
	case reason == "":
		return "unknown"
	}
	return "overloaded"
}

// backOff pauses until err's time (fault.ErrBackoff) and returns an outcome
// for each of tasks: waits, or carried for one completed. A task with outputs in outs (every item of its
// message finished before the backoff: fault.PartialError, see
// Subscriber.finished) is completed instead, as a batch that ran: its
// requests were answered, and running it again would send them again,
// spending their tokens twice. outs is nil or one entry per task.
func (s *Subscriber) backOff(tasks []*task, outs [][]job.Output, err error) []outcome {
	var done []*task
	var doneOuts [][]job.Output
	os := make([]outcome, len(tasks))
	waiting := 0
	for i, t := range tasks {
		if outs == nil || outs[i] == nil {
			os[i] = outcome{kind: waits}
			waiting++
			continue
		}
		os[i] = outcome{kind: carried}
		done, doneOuts = append(done, t), append(doneOuts, outs[i])
	}
	until, _ := fault.BackoffUntil(err)
	reason := err.Error()
	var b *fault.BackoffError
	if errors.As(err, &b) {
		reason = b.Reason
	}
	for range waiting {
		s.m.backedOff.WithLabelValues(backoffReason(reason)).Inc()
	}
	if s.pause.backOff(until, reason) {
		s.m.pausedUntil.Set(float64(until.UnixMilli()) / 1e3)
		s.log.Warn("the model asks to wait: its messages wait holding their leases, nothing is received meanwhile",
			"until", until.UTC(), "reason", reason, "messages", waiting)
	}
	if len(done) > 0 {
		s.outbox.promise(len(done))
		for _, t := range done {
			s.giveBack(t)
		}
		s.log.Info("a backoff came with part of the batch finished: its finished messages complete, the rest wait",
			"completed", len(done), "waiting", waiting)
		s.complete(done, doneOuts)
	}
	return os
}

// needOperator opens the circuit (fault.ErrNeedsOperator), or keeps it open
// after a probe that failed, for a run of n messages, which wait.
func (s *Subscriber) needOperator(n int, err error) {
	if s.pause.needOperator(err, time.Now(), s.cfg.OperatorProbe) {
		s.m.needsOperator.Set(1)
		s.log.Error("the model needs an operator: nothing is received, held messages wait holding their leases, "+
			"and one message runs as a probe every operator_probe until it gets through", "err", err,
			"messages", n, "operator_probe", s.cfg.OperatorProbe)
	} else {
		s.log.Warn("a probe of the model still needs an operator", "err", err, "next_probe_in", s.cfg.OperatorProbe)
	}
}

// probeDone closes the circuit after a probe that did not need an
// operator.
func (s *Subscriber) probeDone() {
	if s.pause.probed() {
		s.m.needsOperator.Set(0)
		s.log.Info("a probe got through: the model takes work again; receiving resumes")
	}
}

// awaitTurn waits while the model asks to wait and returns the tasks to run
// now: all of them, or the first alone as the probe of an open circuit
// (probe), with the rest to run after it. A task whose lease cannot be held
// to the wait's end is handed back meanwhile (a fresh copy, visible when
// the wait ends), and shutdown hands back every task still waiting; run is
// empty when none is left.
func (s *Subscriber) awaitTurn(ctx context.Context, tasks []*task) (run, rest []*task, probe bool) {
	var waiting []*lease // marked waiting in the keeper, counted in the gauge
	defer func() {
		if waiting != nil {
			s.keeper.setWaiting(waiting, false)
			s.m.modelWaiting.Sub(float64(len(waiting)))
			s.pause.addWaiter(-1)
		}
	}()
	for {
		now := time.Now()
		ok, probe, wake, changed := s.pause.turn(now)
		if ok {
			if probe {
				return tasks[:1], tasks[1:], true
			}
			return tasks, nil, false
		}
		if waiting == nil {
			for _, t := range tasks {
				waiting = append(waiting, t.lease)
			}
			s.keeper.setWaiting(waiting, true)
			s.m.modelWaiting.Add(float64(len(waiting)))
			s.pause.addWaiter(1)
		}
		// Hand back what cannot wait longer holding its lease.
		kept := tasks[:0]
		next := wake
		for _, t := range tasks {
			limit := s.leaseLimit(t.lease)
			if !now.Before(limit) {
				s.end(t, endHandBack(s.pause.wakeAt(now).Sub(now), "wait"))
				continue
			}
			if next.IsZero() || limit.Before(next) {
				next = limit
			}
			kept = append(kept, t)
		}
		tasks = kept
		if len(tasks) == 0 {
			return nil, nil, false
		}
		var timer *time.Timer
		var fired <-chan time.Time
		if !next.IsZero() {
			timer = time.NewTimer(next.Sub(now))
			fired = timer.C
		}
		select {
		case <-changed:
		case <-fired:
		case <-ctx.Done():
		case <-s.stopping:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil || s.isStopping() {
			for _, t := range tasks {
				s.end(t, endHandBack(0, "shutdown"))
			}
			return nil, nil, false
		}
	}
}

// waitToReceive blocks the poller while the model asks to wait, and
// returns how many messages it may receive (-1: no limit; 1: a probe's);
// false when ctx ends first.
func (s *Subscriber) waitToReceive(ctx context.Context) (int, bool) {
	for {
		n, wake, changed := s.pause.receive(time.Now(), s.cfg.OperatorProbe)
		if n != 0 {
			return n, true
		}
		var timer <-chan time.Time
		var t *time.Timer
		if !wake.IsZero() {
			t = time.NewTimer(time.Until(wake))
			timer = t.C
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return 0, false
		}
	}
}

// receiveContext is ctx, cancelled also when the model opens the circuit
// while the receive is in flight: an operator stop does not wait out a
// long poll. (A backoff lets it answer: what it brings waits, holding its
// leases, like any message held.) stop releases its resources.
func (s *Subscriber) receiveContext(ctx context.Context) (rctx context.Context, stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	if _, op := s.pause.watch(); op != nil {
		return rctx, cancel // a probe's receive: the circuit is open already
	}
	go func() {
		for {
			changed, op := s.pause.watch()
			if op != nil {
				cancel()
				return
			}
			select {
			case <-changed:
			case <-done:
				return
			}
		}
	}()
	return rctx, func() { close(done); cancel() }
}

// A message that waits for the model (run.go) stays in this process, so
// the answers a backoff came with for some of its items are kept on its task
// and only its other items are asked again when it runs after the wait: a
// model server's answer is paid for (tokens of a rate limit, a quota), and a
// chunk of 32 long generations that backs off after 31 would otherwise ask
// all 32 again, at every backoff. Its result is still written once, whole,
// in the order of its items. A message handed back, or redelivered after a
// process dies, finds them in the answer store instead (run.go).
type answered struct {
	items []job.Item   // the message's items, as received
	outs  []job.Output // by item, where done
	done  []bool       // by item
	idx   []int        // for each item of t.work now, its index in items
}

// keep records the outputs of t's items that done marks as finished (outs
// and done are aligned with t.work.Items now), and leaves t.work with the
// other items, to run after the wait. It reports whether any was kept.
func (t *task) keep(outs []job.Output, done []bool) bool {
	if !slices.Contains(done, true) {
		return false
	}
	a := t.answered
	if a == nil {
		n := len(t.work.Items)
		a = &answered{items: t.work.Items, outs: make([]job.Output, n), done: make([]bool, n), idx: make([]int, n)}
		for i := range a.idx {
			a.idx[i] = i
		}
		t.answered = a
	}
	var rest []job.Item
	var idx []int
	for i, it := range t.work.Items {
		if done[i] {
			a.outs[a.idx[i]], a.done[a.idx[i]] = outs[i], true
			continue
		}
		rest, idx = append(rest, it), append(idx, a.idx[i])
	}
	w := *t.work
	w.Items = rest
	t.work, a.idx = &w, idx
	return true
}

// whole returns t's outputs for all its items, outs being those of
// t.work.Items now, and gives t.work its items back; outs as they are when
// nothing was kept.
func (t *task) whole(outs []job.Output) []job.Output {
	a := t.answered
	if a == nil || len(outs) != len(a.idx) {
		return outs
	}
	all := slices.Clone(a.outs)
	for i, o := range outs {
		all[a.idx[i]] = o
	}
	w := *t.work
	w.Items = a.items
	t.work, t.answered = &w, nil
	return all
}

// answerBucket is what the answer store needs of the payload bucket besides
// Payloads: a chunk's answers are found by listing its prefix, and deleted
// once its result is out. *payload.Store has both.
type answerBucket interface {
	Lister
	Delete(ctx context.Context, key string) error
}

// An answerStore keeps each item's answer in the payload bucket as soon as
// the model has it (gpu.WithAnswers), until its chunk's result is out, so
// that no answer is asked for twice: a model server's answer is paid for,
// and whatever ends a message before its result (a backoff, an overload
// late in a batch, a SIGTERM, a scale-in, a crash) hands back a chunk whose
// next run, in this process or another, reads what was answered and asks
// only for the rest. run.go keeps answers on a task that waits in this
// process; this keeps them past it.
//
// The store costs a PutObject per answered item, and, on a message received
// before (ApproximateReceiveCount above 1, or a hand-back's copy,
// AttrHandedBack), a ListObjectsV2 and a GetObject per answer kept; on a
// message whose answers were kept, a ListObjectsV2 and a DeleteObject per
// answer once its result is out. A model that never tells answers
// (in-process models) stores none. Answers of a chunk whose result never
// goes out (dead-lettered) stay until the bucket's lifecycle expires
// answers/ (infra/bucket.tf).
type answerStore struct {
	put    Payloads // counted (countedPayloads)
	bucket answerBucket
	log    *slog.Logger
	m      *metrics
	// cleaning tracks the deletes started by forget.
	cleaning sync.WaitGroup
}

// newAnswerStore returns the answer store on p, or nil when p cannot list and
// delete (a bucket that can only be read and written).
func newAnswerStore(counted Payloads, p Payloads, log *slog.Logger, m *metrics) *answerStore {
	b, ok := p.(answerBucket)
	if !ok {
		return nil
	}
	return &answerStore{put: counted, bucket: b, log: log, m: m}
}

// answersOf is where the answers of t's chunk are kept: under the tenant
// that sent it, its job and its chunk.
func answersOf(t *task) string {
	return job.AnswersPrefix(t.lease.msg.Attributes[job.AttrTenant], t.work.JobID, t.work.Chunk)
}

// keeper returns what keeps an answer of a batch's item (watchItems calls
// it as the answer arrives), and wait, which returns once every keep
// started has ended: the batch's messages may be handed back only after
// their answers are stored, or another process would ask again. A keep
// that fails is logged and the item is asked again on a later run: the
// answer is in this batch's outputs still. nil without a store.
func (a *answerStore) keeper(ctx context.Context) (keep func(t *task, it job.Item, out job.Output), wait func()) {
	if a == nil {
		return nil, func() {}
	}
	var wg sync.WaitGroup
	// The keeps outlive the batch's context: an answer got is stored
	// whatever ends the batch, within its own time.
	keepCtx := context.WithoutCancel(ctx)
	keep = func(t *task, it job.Item, out job.Output) {
		body, err := json.Marshal(out)
		if err != nil {
			return // the result fails to encode too, and says so
		}
		t.lease.answersKept.Store(true)
		key := job.AnswerKey(answersOf(t), it.ID)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(keepCtx, sendTimeout)
			defer cancel()
			if _, err := a.put.Put(ctx, key, body); err != nil {
				a.log.Warn("keeping an answer failed: the item is asked again if its message is handed back",
					"message_id", t.lease.msg.ID, "job_id", t.work.JobID, "chunk", t.work.Chunk, "item", it.ID, "err", err)
				return
			}
			a.m.answersStored.Inc()
		})
	}
	return keep, wg.Wait
}

// mayHold reports whether answers may be kept for t's chunk: only a message
// that was received before (or is a hand-back's copy, whose receive count
// starts again) can have been answered in part. A copy that had no room
// for AttrHandedBack among SQS's ten attributes is asked whole again.
func (a *answerStore) mayHold(t *task) bool {
	return a != nil && (t.lease.msg.ReceiveCount > 1 || t.lease.msg.Attributes[AttrHandedBack] != "")
}

// recallReads bounds the answers read at once for one message.
const recallReads = 8

// recall reads the answers kept for t's items and keeps them on t
// (run.go), leaving t.work with the items that have none. An answer
// that cannot be read in time, or does not belong to its item, is not
// used: the item is asked again. It returns ctx's error only.
func (a *answerStore) recall(ctx context.Context, t *task) error {
	rctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	prefix := answersOf(t)
	keys, err := a.bucket.List(rctx, prefix)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.log.Warn("listing kept answers failed: the message's items are all asked", "message_id", t.lease.msg.ID,
			"job_id", t.work.JobID, "chunk", t.work.Chunk, "err", err)
		return nil
	}
	if len(keys) == 0 {
		return nil
	}
	items := t.work.Items
	byKey := make(map[string]int, len(items))
	for i, it := range items {
		byKey[job.AnswerKey(prefix, it.ID)] = i
	}
	outs := make([]job.Output, len(items))
	done := make([]bool, len(items))
	g, gctx := errgroup.WithContext(rctx)
	g.SetLimit(recallReads)
	for _, key := range keys {
		i, ok := byKey[key]
		if !ok {
			continue
		}
		delete(byKey, key) // a key listed twice is read once
		g.Go(func() error {
			body, err := a.put.Read(gctx, key)
			if err != nil {
				if gctx.Err() == nil {
					a.log.Warn("reading a kept answer failed: the item is asked again", "message_id", t.lease.msg.ID,
						"key", key, "err", err)
				}
				return nil
			}
			var o job.Output
			if json.Unmarshal(body, &o) != nil || o.ID != items[i].ID || o.Response == nil {
				a.log.Warn("a kept answer is not its item's: the item is asked again", "message_id", t.lease.msg.ID, "key", key)
				return nil
			}
			outs[i], done[i] = o, true
			return nil
		})
	}
	_ = g.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if t.keep(outs, done) {
		t.lease.answersKept.Store(true)
		a.m.answersRecalled.Add(float64(countTrue(done)))
		a.log.Info("a redelivered message's kept answers read: only its other items are asked", "message_id", t.lease.msg.ID,
			"job_id", t.work.JobID, "chunk", t.work.Chunk, "answered", countTrue(done), "asked", len(t.work.Items))
	}
	return nil
}

// forget deletes the answers kept for t's chunk, if any, its result being
// out, off the caller's goroutine (the outbox's, which acks others). A
// delete that fails leaves the answer to the bucket's lifecycle.
func (a *answerStore) forget(t *task) {
	if a == nil || !t.lease.answersKept.Load() {
		return
	}
	a.cleaning.Go(func() { a.clean(t) })
}

// wait waits for the deletes forget started.
func (a *answerStore) wait() {
	if a != nil {
		a.cleaning.Wait()
	}
}

func (a *answerStore) clean(t *task) {
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	prefix := answersOf(t)
	keys, err := a.bucket.List(ctx, prefix)
	if err != nil {
		a.log.Warn("listing kept answers to delete failed: they expire by the bucket's lifecycle", "job_id", t.work.JobID,
			"chunk", t.work.Chunk, "err", err)
		return
	}
	for _, key := range keys {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		if err := a.bucket.Delete(ctx, key); err != nil {
			a.log.Warn("deleting a kept answer failed: it expires by the bucket's lifecycle", "key", key, "err", err)
		}
	}
}

// A model server's items are requests that hold the server's KV cache only
// while each is in flight (gpu.Itemwise), not a batch that holds its memory
// until it ends. A message of 32 generations whose lengths spread from a
// few tokens to hundreds would otherwise hold its whole charge in admission
// until its longest request ended, the pool's share of the others idle
// meanwhile, and a message too large for the budget would hold its largest
// part through every part (bench/modelserver.md, "KV through the
// subscriber": 0.24 of the pool used). So, under vram admission, each
// item's share of its message's weight is given back as its answer
// arrives (shed), and a message run in parts holds each part's own weight
// while that part runs (fitPart). Its request slots and rate tokens
// (need.res) are held until the message ends: a rate limit's tokens are
// spent by the answer, not freed by it.

// watchItems returns ctx with gpu.WithAnswers set for what acts on each
// answer of tasks' items (in order, as infer batches them) as it arrives:
// the answer store keeps it (run.go), and an itemwise model's item
// gives back its share of admission. wait returns once the store's writes
// have ended.
func (s *Subscriber) watchItems(ctx context.Context, tasks []*task) (context.Context, func()) {
	keep, wait := s.answers.keeper(ctx)
	shed := s.shedder(tasks)
	if keep == nil && shed == nil {
		return ctx, func() {}
	}
	var ends []int // ends[k] is one past task k's last item in the batch
	n := 0
	for _, t := range tasks {
		n += len(t.work.Items)
		ends = append(ends, n)
	}
	told := func(i int, out job.Output) {
		k, first := 0, 0
		for k < len(ends) && i >= ends[k] {
			first = ends[k]
			k++
		}
		if k == len(ends) {
			return
		}
		t, j := tasks[k], i-first
		if t.work.Items[j].ID != out.ID {
			return
		}
		if keep != nil {
			keep(t, t.work.Items[j], out)
		}
		t.told.put(out)
		if shed != nil {
			shed(k, j)
		}
	}
	return gpu.WithAnswers(ctx, told), wait
}

// shedder returns, for an itemwise model under vram admission, what gives
// back item j of tasks[k]'s share of that task's hold: the hold's weight
// now split by the items' own costs, so that once every item has answered
// the hold has given back (nearly) all; release gives back the rest. nil
// otherwise.
func (s *Subscriber) shedder(tasks []*task) func(k, j int) {
	iw, ok := capabilities(s.cfg.Backend).(gpu.Itemwise)
	if !ok || s.adm.strategy != AdmitVRAM {
		return nil
	}
	shares := make([][]int64, len(tasks))
	for k, t := range tasks {
		if t.hold == nil {
			continue
		}
		costs := iw.ItemCosts(t.work.Endpoint, t.work.Items)
		var total int64
		for _, c := range costs {
			total += c
		}
		w := t.hold.held()
		if total <= 0 || w <= 0 || len(costs) != len(t.work.Items) {
			continue
		}
		shares[k] = make([]int64, len(costs))
		for j, c := range costs {
			shares[k][j] = int64(float64(w) * float64(c) / float64(total))
		}
	}
	return func(k, j int) {
		if shares[k] != nil {
			tasks[k].hold.shed(shares[k][j])
		}
	}
}

// inferPart runs part p of t's message, as inferItems does, asking only
// for its items that have no answer yet: a message run in parts that waited
// for the model (a backoff) runs again from its first part, and the
// answers its parts got before are kept on it (told), not asked twice.
// The part holds the weight of the items it asks for (fitPart).
func (s *Subscriber) inferPart(ctx context.Context, t *task, p part, alone bool) ([]job.Output, error) {
	if t.told == nil {
		t.told = &toldAnswers{outs: map[string]job.Output{}}
	}
	items := t.work.Items[p.lo:p.hi]
	outs := make([]job.Output, len(items))
	var ask []job.Item
	var at []int
	for i, it := range items {
		if o, ok := t.told.get(it.ID); ok {
			outs[i] = o
			continue
		}
		ask, at = append(ask, it), append(at, i)
	}
	if len(ask) == 0 {
		return outs, nil
	}
	if err := s.fitPart(ctx, t, ask, alone); err != nil {
		return nil, err
	}
	// The run shares t's hold and its record of answers, as inferItems's.
	sub := &task{lease: t.lease, work: &job.Work{V: t.work.V, JobID: t.work.JobID, Chunk: t.work.Chunk, Endpoint: t.work.Endpoint,
		Items: ask}, cost: t.cost, raw: t.raw, factor: t.factor, class: t.class, hold: t.hold, at: t.at, told: t.told}
	got, err := s.infer(ctx, []*task{sub}, alone)
	t.at = sub.at
	if err != nil {
		return nil, err
	}
	for k, i := range at {
		outs[i] = got[0][k]
	}
	return outs, nil
}

// toldAnswers is the answers a message run in parts got, by item id.
type toldAnswers struct {
	mu   sync.Mutex
	outs map[string]job.Output
}

// put records out; a nil record (a message that runs whole) records none.
func (a *toldAnswers) put(out job.Output) {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.outs[out.ID] = out
	a.mu.Unlock()
}

func (a *toldAnswers) get(id string) (job.Output, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	o, ok := a.outs[id]
	return o, ok
}

// fitPart makes t's hold, before a part of its message runs, the weight of
// the items it asks for (their costs, corrected as the message's were) for
// an itemwise model under vram admission: the hold was the largest part's,
// and the part before gave back its share as its items answered. A hold
// short of it gives back what it has and waits for the whole weight, as an
// admission does: holding part of it while waiting for the rest would
// deadlock with others doing the same. Its error is ctx's.
func (s *Subscriber) fitPart(ctx context.Context, t *task, items []job.Item, alone bool) error {
	iw, ok := capabilities(s.cfg.Backend).(gpu.Itemwise)
	if !ok || s.adm.strategy != AdmitVRAM || alone || t.hold == nil || t.raw <= 0 {
		return nil
	}
	var raw int64
	for _, c := range iw.ItemCosts(t.work.Endpoint, items) {
		raw += c
	}
	w := s.adm.weight(int64(float64(raw) * float64(t.cost) / float64(t.raw)))
	return t.hold.fit(ctx, min(w, s.adm.size))
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
