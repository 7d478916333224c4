package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
)

// EventSink sends a job's completion event (docs/events.md): an SNS topic in
// production (package subscriber/snsevents). body is ev's JSON. Publish must
// be safe for concurrent use; an error means the event may not have gone
// out.
type EventSink interface {
	Publish(ctx context.Context, ev *job.CompletionEvent, body []byte) error
}

// Lister lists the keys under a prefix of the payload bucket. Completion
// events need it to count a job's settled chunks; *payload.Store has it.
type Lister interface {
	List(ctx context.Context, prefix string) ([]string, error)
}

var _ Lister = (*payload.Store)(nil)

// A job's completion event goes out once per revision, whichever subscriber
// settles its last chunk and however often that chunk is redelivered:
//
//  1. After a chunk's result, failed marker or cancelled marker is stored,
//     the job is checked (jobSettling). A subscriber runs one check of a
//     job at a time; triggers that come while one runs make one more run
//     after it. Checks of all jobs share settleSlots, and a check's
//     timeout starts once it has its slot. A check that fails is tried
//     again after a backoff, settleTries times in all.
//  2. A check first asks whether the job's witness, a chunk the last count
//     found pending, is still pending (a List of its three keys): if so,
//     the job is not settled, and the check ends there. Otherwise it counts
//     the job (a List of results/, failed/ and cancelled/, job.Settle) and,
//     with chunks pending, picks a new witness at random among them. A job
//     of n chunks is thus counted about ln n times, not n times.
//  3. A settled job's event is written to done/{job_id}.json with a
//     conditional write first (Payloads.Create, If-None-Match on S3), read
//     only when that is refused: of every subscriber and redelivery that
//     finds the job settled, exactly one creates the marker, and only that
//     one publishes.
//  4. A check that finds the marker compares its own count with it: when
//     its count sees more (job.CompletionEvent.Supersedes: a result stored
//     after its chunk was dead-lettered, say), it writes revision 2 to
//     done/{job_id}.2.json the same way, and publishes that if it created
//     it; and so on for later revisions.
//  5. When a publish fails, the winner rewrites that revision's marker with
//     publish_error set and the check fails, so it is tried again; a check
//     that finds such a marker publishes it again. That edge is at least
//     once: two checks that find the same failed marker at once may both
//     send. A winner that crashes between the marker and the publish
//     leaves a marker without publish_error, and no event: that edge is at
//     most once, and the marker says the job settled.
func (s *Subscriber) jobSettling(jobID string) {
	if s.settle == nil || !job.ValidJobID(jobID) {
		return
	}
	s.settle.trigger(jobID)
}

// Settlement checks: see jobSettling.
const (
	// settleSlots bounds the checks of one subscriber in flight at once,
	// across jobs.
	settleSlots = 8
	// settleTries bounds the tries of one check; the backoff between them
	// is settleRetry's, about eight minutes in all.
	settleTries = 10
	// maxSettleJobs bounds the jobs whose manifest and witness a subscriber
	// keeps, and so the checks running or waiting to retry; forgetting one
	// costs a read and a count at its next check.
	maxSettleJobs = 4096
)

// settleRetry is the backoff between the tries of one check.
var settleRetry = backoff.Policy{First: time.Second, Max: 2 * time.Minute, Jitter: backoff.Equal}

// settler runs the settlement checks of one subscriber.
type settler struct {
	s     *Subscriber
	slots chan struct{}
	stop  chan struct{} // closed at shutdown: backoffs end, each check gets one more try
	wg    sync.WaitGroup

	mu     sync.Mutex
	jobs   map[string]*jobSettle
	closed bool
}

// jobSettle is what a subscriber knows of one job's settlement.
type jobSettle struct {
	// Guarded by settler.mu.
	running bool // a goroutine runs the job's checks
	again   bool // triggered since that goroutine's last try began

	// Owned by the goroutine that runs the job's checks.
	m       *job.Manifest
	witness int // a chunk the last count found pending; -1 when none is known
}

func newSettler(s *Subscriber) *settler {
	return &settler{s: s, slots: make(chan struct{}, settleSlots), stop: make(chan struct{}), jobs: map[string]*jobSettle{}}
}

// trigger asks for a check of jobID: a new one, or one more after the one
// running.
func (st *settler) trigger(jobID string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		// Nothing settles chunks after shutdown has drained the runners
		// and the outbox; say so if that ever changes.
		st.s.log.Warn("a job settled after shutdown began; its completion event waits for a redelivery", "job_id", jobID)
		return
	}
	j := st.jobs[jobID]
	if j == nil {
		st.evict()
		if len(st.jobs) >= maxSettleJobs {
			// Every job kept has a check running or retrying: the bound
			// on goroutines holds, whatever a sender of forged job ids
			// does. A redelivery of one of this job's chunks checks again.
			st.s.m.events.WithLabelValues("dropped").Inc()
			st.s.log.Warn("too many jobs being checked; this check is dropped", "job_id", jobID, "jobs", len(st.jobs))
			return
		}
		j = &jobSettle{witness: -1}
		st.jobs[jobID] = j
	}
	if j.running {
		j.again = true
		return
	}
	j.running = true
	st.wg.Go(func() { st.run(jobID, j) })
}

