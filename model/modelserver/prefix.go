package modelserver

import (
	"context"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// prefixOrder decides which of the requests waiting for a place in flight
// takes the next one: the oldest of the warmest prefix group (job.PrefixKey;
// warmth), the one with the most requests in flight, so that the server's
// prefix cache still holds its blocks and sends fewer groups at once; the
// oldest when none is warm. A
// server whose KV pool cannot hold every prefix at once evicts one group's
// blocks for another's when their requests are sent interleaved, and
// prefills each prompt whole again.
//
// Fairness: a request passed over prefixPassMax times goes next whatever
// its key, so no item, whatever its tenant, waits behind another group for
// more than that many requests. The requests it orders were admitted
// already (the subscriber's fairness chose them); the order only moves
// them by that bound.
//
// One request at a time holds the turn, waiting for the concurrency bound;
// the others wait here, where the choice among them can still be made.
type prefixOrder struct {
	mu       sync.Mutex
	waiting  []*prefixTurn // in the order they came
	busy     bool          // a turn was given and not yet passed on
	inflight map[string]int
	last     string
	seen     map[string]struct{} // keys met, for groups; cleared past prefixSeenMax

	groups, warm prometheus.Counter
}

const (
	prefixPassMax = 32
	// prefixSeenMax bounds the keys remembered for the groups counter: a
	// group met again after the set was cleared counts again.
	prefixSeenMax = 4096
)

type prefixTurn struct {
	key    string
	passed int
	ready  chan struct{}
}

func newPrefixOrder() *prefixOrder {
	return &prefixOrder{
		inflight: map[string]int{},
		seen:     map[string]struct{}{},
		groups: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vramq_subscriber_model_server_prefix_groups_total",
			Help: "Prefix groups (requests sharing a system prompt or leading part) met by the model-server backend.",
		}),
		warm: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vramq_subscriber_model_server_prefix_warm_requests_total",
			Help: "Requests sent while another of their prefix group was in flight or had just been sent.",
		}),
	}
}

// wait returns when the request of key has the turn, or with ctx's error.
// Whoever has the turn passes it on (pass) once the concurrency bound let
// it in or it gave up.
func (o *prefixOrder) wait(ctx context.Context, key string) error {
	t := &prefixTurn{key: key, ready: make(chan struct{})}
	o.mu.Lock()
	o.waiting = append(o.waiting, t)
	o.next()
	o.mu.Unlock()
	select {
	case <-t.ready:
		return nil
	case <-ctx.Done():
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-t.ready: // given the turn as ctx ended: it goes on
		o.busy = false
		o.next()
	default:
		o.waiting = slices.DeleteFunc(o.waiting, func(w *prefixTurn) bool { return w == t })
	}
	return ctx.Err()
}

// pass gives the turn to the next request.
func (o *prefixOrder) pass() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.busy = false
	o.next()
}

// next gives the turn, if it is free, to the request to send next. o.mu is
// held.
func (o *prefixOrder) next() {
	if o.busy || len(o.waiting) == 0 {
		return
	}
	pick, best := 0, 0
	if o.waiting[0].passed < prefixPassMax {
		for i, t := range o.waiting {
			if w := o.warmth(t.key); w > best {
				pick, best = i, w
			}
		}
	}
	for _, t := range o.waiting[:pick] {
		t.passed++
	}
	t := o.waiting[pick]
	o.waiting = slices.Delete(o.waiting, pick, pick+1)
	o.busy = true
	close(t.ready)
}

func (o *prefixOrder) isWarm(key string) bool { return o.warmth(key) > 0 }

// warmth ranks key's group: by its requests in flight, the more the
// likelier the server keeps its blocks; the group sent last counts one
// more. 0: cold.
func (o *prefixOrder) warmth(key string) int {
	if key == "" {
		return 0
	}
	w := o.inflight[key]
	if key == o.last {
		w++
	}
	return w
}

// sending counts a request of key going out; sent, its answer back.
func (o *prefixOrder) sending(key string) {
	if key == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.isWarm(key) {
		o.warm.Inc()
	}
	if _, ok := o.seen[key]; !ok {
		if len(o.seen) >= prefixSeenMax {
			clear(o.seen)
		}
		o.seen[key] = struct{}{}
		o.groups.Inc()
	}
	o.inflight[key]++
	o.last = key
}

func (o *prefixOrder) sent(key string) {
	if key == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.inflight[key]--; o.inflight[key] <= 0 {
		delete(o.inflight, key)
	}
}
