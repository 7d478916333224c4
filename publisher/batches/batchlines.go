package batches

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/jobs"
)

// What a batch's finalizer reads, whatever its API writes of it (OpenAI's
// output and error files, batchfiles.go; Anthropic's results,
// msgbatches.go): how the batch ends, and each of its requests in the
// create's order with what became of it.

// ending sets the status b ends with, its job having settled (st):
// cancelled when its job was cancelled before the window's end; expired
// when the window's end cancelled requests not yet run (a window that
// closed after the last one ran leaves it completed); completed otherwise.
func (b *batchRecord) ending(st *jobs.Status) {
	b.Status = batchCompleted
	if st.CancelledAt == nil {
		return
	}
	switch ca := st.CancelledAt.Unix(); {
	case ca < b.ExpiresAt:
		b.Status, b.CancellingAt = batchCancelled, ca
	case st.ChunksCancelled > 0:
		b.Status = batchExpired
	}
}

// batchLine is one request of a settled batch: its custom id, and what
// became of it: it ran (done), with output o (nil when its chunk's result
// has none for it); or its chunk was dead-lettered, for reason; or it was
// not run.
type batchLine struct {
	id     string
	done   bool
	o      *job.Output
	reason string
}

// eachLine calls f with each request of b, whose job has settled (m, st),
// in the create's order, the results read ahead (prefetchOutputs).
func (p *Service) eachLine(ctx context.Context, b *batchRecord, m *job.Manifest, st *jobs.Status, f func(*batchLine) error) error {
	reasons := make(map[int]string, len(st.Failed))
	for _, f := range st.Failed {
		reasons[f.Chunk] = f.Reason
	}
	ids, _, err := p.store.Open(ctx, job.BatchIDsKey(b.Owner, b.ID))
	if err != nil {
		return fmt.Errorf("custom ids of batch %s: %w", b.ID, err)
	}
	defer ids.Close()
	idLines := bufio.NewReader(ids)
	results := p.prefetchOutputs(ctx, b.ID, m.Chunks, st)
	for c, n := range m.ChunkItems {
		var outputs map[string]*job.Output
		if st.Done(c) {
			r := results.get(c)
			if r.err != nil {
				return r.err
			}
			outputs = r.outputs
		}
		for range n {
			raw, err := idLines.ReadBytes('\n')
			var id string
			if err == nil {
				err = json.Unmarshal(raw, &id)
			}
			if err != nil {
				return fmt.Errorf("custom ids of batch %s: %w", b.ID, err)
			}
			if err := f(&batchLine{id: id, done: st.Done(c), o: outputs[id], reason: reasons[c]}); err != nil {
				return err
			}
		}
	}
	return nil
}

// startCreate is what both batch creates (postBatch, postMessageBatch) do
// before they read the request: a store to keep the batch, a JSON body, an
// Idempotency-Key that is valid (once is nil without one), the tenant, and
// the client's place among the clients creating a batch: a client creates
// one batch at a time, so that the bytes being read into batches
// (takeBatchBytes, first come first served) are not all one client's while
// others wait. done gives the place back; false, having answered r with
// fail, when any of these is refused.
func (p *Service) startCreate(w http.ResponseWriter, r *http.Request, fail func(*api.Error)) (once *api.CreateOnce, tenantName string, done func(), ok bool) {
	if p.store == nil {
		fail(noBatchStore())
		return nil, "", nil, false
	}
	if e := api.CheckContentType(r.Header.Values("Content-Type")); e != nil {
		fail(e)
		return nil, "", nil, false
	}
	once, e := p.gate.NewCreateOnce(r, batchSendStale)
	if e != nil {
		fail(e)
		return nil, "", nil, false
	}
	if tenantName, e = p.gate.RequestTenant(r); e != nil {
		fail(e)
		return nil, "", nil, false
	}
	client := p.gate.ClientKey(r)
	if !p.batchCreators.add(client) {
		w.Header().Set("Retry-After", "5")
		fail(api.Err(http.StatusTooManyRequests, CodeBatchBusy, "this client is already creating a batch; retry after the time in Retry-After"))
		return nil, "", nil, false
	}
	return once, tenantName, func() { p.batchCreators.remove(client) }, true
}

// takeBatchBytes takes charge bytes of the bound on the bodies of the
// creates in flight at once (-max-file-bytes; a create holds less than its
// body: postMessageBatch), waiting up to 30 s; release gives them back.
// false, having answered r with fail, when the wait ran out.
func (p *Service) takeBatchBytes(w http.ResponseWriter, r *http.Request, fail func(*api.Error), charge int64) (release func(), ok bool) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	err := p.batchBytes.Acquire(ctx, charge)
	cancel()
	if err != nil {
		w.Header().Set("Retry-After", "5")
		fail(api.Err(http.StatusServiceUnavailable, CodeBatchBusy, "too many batches are being created; retry shortly"))
		return nil, false
	}
	return func() { p.batchBytes.Release(charge) }, true
}