// evict makes room for one more job, forgetting jobs no check runs for.
// Called with mu held.
func (st *settler) evict() {
	if len(st.jobs) < maxSettleJobs {
		return
	}
	for id, j := range st.jobs {
		if !j.running {
			delete(st.jobs, id)
			if len(st.jobs) < maxSettleJobs*3/4 {
				return
			}
		}
	}
}

// run checks jobID until a check succeeds with no trigger since it began,
// or its tries are spent.
func (st *settler) run(jobID string, j *jobSettle) {
	tries := 0
	final := false
	for {
		st.mu.Lock()
		j.again = false
		st.mu.Unlock()
		tries++
		err := st.try(jobID, j)
		if err != nil {
			st.s.m.events.WithLabelValues("error").Inc()
			if tries >= settleTries || final {
				st.s.m.events.WithLabelValues("dropped").Inc()
				st.s.log.Error("checking whether a job settled failed; giving up until a redelivery of its chunks",
					"job_id", jobID, "tries", tries, "err", err)
				st.done(jobID, j)
				return
			}
			wait := settleRetry.Delay(tries)
			st.s.log.Warn("checking whether a job settled failed; trying again", "job_id", jobID, "try", tries,
				"retry_in", wait, "err", err)
			select {
			case <-time.After(wait):
			case <-st.stop:
				final = true
			}
			continue
		}
		st.mu.Lock()
		if !j.again {
			j.running = false
			st.mu.Unlock()
			return
		}
		st.mu.Unlock()
		tries = 0
	}
}

func (st *settler) done(jobID string, j *jobSettle) {
	st.mu.Lock()
	defer st.mu.Unlock()
	j.running = false
	if j.again {
		// A trigger came during the last backoff: that is a new check.
		j.again = false
		if !st.closed {
			j.running = true
			st.wg.Go(func() { st.run(jobID, j) })
		}
	}
}

// try is one check of jobID, in a slot, with its own timeout.
func (st *settler) try(jobID string, j *jobSettle) error {
	st.slots <- struct{}{}
	defer func() { <-st.slots }()
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	return st.s.checkSettled(ctx, jobID, j)
}

// close lets running checks end: a check waiting out a backoff tries once
// more at once and, failing, gives up. Later triggers are dropped.
func (st *settler) close() {
	st.mu.Lock()
	st.closed = true
	st.mu.Unlock()
	close(st.stop)
	st.wg.Wait()
}

// checkSettled checks jobID once (steps 2 to 5 of jobSettling), with what
// j knows of it; j must be the caller's alone.
func (s *Subscriber) checkSettled(ctx context.Context, jobID string, j *jobSettle) error {
	if j.m == nil {
		raw, err := s.payloads.Read(ctx, job.ManifestKey(jobID))
		if errors.Is(err, payload.ErrMissing) {
			return nil // a message naming no job the publisher made
		}
		if err != nil {
			return err
		}
		var m job.Manifest
		if err := json.Unmarshal(raw, &m); err != nil || m.JobID != jobID || m.Chunks < 1 {
			return fmt.Errorf("manifest of %s does not parse: %v", jobID, err)
		}
		j.m = &m
	}
	m := j.m
	if j.witness >= 0 {
		settled, err := s.chunkSettled(ctx, jobID, j.witness)
		if err != nil || !settled {
			return err
		}
	}
	t, err := s.tally(ctx, m)
	if err != nil {
		return err
	}
	if !t.Settled() {
		pending := t.PendingChunks()
		j.witness = pending[rand.N(len(pending))]
		return nil
	}
	j.witness = -1
	itemsDone, itemsFailed, err := s.countItems(ctx, m, t)
	if err != nil {
		return err
	}
	bucket := s.payloads.Bucket()
	ev := &job.CompletionEvent{V: job.Version, Event: job.EventJobSettled, JobID: jobID, BatchID: job.BatchOf(jobID), Status: t.Status(false),
		Chunks: m.Chunks, ChunksDone: len(t.Done), ChunksFailed: len(t.Failed), ChunksCancelled: len(t.Cancelled),
		Items: m.Items, ItemsDone: itemsDone, ItemsFailed: itemsFailed,
		ResultsURI: "s3://" + bucket + "/" + job.ResultPrefix(jobID),
		FailedURI:  "s3://" + bucket + "/" + job.FailedPrefix(jobID),
		At:         time.Now().UTC().Format(time.RFC3339)}
	return s.sendEvent(ctx, ev)
}

// chunkSettled reports whether chunk c of jobID has a result, a failed
// marker or a cancelled marker: a List of each key, so that a missing one
// is an empty answer whatever the role may read (a GET of it may be 403).
func (s *Subscriber) chunkSettled(ctx context.Context, jobID string, c int) (bool, error) {
	ls := s.cfg.Payloads.(Lister) // checked by Config.validate
	for _, key := range []string{job.ResultKey(jobID, c), job.FailedKey(jobID, c), job.CancelledKey(jobID, c)} {
		keys, err := ls.List(ctx, key)
		s.m.payloadRequests.WithLabelValues("list", outcomeOf(err)).Inc()
		if err != nil {
			return false, err
		}
		for _, k := range keys {
			if k == key {
				return true, nil
			}
		}
	}
	return false, nil
}

