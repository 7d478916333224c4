package subscriber

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
)

// runOne runs one message as a batch of its own (in a batch of one, or
// alone with the whole device) and returns its outputs. A message too large
// to run whole runs in its parts (admit.go), one after another, each with
// what t holds in admission. An item the model refuses (fault.ErrInvalidInput)
// must not cost the chunk: the items of a refused run are searched by
// halving (isolate), and each item the model refuses alone is answered with
// an error instead of an answer (job.ItemError); so is an item too large to
// run at all.
//
// When no item has an answer (every item refused or too large), it returns
// the refusal, and the message is dead-lettered: there is nothing to keep.
// When a run fails otherwise (a timeout, out of memory, a lost device) it
// returns that error, and the caller ends the message as it would for a
// batch that failed so; a message run in parts is then run again whole.
func (s *Subscriber) runOne(ctx context.Context, t *task, alone bool) ([][]job.Output, error) {
	items := t.work.Items
	if t.parts == nil {
		outs, err := s.infer(ctx, []*task{t}, alone)
		if err == nil || len(items) == 1 || !errors.Is(err, fault.ErrInvalidInput) {
			return outs, err
		}
		return s.isolate(ctx, t, make([]job.Output, len(items)), []span{{lo: 0, hi: len(items), err: err}}, alone)
	}
	outs := make([]job.Output, len(items))
	var refused []span
	for _, p := range t.parts {
		if p.err != nil {
			outs[p.lo] = job.Output{ID: items[p.lo].ID, Error: p.err}
			continue
		}
		got, err := s.inferPart(ctx, t, p, alone)
		switch {
		case err == nil:
			copy(outs[p.lo:], got)
		case errors.Is(err, fault.ErrInvalidInput):
			refused = append(refused, span{lo: p.lo, hi: p.hi, err: err})
		default:
			return nil, err
		}
	}
	return s.isolate(ctx, t, outs, refused, alone)
}

// span is a run of a message's items, [lo, hi), in the search for the ones
// the model refuses. err is the refusal of a run that held them: their own
// run's, or, when implied, an enclosing run's.
type span struct {
	lo, hi  int
	err     error
	implied bool // not run itself: refused as a whole, its first half not (see isolate)
}

// isolationRuns bounds the runs isolate makes for a message of n items:
// 16 per bit of n. A full bisection of n items takes at most 2n−2 runs, so a
// chunk of up to 32 items (the publisher's default) is always searched to
// the end, whatever it holds; one refused item among n costs at most
// 2⌈log₂ n⌉ runs, and about ten refused items spread through a chunk of
// 1,000 are all found within its 160, more when they sit together. Without a bound, a chunk of 1,000
// items with every other one refused would hold the device for about 2,000
// runs.
func isolationRuns(n int) int { return 16 * bits.Len(uint(n)) }

