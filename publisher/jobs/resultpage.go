package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// Results in flight: GET /v1/jobs/{id} answers a page of a settled job's
// results, each chunk's read from S3, decoded, checked and written out in
// chunk order as it comes, so the answer is never whole in memory. What a
// request holds is bounded twice. Its page ends before the result that would
// take the page's stored bytes over MaxPageBytes (the page always holds one),
// as it ends after page_size chunks. And the results held at once, over all
// requests, are bounded by a weighted semaphore of MaxResultBytesInFlight:
// a result is charged its stored size, which S3 sends ahead of the body,
// before any of it is read, and keeps the charge until its part of the answer
// is written. A request reads up to resultsAhead results ahead of the one it
// writes.
//
// A charge is taken with TryAcquire, never waited for in the semaphore's
// queue: a request waits only for charges of its own to come back, and when
// it holds none and the budget still cannot take its next result, other
// requests hold it. Then a request that has written nothing is answered 503
// overloaded with Retry-After, and one that has written results ends its
// page there, its next_page_token naming the result it could not take. So a
// request never waits on another, and two cannot wait on each other.
//
// Each client (ClientKey: its API key, else its address) holds at most
// MaxResultBytesPerClient of the budget, as it holds at most its share of
// the bodies in flight (publisher/api/inflight.go): a client's GETs that read slowly, or
// not at all, keep their charges until the server's write timeout, and
// without a share two of them could hold the whole budget. A GET that its
// own client's other GETs keep from its first result is answered 429
// too_many_results with Retry-After, one that has written results ends its
// page there; other clients' GETs go on.

// resultBudget is the budget of results in flight: a *semaphore.Weighted
// of MaxResultBytesInFlight, used only through these two methods, so that a
// test can watch it.
type resultBudget interface {
	TryAcquire(n int64) bool
	Release(n int64)
}

var _ resultBudget = (*semaphore.Weighted)(nil)

// errClientResults: the client's results in flight would be over its share.
var errClientResults = errors.New("the client's results in flight over its share")

// resultShares is the budget of results in flight with each client's share
// of it. One lock guards the shares, so that a charge is taken from the
// client's share and the whole, or from neither. Safe for concurrent use.
type resultShares struct {
	total     resultBudget
	perClient int64

	mu      sync.Mutex
	clients map[string]int64 // only clients holding a charge
}

func newResultShares(c *Config) *resultShares {
	return &resultShares{total: semaphore.NewWeighted(c.MaxResultBytesInFlight), perClient: c.MaxResultBytesPerClient,
		clients: map[string]int64{}}
}

// clientResults is what one client's pages charge the budget through.
type clientResults struct {
	s      *resultShares
	client string
}

func (s *resultShares) client(key string) clientResults { return clientResults{s, key} }

// take charges n to the client's share and to the whole, or to neither and
// says which cannot take it: the client's share first, so that a client
// held up by its own GETs is told so rather than that the publisher is busy.
func (c clientResults) take(n int64) error {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.clients[c.client]+n > s.perClient {
		return errClientResults
	}
	if !s.total.TryAcquire(n) {
		return errResultsOverloaded
	}
	s.clients[c.client] += n
	return nil
}

// give gives back n that take charged.
func (c clientResults) give(n int64) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total.Release(n)
	if s.clients[c.client] -= n; s.clients[c.client] <= 0 {
		delete(s.clients, c.client)
	}
}

// resultsAhead is how many results one request reads ahead of the one it
// writes.
const resultsAhead = 4

// errResultsOverloaded is a page's next result when the budget cannot take it.
var errResultsOverloaded = errors.New("results in flight over the budget")

// pageResult is one chunk's result on its way into a page.
type pageResult struct {
	chunk  int
	charge int64       // bytes charged to the budget; 0 once given back
	res    *job.Result // set, or err, once ready is closed
	err    error
	// cut: the page ends before this chunk (MaxPageBytes); nothing was read.
	cut   bool
	ready chan struct{}
}

