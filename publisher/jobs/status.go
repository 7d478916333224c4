package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// Job states in GET /v1/jobs/{id}.
const (
	StatusRunning  = "running"  // some chunks have neither a result nor a failure yet
	StatusComplete = "complete" // every chunk has a result
	StatusPartial  = "partial"  // every chunk is settled, some failed
	// StatusCancelled: DELETE /v1/jobs/{id} asked for it before the job
	// finished. Chunks not yet run are deleted unrun as subscribers receive
	// them (chunks_cancelled), running ones finish; chunks_pending says how
	// many are not settled yet. A cancel that came too late to stop any
	// chunk leaves the job complete or partial.
	StatusCancelled = "cancelled"
)

// Paging of results in GET /v1/jobs/{id}, in chunks (a page is also cut by
// bytes: Config.MaxPageBytes).
const (
	DefaultPageSize = 10
	MaxPageSize     = 100
)

// Status is a job's progress: the answer to GET /v1/jobs/{id}, but its
// results.
type Status struct {
	JobID           string `json:"job_id"`
	Status          string `json:"status"`
	Chunks          int    `json:"chunks"`
	ChunksDone      int    `json:"chunks_done"`
	ChunksFailed    int    `json:"chunks_failed"`
	ChunksCancelled int    `json:"chunks_cancelled"`
	ChunksPending   int    `json:"chunks_pending"`
	Items           int    `json:"items"`
	ItemsDone       int    `json:"items_done"`
	// ItemsFailed: items of done chunks the model refused; their outputs
	// in results carry an error instead of an answer, and items_done does
	// not count them.
	ItemsFailed  int           `json:"items_failed"`
	ClaimChecked int           `json:"claim_checked"`
	CreatedAt    time.Time     `json:"created_at"`
	CancelledAt  *time.Time    `json:"cancelled_at,omitempty"` // when DELETE asked for it
	Failed       []FailedChunk `json:"failed"`
	// GET's answer goes on with results and next_page_token, written as
	// they are read (resultpage.go).

	done      map[int]bool // the chunks with a result
	cancelled map[int]bool // the chunks deleted unrun
}

type FailedChunk struct {
	Chunk  int    `json:"chunk"`
	Reason string `json:"reason"`
}

type chunkResult struct {
	Chunk   int          `json:"chunk"`
	Model   string       `json:"model"`
	Outputs []job.Output `json:"outputs"`
	// ItemsFailed counts the outputs with an error; absent when none.
	ItemsFailed int `json:"items_failed,omitempty"`
}

// maxItemErrorsMarker bounds the read of an item-error marker (tens of
// bytes when the subscriber wrote it).
const maxItemErrorsMarker = 4 << 10

