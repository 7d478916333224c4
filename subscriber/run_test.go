package subscriber

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/promsum"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
)

func TestBackoffReason(t *testing.T) {
	for reason, want := range map[string]string{
		"429 rate_limit_exceeded":              "rate_limit",
		"rate limit: tokens per minute":        "rate_limit",
		"overloaded_429 429 Too Many Requests": "overloaded",
		"overloaded 503 Service Unavailable":   "overloaded",
		"":                                     "unknown",
	} {
		if got := backoffReason(reason); got != want {
			t.Errorf("backoffReason(%q) = %q; want %q", reason, got, want)
		}
	}
}

// phasedModel answers as a model server behind a spent limit would: a
// rate limit (429 rate_limit_exceeded, come back in a minute) until
// quotaAt, then a spent quota (429 insufficient_quota, needs an operator)
// until healthyAt, then it runs. It counts the items it answered.
type phasedModel struct {
	gpu.Model
	quotaAt, healthyAt time.Time

	mu       sync.Mutex
	answered map[string]int // by job/chunk/item
	calls    int
}

func (m *phasedModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	m.mu.Lock()
	m.calls++
	m.mu.Unlock()
	now := time.Now()
	switch {
	case now.Before(m.quotaAt):
		return nil, &fault.BackoffError{Until: now.Add(time.Minute), Reason: "429 rate_limit_exceeded"}
	case now.Before(m.healthyAt):
		return nil, fmt.Errorf("429 insufficient_quota: %w", fault.ErrNeedsOperator)
	}
	outs, err := m.Model.Run(ctx, items)
	if err == nil {
		m.mu.Lock()
		for _, it := range items {
			m.answered[it.Text]++
		}
		m.mu.Unlock()
	}
	return outs, err
}

// Six hours of a rate limit, then six of a spent quota, then a healthy
// server, with the queue's redrive at two receives: nothing may be
// dead-lettered (neither by the queue's redrive nor by the subscriber),
// every item is answered once, and the subscriber resumes by itself, without
// a restart, once a probe gets through. The waits hold the leases while SQS
// lets them (12 hours from a receive), then hand the messages back as fresh
// copies.
func TestWaitsNeverCostAReceive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var model *phasedModel
		h := startWith(t, 64*mib, Config{MaxBatch: 4, Visibility: 30 * time.Second}, func(h *harness, c *Config) {
			h.work.Redrive(h.dlq, 2)
			now := time.Now()
			model = &phasedModel{Model: h.model, quotaAt: now.Add(6 * time.Hour), healthyAt: now.Add(12 * time.Hour),
				answered: map[string]int{}}
			c.Backend = backend.InProcess{Model: model}
		})
		defer h.stop()
		const n = 20
		for i := range n {
			h.send("job", i, fmt.Sprintf("mb=1 ms=10 id=%d", i))
		}
		time.Sleep(6*time.Hour + 30*time.Minute)
		if err := h.sub.Healthy(); !errors.Is(err, fault.ErrNeedsOperator) {
			t.Errorf("Healthy during the spent quota: %v, want fault.ErrNeedsOperator", err)
		}
		time.Sleep(6*time.Hour + 30*time.Minute)
		if err := h.sub.Healthy(); err != nil {
			t.Errorf("Healthy after the quota came back: %v", err)
		}
		h.shutdown()
		if d, _ := h.dlq.Stats(); d != 0 {
			t.Errorf("%d messages dead-lettered; want none", d)
		}
		got, dups := h.resultsByKey()
		if len(got) != n || dups != 0 {
			t.Errorf("%d results (%d duplicates); want %d, none duplicated", len(got), dups, n)
		}
		model.mu.Lock()
		defer model.mu.Unlock()
		for i := range n {
			if k := fmt.Sprintf("mb=1 ms=10 id=%d", i); model.answered[k] != 1 {
				t.Errorf("item %d answered %d times; want once", i, model.answered[k])
			}
		}
		if live, _ := h.work.Stats(); live != 0 {
			t.Errorf("%d messages left on the work queue", live)
		}
		handedBack := promsum.Sum(t, h.reg, "vramq_subscriber_messages_handed_back_total")
		if handedBack == 0 {
			t.Errorf("no message was handed back, though the wait outlasted SQS's 12 hours of visibility")
		}
		t.Logf("model calls %d, messages handed back %v", model.calls, handedBack)
	})
}