// resultPage reads the results of one page for its writer, in chunk order,
// charging each to the budget.
type resultPage struct {
	budget  clientResults
	results chan *pageResult // in chunk order; closed when the page has no more
	held    atomic.Int64     // this page's charges not given back
	freed   chan struct{}    // a charge came back (capacity 1)
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

// writePage answers r, a GET of job m whose every chunk is settled, with
// its status st and the page of its results from chunk start, written as
// each result is read. Until the first result is in hand nothing is written,
// so a failure to read it is answered as an error; a failure after that ends
// the page before the result that failed, and the next page starts with it.
func (p *Service) writePage(w http.ResponseWriter, r *http.Request, m *job.Manifest, st *Status, start, pageSize int, fail func(*api.Error)) {
	ctx := r.Context()
	end := min(start+pageSize, m.Chunks)
	pg := p.readPage(ctx, p.results.client(p.gate.ClientKey(r)), m.JobID, st.done, start, end, p.cfg.MaxPageBytes)
	defer pg.close()
	head, err := json.Marshal(st)
	if err != nil {
		p.log.Error("encoding job status", "job_id", m.JobID, "err", err)
		fail(api.Err(http.StatusInternalServerError, api.CodeInternal, "the job's status could not be encoded"))
		return
	}
	head = head[:len(head)-1] // the closing brace comes after the results
	next, written := end, 0
	for res := pg.next(); res != nil; res = pg.next() {
		// Encoded here, one at a time, rather than by the readers: what a
		// page holds ahead is then the results as decoded, smaller than
		// their JSON.
		var enc []byte
		if res.res != nil {
			enc, res.err = api.MarshalUnescaped(chunkResult{Chunk: res.chunk, Model: res.res.Model, Outputs: res.res.Outputs,
				ItemsFailed: res.res.ItemsFailed})
		}
		if res.cut || res.err != nil {
			pg.release(res)
			switch {
			case res.cut || ctx.Err() != nil:
			case written == 0 && errors.Is(res.err, errResultsOverloaded):
				w.Header().Set("Retry-After", "1")
				fail(api.Err(http.StatusServiceUnavailable, api.CodeOverloaded,
					"the publisher is holding as many results as it may; retry after the time in Retry-After"))
				return
			case written == 0 && errors.Is(res.err, errClientResults):
				w.Header().Set("Retry-After", "1")
				fail(api.Err(http.StatusTooManyRequests, api.CodeTooManyResults,
					"this client's requests in flight hold results up to its share of %d bytes; retry after the time in Retry-After",
					p.cfg.MaxResultBytesPerClient))
				return
			case written == 0:
				p.log.Error("reading job results", "job_id", m.JobID, "chunk", res.chunk, "err", res.err)
				fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the job's results could not be read"))
				return
			case !errors.Is(res.err, errResultsOverloaded) && !errors.Is(res.err, errClientResults):
				p.log.Warn("ending a page of results early", "job_id", m.JobID, "chunk", res.chunk, "err", res.err)
			}
			next = res.chunk
			break
		}
		sep := ","
		if written == 0 {
			api.WriteJSONHeader(w, http.StatusOK)
			w.Write(head)
			sep = `,"results":[`
		}
		w.Write([]byte(sep))
		_, err = w.Write(enc)
		pg.release(res)
		written++
		if err != nil {
			return // the client is gone
		}
	}
	if written == 0 {
		api.WriteJSONHeader(w, http.StatusOK)
		w.Write(head)
	} else {
		w.Write([]byte("]"))
	}
	if next < m.Chunks {
		w.Write([]byte(`,"next_page_token":"` + strconv.Itoa(next) + `"`))
	}
	w.Write([]byte("}\n"))
}

// readPage starts reading the results of jobID's chunks in [start, end)
// that done lists, for a page of at most maxBytes of stored results (but
// one), charging them to budget. Take them with next, in order, give each back with release once
// written, and close the page when done with it.
//
// Three stages, each in chunk order: the objects are opened (GetObject,
// whose answer gives the size) up to resultsAhead ahead, each is charged to
// the budget in turn, and a charged one's body is read and decoded, up to
// resultsAhead ahead of the writer. Charges are taken in the writer's order
// because a page waits only for its own charges to come back: a later result
// charged first could hold what the writer's next one needs.
func (p *Service) readPage(ctx context.Context, budget clientResults, jobID string, done map[int]bool, start, end int, maxBytes int64) *resultPage {
	ctx, cancel := context.WithCancel(ctx)
	pg := &resultPage{budget: budget, results: make(chan *pageResult, resultsAhead-1),
		freed: make(chan struct{}, 1), cancel: cancel}
	type opened struct {
		chunk  int
		body   io.ReadCloser
		size   int64
		err    error
		cancel context.CancelFunc // ends this object's read
	}
	opens := make(chan chan opened, resultsAhead-1)
	stop := make(chan struct{}) // the page needs no more opened
	pg.done.Go(func() {
		defer close(opens)
		for c := start; c < end; c++ {
			if !done[c] {
				continue
			}
			o := make(chan opened, 1)
			select {
			case opens <- o:
			case <-stop:
				return
			}
			// Each object's read has a context of its own: one opened
			// past where the page stops is cancelled, while the reads of
			// the results before it go on.
			octx, ocancel := context.WithCancel(ctx)
			pg.done.Go(func() {
				body, size, err := p.store.Open(octx, job.ResultKey(jobID, c))
				o <- opened{c, body, size, err, ocancel}
			})
		}
	})
	pg.done.Go(func() {
		defer close(pg.results)
		defer func() {
			close(stop)
			for o := range opens {
				o := <-o
				o.cancel()
				if o.err == nil {
					o.body.Close()
				}
			}
		}()
		var bytes int64
		for o := range opens {
			o := <-o
			r := &pageResult{chunk: o.chunk, ready: make(chan struct{})}
			body, size, err := o.body, o.size, o.err
			switch {
			case err != nil:
			case size > job.MaxResultBytes:
				body.Close()
				err = fmt.Errorf("result %s is %d bytes, over the %d a subscriber stores", job.ResultKey(jobID, r.chunk), size, job.MaxResultBytes)
			case bytes > 0 && bytes+size > maxBytes:
				body.Close()
				r.cut = true
			default:
				if err = pg.charge(ctx, size); err != nil {
					body.Close()
					break
				}
				r.charge = size
				bytes += size
			}
			// Once r is sent its reader and the page's writer own it: the
			// producer goes on from what it knows here.
			last := r.cut || err != nil
			if last {
				o.cancel()
				r.err = err
				close(r.ready)
			} else {
				pg.done.Go(func() {
					defer close(r.ready)
					defer o.cancel()
					defer body.Close()
					r.res, r.err = readResult(body, size, jobID, r.chunk)
				})
			}
			select {
			case pg.results <- r:
			case <-ctx.Done():
				<-r.ready
				pg.release(r)
				return
			}
			if last {
				return
			}
		}
	})
	return pg
}

// charge takes n bytes of the budget for this page, waiting only while the
// page itself holds charges that will come back. The error is
// errResultsOverloaded or errClientResults when others hold what it needs.
func (pg *resultPage) charge(ctx context.Context, n int64) error {
	for err := pg.budget.take(n); err != nil; err = pg.budget.take(n) {
		if pg.held.Load() == 0 {
			// Every charge of this page was given back before the load
			// saw none (release gives back first): one more try sees them.
			if err = pg.budget.take(n); err == nil {
				break
			}
			return err
		}
		select {
		case <-pg.freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	pg.held.Add(n)
	return nil
}

// next is the page's next result, ready, or nil when there is none.
func (pg *resultPage) next() *pageResult {
	r, ok := <-pg.results
	if !ok {
		return nil
	}
	<-r.ready
	return r
}

// release gives r's charge back. It may be called more than once.
func (pg *resultPage) release(r *pageResult) {
	if r.charge == 0 {
		return
	}
	pg.budget.give(r.charge)
	pg.held.Add(-r.charge)
	r.charge, r.res = 0, nil
	select {
	case pg.freed <- struct{}{}:
	default:
	}
}

// close stops the reads and gives back every charge the page still holds.
func (pg *resultPage) close() {
	pg.cancel()
	for r := pg.next(); r != nil; r = pg.next() {
		pg.release(r)
	}
	pg.done.Wait()
}

// readResult reads and decodes the result body holds, size bytes, of
// results/{job}/{chunk}.json. The subscriber stores the whole result at that
// key, never a reference (a result message may refer to the object; the
// object does not refer on), so a stored result with a reference is refused,
// not followed: following it would let whoever wrote it make this API serve,
// or read into memory, any object the publisher's role can read.
func readResult(body io.Reader, size int64, jobID string, chunk int) (*job.Result, error) {
	key := job.ResultKey(jobID, chunk)
	raw := make([]byte, size)
	if _, err := io.ReadFull(body, raw); err != nil {
		return nil, fmt.Errorf("result %s: %w", key, err)
	}
	var res job.Result
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("result %s: %w", key, err)
	}
	switch {
	case res.Ref != nil:
		return nil, fmt.Errorf("result %s refers to another object instead of holding the result", key)
	case res.JobID != jobID || res.Chunk != chunk:
		return nil, fmt.Errorf("result %s is for another chunk", key)
	}
	return &res, nil
}
