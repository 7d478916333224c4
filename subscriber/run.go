package subscriber

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
)

// The run stage: a batch runs on the backend (runner), split on out-of-memory, a message alone with the
// whole budget, and a model server's items give back their admission as they answer, a message of parts one
// part at a time. Its waits for the model are pause.go's; the answers it keeps, answers.go's.

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
// While the model asks to wait (pause.go) the batch waits before it runs,
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
// needed operator pauses it (pause.go), and the messages of a batch that
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
	var kept int64
	for _, t := range tasks {
		kept += t.keptBytes()
	}
	if kept > 0 {
		rctx = gpu.WithKept(rctx, kept)
	}
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
	// what their items got (answers.go).
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
// the answer store keeps it (answers.go), and an itemwise model's item
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
		Items: ask}, cost: t.cost, raw: t.raw, factor: t.factor, class: t.class, hold: t.hold, at: t.at, told: t.told, of: t}
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