// The circuit's states: open, it lets no batch run and no receive go until
// the probe is due; then one batch runs as the probe, or, with no batch
// waiting, the poller may receive one message for it (and, if that receive
// brings none, waits another interval); a probe that gets through closes it.
func TestPauseCircuit(t *testing.T) {
	p := newPause()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const every = 5 * time.Minute
	quota := fmt.Errorf("429 insufficient_quota: %w", fault.ErrNeedsOperator)
	if !p.needOperator(quota, now, every) || p.needOperator(quota, now, every) {
		t.Fatal("needOperator: want it to open the circuit once")
	}
	if ok, _, wake, _ := p.turn(now.Add(time.Minute)); ok || !wake.Equal(now.Add(every)) {
		t.Errorf("turn before the probe is due: ok %v, wake %v; want a wait until %v", ok, wake, now.Add(every))
	}
	if n, _, _ := p.receive(now.Add(time.Minute), every); n != 0 {
		t.Errorf("receive before the probe is due: %d; want none", n)
	}
	// No batch waits: the poller receives one message for the probe.
	if n, _, _ := p.receive(now.Add(every), every); n != 1 {
		t.Fatalf("receive when the probe is due and nothing waits: %d; want 1", n)
	}
	if n, _, _ := p.receive(now.Add(every), every); n != 0 {
		t.Errorf("a second receive for the same probe: %d; want none", n)
	}
	p.gotNothing()
	if n, wake, _ := p.receive(now.Add(every+time.Second), every); n != 0 || !wake.Equal(now.Add(2*every)) {
		t.Errorf("after a probe's receive brought nothing: %d, wake %v; want none until %v", n, wake, now.Add(2*every))
	}
	// A probe's message that never reaches a batch (a cancelled job's):
	// the next probe is received an interval later, not never.
	if n, _, _ := p.receive(now.Add(2*every), every); n != 1 {
		t.Fatalf("the second probe's receive: %d; want 1", n)
	}
	if n, wake, _ := p.receive(now.Add(2*every+time.Second), every); n != 0 || !wake.Equal(now.Add(3*every)) {
		t.Errorf("with a probe's message lost before its batch: %d, wake %v; want the next probe at %v", n, wake, now.Add(3*every))
	}
	if n, _, _ := p.receive(now.Add(3*every), every); n != 1 {
		t.Errorf("a probe interval after a lost probe's message: %d; want 1", n)
	}
	p.gotNothing()
	now = now.Add(2 * every)
	// A batch waits: it is the probe, alone.
	p.addWaiter(1)
	if n, _, _ := p.receive(now.Add(2*every), every); n != 0 {
		t.Errorf("receive while a batch waits to be the probe: %d; want none", n)
	}
	ok, probe, _, _ := p.turn(now.Add(2 * every))
	if !ok || !probe {
		t.Fatalf("turn when the probe is due: ok %v probe %v; want the probe", ok, probe)
	}
	if ok, _, _, _ := p.turn(now.Add(2 * every)); ok {
		t.Error("a second batch runs while the probe is out")
	}
	p.addWaiter(-1)
	if !p.probed() || p.cause() != nil {
		t.Fatal("a probe that got through did not close the circuit")
	}
	if ok, probe, _, _ := p.turn(now.Add(2 * every)); !ok || probe {
		t.Errorf("after the circuit closed: ok %v probe %v; want every batch to run", ok, probe)
	}
	if n, _, _ := p.receive(now.Add(2*every), every); n != -1 {
		t.Errorf("receive after the circuit closed: %d; want no limit", n)
	}
}

// partlyModel answers the first of a message's items and then asks to wait
// a minute, once (a backoff that came with part of the batch finished: the
// model server's gpu.PartialError); it counts how often each item is asked.
type partlyModel struct {
	gpu.Model
	mu    sync.Mutex
	asked map[string]int
	cut   bool
}

func (m *partlyModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	outs, err := m.Model.Run(ctx, items)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.cut {
		m.cut = true
		done := make([]bool, len(items))
		done[0] = true
		m.asked[items[0].Text]++
		return nil, &fault.PartialError[job.Output]{Err: &fault.BackoffError{Until: time.Now().Add(time.Minute), Reason: "429 test"},
			Outputs: outs, Done: done}
	}
	for _, it := range items {
		m.asked[it.Text]++
	}
	return outs, nil
}

