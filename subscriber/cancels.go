package subscriber

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
)

// cancels answers whether a job is cancelled (DELETE /v1/jobs/{id} wrote
// its job.CancelRecord), cheaply: the answer for a job is read from the
// bucket at most once per ttl, not once per message, and concurrent askers
// about one job share one read (singleflight). A job found cancelled stays
// so (the record is never removed), so only "not cancelled" expires; the
// table is bounded by maxEntries, expired answers going first.
//
// A read that fails counts as "not cancelled" for ttl: the chunk runs, as it
// would have before the cancel, and a bucket that is down costs one read
// per job per ttl, not one per message.
type cancels struct {
	read       func(ctx context.Context, key string) ([]byte, error)
	ttl        time.Duration
	maxEntries int
	now        func() time.Time
	log        *slog.Logger

	mu      sync.Mutex
	answers map[string]cancelAnswer
	reads   singleflight.Group
}

type cancelAnswer struct {
	cancelled bool
	until     time.Time // when a "no" expires; a "yes" never does
}

// maxCancelEntries bounds the cache: far more jobs than a subscriber sees
// in one ttl.
const maxCancelEntries = 4096

// cancelReadTimeout bounds one read of a cancel record.
const cancelReadTimeout = 5 * time.Second

func newCancels(read func(ctx context.Context, key string) ([]byte, error), ttl time.Duration, log *slog.Logger) *cancels {
	return &cancels{read: read, ttl: ttl, maxEntries: maxCancelEntries, now: time.Now, log: log,
		answers: map[string]cancelAnswer{}}
}

// cached is the answer for jobID when one is known and fresh, without any
// read.
func (c *cancels) cached(jobID string) (cancelled, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.answers[jobID]
	if !ok || (!a.cancelled && !c.now().Before(a.until)) {
		return false, false
	}
	return a.cancelled, true
}

// cancelled reports whether jobID is cancelled, from the cache or, when the
// cache has no fresh answer, from one read of its record.
func (c *cancels) cancelled(ctx context.Context, jobID string) bool {
	if yes, known := c.cached(jobID); known {
		return yes
	}
	v, _, _ := c.reads.Do(jobID, func() (any, error) {
		if yes, known := c.cached(jobID); known { // answered while this one waited
			return yes, nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelReadTimeout)
		defer cancel()
		_, err := c.read(rctx, job.CancelKey(jobID))
		yes := err == nil
		if err != nil && !errors.Is(err, payload.ErrMissing) {
			c.log.Warn("reading a job's cancel record failed; its chunks run", "job_id", jobID, "err", err, "retry_in", c.ttl)
		}
		c.store(jobID, yes)
		return yes, nil
	})
	return v.(bool)
}

func (c *cancels) store(jobID string, cancelled bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if _, ok := c.answers[jobID]; !ok && len(c.answers) >= c.maxEntries {
		for id, a := range c.answers {
			if !a.cancelled && !now.Before(a.until) {
				delete(c.answers, id)
			}
		}
		for id := range c.answers { // still full: any one goes (it is read again when needed)
			if len(c.answers) < c.maxEntries {
				break
			}
			delete(c.answers, id)
		}
	}
	c.answers[jobID] = cancelAnswer{cancelled: cancelled, until: now.Add(c.ttl)}
}
