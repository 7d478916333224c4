package batches

import (
	"errors"
	"net/http"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/publisher/api"
)

// The reads of batch records that the routes of both batch APIs make, each
// batch shown as its API shows it (view: batchView for OpenAI's,
// messageBatchView for Anthropic's).

// batchRoute is what tells one API's batch routes from the other's: the
// ids of its batches, its answer to one that is not there, and its view.
type batchRoute[T any] struct {
	valid   func(string) bool
	missing func() *api.Error
	view    func(*http.Request, *batchRecord) (T, error)
}

// load reads the caller's batch r's path names and how it stands,
// answering r itself (and returning ok false) when that fails.
func (br batchRoute[T]) load(p *Service, w http.ResponseWriter, r *http.Request) (b *batchRecord, v T, fail func(*api.Error), ok bool) {
	ri := api.Info(r)
	fail = func(e *api.Error) {
		ri.Code = e.Code
		api.WriteError(w, e)
	}
	if p.store == nil {
		fail(noBatchStore())
		return nil, v, fail, false
	}
	id := r.PathValue("id")
	if !br.valid(id) {
		fail(br.missing())
		return nil, v, fail, false
	}
	ri.JobID = id
	b, err := p.readBatch(r, p.gate.Owner(r), id)
	if errors.Is(err, payload.ErrMissing) {
		fail(br.missing())
		return nil, v, fail, false
	}
	if err == nil {
		v, err = br.view(r, b)
	}
	if err != nil {
		p.log.Error("reading a batch", "batch_id", id, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batch could not be read"))
		return nil, v, fail, false
	}
	return b, v, fail, true
}

// readAll reads owner's batches ids, api.ReadConcurrency at a time, in order;
// one deleted since they were listed is left out.
func (br batchRoute[T]) readAll(p *Service, r *http.Request, owner string, ids []string) ([]T, error) {
	views := make([]T, len(ids))
	found := make([]bool, len(ids))
	g, gctx := errgroup.WithContext(r.Context())
	g.SetLimit(api.ReadConcurrency)
	for i, id := range ids {
		g.Go(func() error {
			rr := r.WithContext(gctx)
			b, err := p.readBatch(rr, owner, id)
			if errors.Is(err, payload.ErrMissing) {
				return nil // deleted since the listing
			}
			if err == nil {
				views[i], err = br.view(rr, b)
				found[i] = err == nil
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var out []T
	for i, v := range views {
		if found[i] {
			out = append(out, v)
		}
	}
	return out, nil
}

// startList checks what a listing of batches needs (a bucket, a caller who
// can list) and reads its limit (def when the query has none, at most
// most), answering r itself (and returning ok false) when one fails.
func (br batchRoute[T]) startList(p *Service, w http.ResponseWriter, r *http.Request, def, most int) (limit int, fail func(*api.Error), ok bool) {
	ri := api.Info(r)
	fail = func(e *api.Error) {
		ri.Code = e.Code
		api.WriteError(w, e)
	}
	e := p.gate.CanList(r)
	switch {
	case p.store == nil:
		e = noBatchStore()
	case e == nil:
		limit, e = api.ListLimit(r.URL.Query(), def, most)
	}
	if e != nil {
		fail(e)
		return 0, fail, false
	}
	return limit, fail, true
}

// cancel writes the cancel of b's job, the command the subscribers obey and
// the finalizer ends the batch on, and answers r with b as it stands then.
func (br batchRoute[T]) cancel(p *Service, w http.ResponseWriter, r *http.Request, b *batchRecord, fail func(*api.Error)) {
	if err := p.jobs.Cancel(r.Context(), b.ID); err != nil {
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batch could not be cancelled; try again"))
		return
	}
	v, err := br.view(r, b)
	if err != nil {
		p.log.Error("reading a batch", "batch_id", b.ID, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batch was cancelled, but could not be read"))
		return
	}
	api.WriteJSON(w, http.StatusOK, v)
}
