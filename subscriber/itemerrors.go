package subscriber

import (
	"context"
	"errors"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// itemByItem is for a message the model refused on its own
// (gpu.ErrInvalidInput, refused), when it holds more than one item: one bad
// item (binary data for a text model, too many tokens) must not cost the
// chunk. It runs the items one at a time, at most len(items) runs, each with
// what t holds in admission (an item weighs no more than its message), and
// returns the message's outputs with, for each item the model refuses, an
// error instead of an answer (job.ItemError).
//
// When every item is refused it returns refused, and the message is
// dead-lettered as before: there is nothing to keep. When an item's run
// fails otherwise (a timeout, out of memory, a lost device) it returns that
// error, and the caller ends the message as it would for a batch that failed
// so.
func (s *Subscriber) itemByItem(ctx context.Context, t *task, refused error) ([][]job.Output, error) {
	items := t.work.Items
	s.log.Warn("message refused by the model; running its items one at a time", "message_id", t.lease.msg.ID,
		"items", len(items), "err", refused)
	outs := make([]job.Output, len(items))
	bad := 0
	for i, it := range items {
		// The item's run holds t's admission: when it outlives its timeout,
		// infer hands what it holds to the goroutine that waits for the
		// model, and t, released, must not give it back early.
		one := &task{lease: t.lease, work: &job.Work{V: t.work.V, JobID: t.work.JobID, Chunk: t.work.Chunk,
			Items: []job.Item{it}}, cost: t.cost, raw: t.raw, factor: t.factor, class: t.class, weight: t.weight}
		t.weight = 0
		got, err := s.infer(ctx, []*task{one}, false)
		t.weight = one.weight
		switch {
		case err == nil:
			outs[i] = got[0][0]
		case errors.Is(err, gpu.ErrInvalidInput):
			bad++
			outs[i] = job.Output{ID: it.ID, Error: job.NewItemError(job.ItemInvalidInput, err.Error())}
		default:
			return nil, err
		}
	}
	if bad == len(items) {
		return nil, refused
	}
	s.m.itemsFailed.Add(float64(bad))
	s.log.Warn("message's refused items answered with errors; the others ran", "message_id", t.lease.msg.ID,
		"items", len(items), "refused", bad)
	return [][]job.Output{outs}, nil
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