// getJob is GET /v1/jobs/{id}: progress from the result, failure and
// cancelled markers the subscribers write, and, once every chunk is settled,
// the results, a page at a time, streamed (writePage).
func (p *Service) getJob(w http.ResponseWriter, r *http.Request) {
	ri := api.Info(r)
	m, fail := p.loadJob(w, r)
	if m == nil {
		return
	}
	pageSize, start, e := pageParams(r)
	if e != nil {
		fail(e)
		return
	}
	if start > 0 && start >= m.Chunks {
		fail(api.Err(http.StatusBadRequest, api.CodeInvalidParameter, "page_token is past the job's last chunk"))
		return
	}
	st, err := p.status(r.Context(), m)
	if err != nil {
		p.log.Error("reading job status", "job_id", ri.JobID, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the job's results could not be read"))
		return
	}
	if st.ChunksPending > 0 {
		api.WriteJSON(w, http.StatusOK, st)
		return
	}
	p.writePage(w, r, m, st, start, pageSize, fail)
}

// loadJob reads the manifest of the job r's path names, answering the
// request itself (and returning nil) when there is no bucket, no such job,
// or the manifest cannot be read. fail answers r with an error.
func (p *Service) loadJob(w http.ResponseWriter, r *http.Request) (m *job.Manifest, fail func(*api.Error)) {
	ri := api.Info(r)
	fail = func(e *api.Error) {
		ri.Code = e.Code
		api.WriteError(w, e)
	}
	if p.store == nil {
		fail(api.Err(http.StatusNotImplemented, api.CodeStatusUnavailable,
			"job status and cancel need a payload bucket, and this publisher has none (-payload-bucket)"))
		return nil, fail
	}
	id := r.PathValue("id")
	// Ids are checked before they reach an S3 key, so no path can be made
	// to name another object.
	if !validJobID(id) {
		fail(api.Err(http.StatusNotFound, api.CodeNotFound, "no such job"))
		return nil, fail
	}
	ri.JobID = id
	raw, err := p.store.Read(r.Context(), job.ManifestKey(id))
	if errors.Is(err, payload.ErrMissing) {
		fail(api.Err(http.StatusNotFound, api.CodeNotFound, "no such job"))
		return nil, fail
	}
	m = new(job.Manifest)
	if err == nil {
		err = json.Unmarshal(raw, m)
	}
	if err != nil {
		p.log.Error("reading a job manifest", "job_id", id, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the job's manifest could not be read"))
		return nil, fail
	}
	// Another tenant's job is answered as if it did not exist, so that an
	// id does not even tell a stranger that the job is there.
	if !p.gate.Owns(r, m.Owner) {
		fail(api.Err(http.StatusNotFound, api.CodeNotFound, "no such job"))
		return nil, fail
	}
	ri.Items, ri.Chunks = m.Items, m.Chunks
	return m, fail
}

func pageParams(r *http.Request) (size, start int, e *api.Error) {
	q := r.URL.Query()
	size = DefaultPageSize
	if s := q.Get("page_size"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxPageSize {
			return 0, 0, api.Err(http.StatusBadRequest, api.CodeInvalidParameter, "page_size must be a whole number from 1 to %d", MaxPageSize)
		}
		size = n
	}
	if s := q.Get("page_token"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return 0, 0, api.Err(http.StatusBadRequest, api.CodeInvalidParameter, "page_token is not one this API gave out")
		}
		start = n
	}
	return size, start, nil
}

// status is the job's progress.
func (p *Service) status(ctx context.Context, m *job.Manifest) (*Status, error) {
	var done, failedSet, cancelledSet, itemErrSet map[int]bool
	var cancel *job.CancelRecord
	g0, gctx0 := errgroup.WithContext(ctx)
	g0.Go(func() (err error) { done, err = p.chunksUnder(gctx0, job.ResultPrefix(m.JobID), m.Chunks); return })
	g0.Go(func() (err error) { failedSet, err = p.chunksUnder(gctx0, job.FailedPrefix(m.JobID), m.Chunks); return })
	g0.Go(func() (err error) {
		cancelledSet, err = p.chunksUnder(gctx0, job.CancelledPrefix(m.JobID), m.Chunks)
		return
	})
	g0.Go(func() (err error) { cancel, err = p.CancelRecord(gctx0, m.JobID); return })
	if err := g0.Wait(); err != nil {
		return nil, err
	}
	// The item-error markers after the results: a subscriber writes a
	// chunk's marker before its result (subscriber.storeResult), so every
	// result listed has its marker listed too; listed together, a result
	// written between the two lists was counted with every item done.
	if len(done) > 0 {
		var err error
		if itemErrSet, err = p.chunksUnder(ctx, job.ItemErrorsPrefix(m.JobID), m.Chunks); err != nil {
			return nil, err
		}
	}
	// The settlement rule is job's, the completion event's too: a result
	// wins over a failure, either over a cancelled marker (anyone who can
	// send to the queue can make a subscriber write one, for any chunk).
	tally := job.Settle(m.Chunks, done, failedSet, cancelledSet)
	done, failedSet = tally.Done, tally.Failed
	b := &Status{JobID: m.JobID, Chunks: m.Chunks, ChunksDone: len(tally.Done), ChunksFailed: len(tally.Failed),
		ChunksCancelled: len(tally.Cancelled), Items: m.Items, ClaimChecked: m.ClaimChecked, CreatedAt: m.CreatedAt,
		Failed: []FailedChunk{}, Status: tally.Status(cancel != nil), done: tally.Done,
		cancelled: tally.Cancelled}
	b.ChunksPending = tally.Pending()
	if cancel != nil {
		at := cancel.At
		b.CancelledAt = &at
	}

	var mu sync.Mutex
	itemsFailed := map[int]int{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(api.ReadConcurrency)
	for c := range itemErrSet {
		if !done[c] {
			continue
		}
		g.Go(func() error {
			raw, err := p.store.ReadLimit(gctx, job.ItemErrorsKey(m.JobID, c), maxItemErrorsMarker)
			if err != nil {
				return err
			}
			if n := job.ItemsFailedOf(m, c, raw); n > 0 {
				mu.Lock()
				itemsFailed[c] = n
				mu.Unlock()
			}
			return nil
		})
	}
	for c := range failedSet {
		g.Go(func() error {
			reason := "unknown"
			raw, err := p.store.Read(gctx, job.FailedKey(m.JobID, c))
			if err != nil {
				return err
			}
			var f job.FailedMarker
			if json.Unmarshal(raw, &f) == nil && f.Reason != "" {
				reason = f.Reason
			}
			mu.Lock()
			b.Failed = append(b.Failed, FailedChunk{Chunk: c, Reason: reason})
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	b.ItemsDone, b.ItemsFailed = tally.Items(m, itemsFailed)
	sort.Slice(b.Failed, func(i, j int) bool { return b.Failed[i].Chunk < b.Failed[j].Chunk })
	return b, nil
}

// CancelRecord reads job jobID's cancel record: nil when it has none.
func (p *Service) CancelRecord(ctx context.Context, jobID string) (*job.CancelRecord, error) {
	raw, err := p.store.ReadLimit(ctx, job.CancelKey(jobID), maxCancelRecord)
	if errors.Is(err, payload.ErrMissing) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c job.CancelRecord
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("cancel record of job %s: %w", jobID, err)
	}
	return &c, nil
}

// chunksUnder lists prefix and returns the chunks its keys name
// (job.ChunkOfKey), ignoring anything else.
func (p *Service) chunksUnder(ctx context.Context, prefix string, chunks int) (map[int]bool, error) {
	keys, err := p.store.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	return job.ChunkSet(prefix, keys, chunks), nil
}

// Done reports whether chunk c has a result.
func (st *Status) Done(c int) bool { return st.done[c] }

// UnsettledItems counts the items of the job's failed and cancelled chunks.
func (st *Status) UnsettledItems(m *job.Manifest) int {
	n := 0
	for _, f := range st.Failed {
		n += m.ChunkItems[f.Chunk]
	}
	for c := range st.cancelled {
		n += m.ChunkItems[c]
	}
	return n
}