// A message that waits after a backoff keeps the answers its items got
// before it: only its other items are asked again, and its result holds
// every item in order, once.
func TestWaitingMessageKeepsItsAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var model *partlyModel
		h := startWith(t, 64*mib, Config{MaxBatch: 1}, func(h *harness, c *Config) {
			model = &partlyModel{Model: h.model, asked: map[string]int{}}
			c.Backend = backend.InProcess{Model: model}
		})
		h.send("job", 0, "mb=1 ms=10 a", "mb=1 ms=10 b", "mb=1 ms=10 c")
		wait.For(t, 5*time.Minute, "the result", func() bool { r, _ := h.results.Stats(); return r == 1 })
		h.shutdown()
		model.mu.Lock()
		defer model.mu.Unlock()
		for _, it := range []string{"a", "b", "c"} {
			if n := model.asked["mb=1 ms=10 "+it]; n != 1 {
				t.Errorf("item %s asked %d times; want once", it, n)
			}
		}
		got, _ := h.resultsByKey()
		r := got[job.Key{JobID: "job"}]
		if len(r.Outputs) != 3 || r.Outputs[0].ID != "i0" || r.Outputs[1].ID != "i1" || r.Outputs[2].ID != "i2" {
			t.Errorf("result outputs %+v; want i0, i1, i2 in order", r.Outputs)
		}
		if n := counter(h.sub.m.answersKept); n != 1 {
			t.Errorf("answers_kept_total %d; want 1", n)
		}
	})
}

// itemwiseModel is a backend on the test model, as a model server: items
// are requests of their own (gpu.Itemwise), each costing costs[its ID].
type itemwiseModel struct {
	backend.InProcess
	costs map[string]int64
}

func (m itemwiseModel) ItemCosts(_ string, items []job.Item) []int64 {
	cs := make([]int64, len(items))
	for i, it := range items {
		cs[i] = m.costs[it.ID]
	}
	return cs
}

// itemTask is a message of items a, b, ... admitted with weight w.
func itemTask(s *Subscriber, w int64, ids ...string) *task {
	t := &task{lease: &lease{}, work: &job.Work{JobID: "j"}, cost: w, raw: w}
	for _, id := range ids {
		t.work.Items = append(t.work.Items, job.Item{ID: id})
	}
	t.hold = s.newHold(need{weight: w}, w)
	return t
}

// acquired starts acquiring w of s's admission and returns a channel that
// closes once it has it.
func acquired(t *testing.T, s *Subscriber, w int64) <-chan struct{} {
	got := make(chan struct{})
	go func() {
		if s.adm.acquire(t.Context(), w) != nil {
			return // the test ended first
		}
		close(got)
	}()
	return got
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// A message of a model server's requests gives back each item's share of
// its admission as the item's answer arrives, by the items' own costs: the
// next message is admitted into it while the message's last request still
// runs, as the server's cache is free of the others.
func TestItemAnswersGiveBackTheirShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := holdSubscriber(t, 100)
		s.cfg.Backend = itemwiseModel{InProcess: backend.InProcess{Model: &testModel{}}, costs: map[string]int64{"a": 40, "b": 60}}
		if !s.adm.tryAcquire(100) {
			t.Fatal("no room")
		}
		msg := itemTask(s, 100, "a", "b")
		next := acquired(t, s, 40)
		synctest.Wait()
		if isClosed(next) {
			t.Fatal("admitted past the budget")
		}
		ctx, wait := s.watchItems(t.Context(), []*task{msg})
		told := gpu.Answers(ctx)
		if told == nil {
			t.Fatal("no answers hook for an itemwise model")
		}
		told(0, job.Output{ID: "a", Response: &job.Response{StatusCode: 200}})
		synctest.Wait()
		if !isClosed(next) {
			t.Fatalf("item a answered and the next message not admitted: the message holds %d", msg.hold.held())
		}
		if got := msg.hold.held(); got != 60 {
			t.Errorf("the message holds %d after item a's answer; want b's 60", got)
		}
		told(1, job.Output{ID: "wrong", Response: &job.Response{StatusCode: 200}})
		if got := msg.hold.held(); got != 60 {
			t.Errorf("an answer for no item of the message gave back %d", 60-got)
		}
		told(1, job.Output{ID: "b", Response: &job.Response{StatusCode: 200}})
		wait()
		if got := msg.hold.held(); got != 0 || s.inflight.Load() != 0 {
			t.Errorf("holds %d, %d bytes in flight after every answer; want 0, 0", got, s.inflight.Load())
		}
		msg.hold.release()
		s.adm.giveBack(40)
		if err := unreleased(s); err != nil {
			t.Fatal(err)
		}
	})
}