// tally lists the job's results, failed and cancelled markers and applies
// the settlement rule (job.Settle), as GET /v1/jobs/{id} does.
func (s *Subscriber) tally(ctx context.Context, m *job.Manifest) (job.Tally, error) {
	prefixes := []string{job.ResultPrefix(m.JobID), job.FailedPrefix(m.JobID), job.CancelledPrefix(m.JobID)}
	sets := make([]map[int]bool, len(prefixes))
	g, gctx := errgroup.WithContext(ctx)
	for i, p := range prefixes {
		g.Go(func() (err error) { sets[i], err = s.chunksUnder(gctx, p, m.Chunks); return err })
	}
	if err := g.Wait(); err != nil {
		return job.Tally{}, err
	}
	return job.Settle(m.Chunks, sets[0], sets[1], sets[2]), nil
}

func (s *Subscriber) chunksUnder(ctx context.Context, prefix string, chunks int) (map[int]bool, error) {
	keys, err := s.cfg.Payloads.(Lister).List(ctx, prefix)
	s.m.payloadRequests.WithLabelValues("list", outcomeOf(err)).Inc()
	if err != nil {
		return nil, err
	}
	return job.ChunkSet(prefix, keys, chunks), nil
}

// eventReads bounds the item-error marker reads of one check in flight.
const eventReads = 8

// countItems counts the items of t's done chunks, done and refused, from
// their item-error markers (job.ItemsFailedOf, Tally.Items), as GET does.
func (s *Subscriber) countItems(ctx context.Context, m *job.Manifest, t job.Tally) (done, failed int, err error) {
	marked, err := s.chunksUnder(ctx, job.ItemErrorsPrefix(m.JobID), m.Chunks)
	if err != nil {
		return 0, 0, err
	}
	var mu sync.Mutex
	counts := map[int]int{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(eventReads)
	for c := range marked {
		if !t.Done[c] {
			continue
		}
		g.Go(func() error {
			raw, err := s.payloads.Read(gctx, job.ItemErrorsKey(m.JobID, c))
			if err != nil {
				return err
			}
			mu.Lock()
			counts[c] = job.ItemsFailedOf(m, c, raw)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, 0, err
	}
	done, failed = t.Items(m, counts)
	return done, failed, nil
}

// sendEvent writes ev as the first revision of its job's done marker that
// none has written yet and that it supersedes, and publishes it; or, when
// an earlier revision says its publish failed, publishes that one again.
// It ends at the first revision ev does not supersede.
func (s *Subscriber) sendEvent(ctx context.Context, ev *job.CompletionEvent) error {
	for rev := 1; ; rev++ {
		ev.Revision = rev
		body, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		key := job.DoneRevisionKey(ev.JobID, rev)
		created, existing, err := s.payloads.Create(ctx, key, body)
		if err != nil {
			return err
		}
		if created {
			return s.publish(ctx, key, ev, body, false)
		}
		var old job.CompletionEvent
		if json.Unmarshal(existing, &old) != nil || old.JobID != ev.JobID {
			// Not a marker this code writes: the revision is taken all
			// the same, and the next one is compared with nothing.
			s.log.Warn("a done marker does not parse; skipped", "key", key, "bytes", len(existing))
			continue
		}
		if old.PublishError != "" {
			old.PublishError = ""
			b, err := json.Marshal(&old) // the retry sends the revision as first found
			if err != nil {
				return err
			}
			if err := s.publish(ctx, key, &old, b, true); err != nil {
				return err
			}
		}
		if !ev.Supersedes(&old) {
			return nil
		}
	}
}

// publish sends ev, whose body is stored at key, and records there a
// failed publish, so that a later check sends it again. retry says the
// marker at key has publish_error set, which a successful publish clears.
func (s *Subscriber) publish(ctx context.Context, key string, ev *job.CompletionEvent, body []byte, retry bool) error {
	if err := s.cfg.Events.Publish(ctx, ev, body); err != nil {
		failed := *ev
		failed.PublishError = err.Error()
		if marker, merr := json.Marshal(&failed); merr == nil {
			if _, perr := s.payloads.Put(ctx, key, marker); perr != nil {
				err = errors.Join(err, perr)
			}
		}
		return fmt.Errorf("publishing the completion event: %w", err)
	}
	if retry {
		// The retry went out: clear the error so that no later check
		// sends again.
		if _, err := s.payloads.Put(ctx, key, body); err != nil {
			s.log.Warn("clearing publish_error on the done marker failed", "key", key, "err", err)
		}
	}
	outcome := "sent"
	if ev.Revision > 1 {
		outcome = "corrected"
	}
	s.m.events.WithLabelValues(outcome).Inc()
	s.log.Info("completion event sent", "job_id", ev.JobID, "revision", ev.Revision, "status", ev.Status,
		"chunks_done", ev.ChunksDone, "items_failed", ev.ItemsFailed)
	return nil
}

func outcomeOf(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
