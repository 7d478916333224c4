package subscriber

import (
	"testing"
	"testing/synctest"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
)

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
