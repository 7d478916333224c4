package subscriber

import (
	"slices"

	"github.com/vramq/vramq/job"
)

// A message that waits for the model (pause.go) stays in this process, so
// the answers a backoff came with for some of its items are kept on its task
// and only its other items are asked again when it runs after the wait: a
// model server's answer is paid for (tokens of a rate limit, a quota), and a
// chunk of 32 long generations that backs off after 31 would otherwise ask
// all 32 again, at every backoff. Its result is still written once, whole,
// in the order of its items. A message handed back, or redelivered after a
// process dies, finds them in the answer store instead (answerstore.go).
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
