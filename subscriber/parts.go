package subscriber

import (
	"fmt"

	"github.com/vramq/vramq/job"
)

// part is a run of a message's items, [lo, hi), that runs as one batch; or,
// with err set, one item too large to run at all, answered with err.
type part struct {
	lo, hi int
	err    *job.ItemError
}

// cutParts plans a message of several items whose estimate together,
// cost, exceeds the largest budget the device can give: a chunk of 100
// texts estimated at 237 MiB against a 179 MiB budget, each text fitting
// on its own, is no reason to dead-letter it. It halves the items until
// each run of them fits that budget, so the parts come out about even
// (none below half of what fits, when the items weigh alike) and the
// message weighs in admission no more than its largest part, of which it
// runs one at a time; then it joins neighbours whose estimate together is
// no more than that, so that an uneven message does not run in needless
// small parts. An item that alone exceeds the budget is the only thing
// too large, and becomes a part of its own with an item error
// (job.ItemTooLarge), as an item the model refuses does: the others run.
//
// It returns the parts in item order and the largest estimate among those
// that run; no parts when no item fits (the message is too large as a
// whole, and dead-lettered so). err is the model's, from Cost.
func (s *Subscriber) cutParts(endpoint string, items []job.Item, cost int64) (parts []part, largest int64, err error) {
	var cut func(lo, hi int, cost int64) error
	cut = func(lo, hi int, cost int64) error {
		if s.fitsPart(cost) || (hi-lo == 1 && s.adm.fits(cost)) {
			parts = append(parts, part{lo: lo, hi: hi})
			largest = max(largest, cost)
			return nil
		}
		if hi-lo == 1 {
			parts = append(parts, part{lo: lo, hi: hi, err: job.NewItemError(job.ItemTooLarge, fmt.Sprintf(
				"estimated working memory %s exceeds the largest VRAM budget the device can give, %s",
				s.amount(cost), s.amount(s.adm.size)))})
			return nil
		}
		mid := lo + (hi-lo)/2
		for _, h := range [][2]int{{lo, mid}, {mid, hi}} {
			c, err := s.modelCost(endpoint, items[h[0]:h[1]])
			if err != nil {
				return err
			}
			if err := cut(h[0], h[1], c); err != nil {
				return err
			}
		}
		return nil
	}
	if err := cut(0, len(items), cost); err != nil {
		return nil, 0, err
	}
	if !hasRunnable(parts) {
		return nil, 0, nil
	}
	joined := parts[:1]
	for _, p := range parts[1:] {
		last := &joined[len(joined)-1]
		if p.err == nil && last.err == nil {
			c, err := s.modelCost(endpoint, items[last.lo:p.hi])
			if err != nil {
				return nil, 0, err
			}
			if c <= largest {
				last.hi = p.hi
				continue
			}
		}
		joined = append(joined, p)
	}
	return joined, largest, nil
}

func hasRunnable(parts []part) bool {
	for _, p := range parts {
		if p.err == nil {
			return true
		}
	}
	return false
}
