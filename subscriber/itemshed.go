package subscriber

import (
	"context"
	"sync"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

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
// the answer store keeps it (answerstore.go), and an itemwise model's item
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
