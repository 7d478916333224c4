package modelserver

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// concurrency bounds the requests in flight to the server. The bound starts
// at Config.MaxConcurrency and is halved by an overload answer (TGI's 429
// "Model is overloaded", a 503, a 529) or an out-of-memory one, as an OOM
// halves a batch, and grown back one step (+1 or +25%) after a run of clean
// answers while it was full, with the hysteresis the subscriber's learned
// batch limit has (subscriber/learned.go): a grown bound is confirmed by
// one clean answer at it; an overload before that puts it back and doubles
// the run the next step waits for, up to probeBackoffMax times.
//
// One overload halves the bound once: the answers of requests sent before
// that halving say nothing of the bound now, so only a request admitted
// since (epoch) halves it again.
const (
	concurrencyCleanRun = 32
	probeBackoffMax     = 64
)

type concurrency struct {
	log *slog.Logger

	mu        sync.Mutex
	limit     int
	max       int
	inflight  int
	epoch     int
	clean     int
	need      int
	probeFrom int // the bound before the step being tried; 0: none
	wake      chan struct{}
	ceiling   int // online.go's bound below limit; 0: none
}

func newConcurrency(n int, log *slog.Logger) *concurrency {
	return &concurrency{log: log, limit: n, max: n, need: concurrencyCleanRun, wake: make(chan struct{})}
}

// now is the bound on the requests in flight now: the limit, or the
// online-first ceiling when that is lower.
func (c *concurrency) now() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ceiling > 0 {
		return min(c.limit, c.ceiling)
	}
	return c.limit
}

// requestTime is the expected time of a request from its send to its
// answer: a moving average over the answered ones, each weighing
// 1/requestTimeWeight, so that it follows a server that slows down within
// a few dozen answers. Safe for concurrent use.
type requestTime struct {
	mu  sync.Mutex
	avg time.Duration
	n   int
}

const requestTimeWeight = 8

func (r *requestTime) observe(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n++; r.n == 1 {
		r.avg = d
		return
	}
	r.avg += (d - r.avg) / requestTimeWeight
}

// mean is the expected time; ok is false before any answer, or while it
// rounds to nothing.
func (r *requestTime) mean() (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.avg, r.n > 0 && r.avg > 0
}

// slot is one request's place in flight.
type slot struct {
	epoch int
	full  bool // it filled the bound: its clean answer says the bound holds
}

func (c *concurrency) acquire(ctx context.Context) (slot, error) {
	for {
		c.mu.Lock()
		if c.inflight < c.limit && (c.ceiling == 0 || c.inflight < c.ceiling) {
			c.inflight++
			s := slot{epoch: c.epoch, full: c.inflight == c.limit}
			c.mu.Unlock()
			return s, nil
		}
		ch := c.wake
		c.mu.Unlock()
		if err := sleep(ctx, -1, ch); err != nil {
			return slot{}, err
		}
	}
}

// setCeiling bounds the requests in flight to n as well (online-first
// mode); 0 lifts it.
func (c *concurrency) setCeiling(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ceiling = n
	close(c.wake)
	c.wake = make(chan struct{})
}

// release ends s: overloaded when its answer said the server had too many
// requests, clean when it answered as it should.
func (c *concurrency) release(s slot, overloaded, clean bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight--
	defer func() {
		close(c.wake)
		c.wake = make(chan struct{})
	}()
	switch {
	case overloaded && s.epoch == c.epoch:
		from := c.limit
		c.limit = max(1, c.limit/2)
		if c.probeFrom > 0 {
			c.limit = max(c.limit, min(c.probeFrom, from-1))
			c.need = min(c.need*2, concurrencyCleanRun*probeBackoffMax)
			c.probeFrom = 0
		}
		c.epoch++
		c.clean = 0
		c.log.Warn("model server overloaded: fewer requests in flight", "from", from, "to", c.limit, "next_raise_after", c.need)
	case clean && s.full:
		if c.probeFrom > 0 {
			c.probeFrom, c.need = 0, concurrencyCleanRun
		}
		if c.clean++; c.clean < c.need || c.limit >= c.max {
			return
		}
		c.probeFrom = c.limit
		c.limit = min(c.max, max(c.limit+1, c.limit*5/4))
		c.clean = 0
		c.epoch++
		c.log.Info("model server keeping up: more requests in flight", "from", c.probeFrom, "to", c.limit)
	}
}