// A model that is not itemwise (a batch on a device holds its memory until
// it ends) keeps its hold whole until the batch returns.
func TestBatchModelKeepsItsHold(t *testing.T) {
	s := holdSubscriber(t, 100)
	s.cfg.Backend = backend.InProcess{Model: &testModel{}}
	if !s.adm.tryAcquire(100) {
		t.Fatal("no room")
	}
	msg := itemTask(s, 100, "a", "b")
	ctx, _ := s.watchItems(t.Context(), []*task{msg})
	if gpu.Answers(ctx) != nil {
		t.Fatal("an answers hook without an itemwise model or an answer store")
	}
	msg.hold.release()
	if err := unreleased(s); err != nil {
		t.Fatal(err)
	}
}

// A message run in parts holds each part's weight while it runs, not its
// largest part's throughout: the excess goes back before a small part, and
// a part larger than what is left waits for its whole weight, holding
// nothing meanwhile.
func TestPartsHoldTheirOwnWeight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := holdSubscriber(t, 100)
		s.cfg.Backend = itemwiseModel{InProcess: backend.InProcess{Model: &testModel{}}, costs: map[string]int64{"a": 20, "b": 10, "c": 70}}
		if !s.adm.tryAcquire(70) {
			t.Fatal("no room")
		}
		msg := itemTask(s, 70, "a", "b", "c") // its largest part is c's
		if err := s.fitPart(t.Context(), msg, msg.work.Items[0:2], false); err != nil {
			t.Fatal(err)
		}
		if got := msg.hold.held(); got != 30 || s.adm.held.Load() != 30 {
			t.Fatalf("the message holds %d (admission %d) for its first part; want the part's 30", got, s.adm.held.Load())
		}
		if !s.adm.tryAcquire(50) { // another message
			t.Fatal("the first part's excess was not given back")
		}
		fitted := make(chan error, 1)
		go func() { fitted <- s.fitPart(t.Context(), msg, msg.work.Items[2:3], false) }()
		synctest.Wait()
		if len(fitted) != 0 {
			t.Fatal("the second part ran past the budget")
		}
		if got := msg.hold.held(); got != 0 {
			t.Fatalf("the message holds %d while it waits for its next part's weight; want 0", got)
		}
		s.adm.giveBack(50)
		if err := <-fitted; err != nil {
			t.Fatal(err)
		}
		if got := msg.hold.held(); got != 70 {
			t.Fatalf("the message holds %d for its second part; want its 70", got)
		}
		msg.hold.release()
		if err := unreleased(s); err != nil {
			t.Fatal(err)
		}
	})
}

// The parts of an itemwise model's message are at most an eighth of the
// largest budget, so that a part waiting for its weight does not hold the
// pool half empty; another model's parts are as large as the budget.
func TestItemwisePartsAreSmall(t *testing.T) {
	s := holdSubscriber(t, 800)
	s.cfg.Backend = backend.InProcess{Model: &testModel{}}
	if !s.fitsPart(800) || s.fitsPart(801) {
		t.Errorf("a batch model's parts: want up to the budget, 800")
	}
	s.cfg.Backend = itemwiseModel{InProcess: backend.InProcess{Model: &testModel{}}}
	if !s.fitsPart(100) || s.fitsPart(101) {
		t.Errorf("an itemwise model's parts: want up to an eighth of the budget, 100")
	}
	count, err := newAdmission(AdmitCount, 16, 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(count.close)
	s.adm = count
	if !s.fitsPart(1 << 30) {
		t.Errorf("under count admission a message of any cost runs whole")
	}
}