// isolate finds the items the model refuses among the refused spans of t's
// items, by halving: a span's first half runs; when it is refused too the
// second runs as well, and when it is not the second is refused for it
// (implied) and halved in turn. A refused item therefore costs about one
// run per level, ⌈log₂ n⌉ levels for n items, where a run per item cost n.
// The spans are searched a level at a time, so when the search reaches its
// bound (isolationRuns) what is left are the smallest groups still refused;
// their items are answered with an error that says so, since the model did
// refuse a group holding them, and the items of every group that ran keep
// their answers. Each run holds what t holds in admission: a span weighs no
// more than its message, or its part.
//
// outs holds the answers known so far; it returns them, for each refused
// item an error, or an error as runOne does.
func (s *Subscriber) isolate(ctx context.Context, t *task, outs []job.Output, refused []span, alone bool) ([][]job.Output, error) {
	items := t.work.Items
	if len(refused) > 0 {
		s.log.Warn("message refused by the model; searching its items for the refused ones", "message_id", t.lease.msg.ID,
			"items", len(items), "refused_spans", len(refused), "err", refused[0].err)
	}
	bound := isolationRuns(len(items))
	runs := 0
	// try runs items [lo, hi) and answers them; refusal is the model's
	// refusal of them, err any other failure.
	try := func(lo, hi int) (refusal, err error) {
		runs++
		got, err := s.inferItems(ctx, t, lo, hi, alone)
		switch {
		case err == nil:
			copy(outs[lo:], got)
			return nil, nil
		case errors.Is(err, fault.ErrInvalidInput):
			return err, nil
		}
		return nil, err
	}
	queue := slices.Clone(refused)
	for len(queue) > 0 {
		sp := queue[0]
		n := sp.hi - sp.lo
		if n == 1 && !sp.implied {
			queue = queue[1:]
			outs[sp.lo] = job.Output{ID: items[sp.lo].ID, Error: job.NewItemError(job.ItemInvalidInput, sp.err.Error())}
			continue
		}
		if runs+min(n, 2) > bound {
			break
		}
		queue = queue[1:]
		if n == 1 { // implied: the item's own run gives its own error
			refusal, err := try(sp.lo, sp.hi)
			if err != nil {
				return nil, err
			}
			if refusal != nil {
				queue = append(queue, span{lo: sp.lo, hi: sp.hi, err: refusal})
			}
			continue
		}
		mid := sp.lo + n/2
		refusal, err := try(sp.lo, mid)
		if err != nil {
			return nil, err
		}
		if refusal == nil { // the refusal is in the second half
			queue = append(queue, span{lo: mid, hi: sp.hi, err: sp.err, implied: true})
			continue
		}
		queue = append(queue, span{lo: sp.lo, hi: mid, err: refusal})
		if refusal, err = try(mid, sp.hi); err != nil {
			return nil, err
		}
		if refusal != nil {
			queue = append(queue, span{lo: mid, hi: sp.hi, err: refusal})
		}
	}
	for _, sp := range queue {
		for i := sp.lo; i < sp.hi; i++ {
			outs[i] = job.Output{ID: items[i].ID, Error: job.NewItemError(job.ItemInvalidInput, fmt.Sprintf(
				"not run apart: the model refused a group of this chunk's items holding it, and the search for the "+
					"refused items stopped at its bound of %d runs: %v", bound, sp.err))}
		}
	}
	failed := itemsFailed(outs)
	if failed == len(outs) {
		if len(refused) > 0 {
			return nil, refused[0].err
		}
		return nil, fmt.Errorf("%w: every item of the message is too large to run", fault.ErrInvalidInput)
	}
	if failed > 0 {
		s.m.itemsFailed.Add(float64(failed))
		s.log.Warn("message's refused items answered with errors; the others ran", "message_id", t.lease.msg.ID,
			"items", len(items), "failed", failed, "search_runs", runs, "unsearched", len(queue))
	}
	return [][]job.Output{outs}, nil
}

// inferItems runs t's items [lo, hi) as a batch of their own, holding t's
// admission, and returns their outputs.
func (s *Subscriber) inferItems(ctx context.Context, t *task, lo, hi int, alone bool) ([]job.Output, error) {
	// The run shares t's hold: when it outlives its timeout, infer hands
	// the hold's weight to the goroutine that waits for the model, and t,
	// released, gives back only its bytes.
	sub := &task{lease: t.lease, work: &job.Work{V: t.work.V, JobID: t.work.JobID, Chunk: t.work.Chunk, Endpoint: t.work.Endpoint,
		Items: t.work.Items[lo:hi:hi]}, cost: t.cost, raw: t.raw, factor: t.factor, class: t.class, hold: t.hold, at: t.at, of: t}
	got, err := s.infer(ctx, []*task{sub}, alone)
	t.at = sub.at
	if err != nil {
		return nil, err
	}
	return got[0], nil
}

// itemsFailed counts the outputs that carry an error.
func itemsFailed(outs []job.Output) int {
	n := 0
	for _, o := range outs {
		if o.Error != nil {
			n++
		}
	}
	return n
}
