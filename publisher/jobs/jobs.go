package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// acceptedBody is the 202 answer to POST /v1/jobs.
type acceptedBody struct {
	JobID        string `json:"job_id"`
	Chunks       int    `json:"chunks"`
	Items        int    `json:"items"`
	ClaimChecked int    `json:"claim_checked"`
	StatusURL    string `json:"status_url,omitempty"` // only with a payload bucket
}

// enqueueTimeout bounds the uploads and sends of one job when the request
// itself has no deadline (a Lambda invocation has one).
const enqueueTimeout = 90 * time.Second

// Detach returns a context for enqueueing that a client hanging up does not
// cancel: once the first chunk may be on the queue, finishing the job is
// better than leaving it half sent. The request's deadline, if any, stays.
func Detach(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(enqueueTimeout)
	}
	return context.WithDeadline(context.WithoutCancel(ctx), d)
}

// uploadConcurrency bounds the claim-check uploads of one request.
const uploadConcurrency = 8

// postJob is POST /v1/jobs. Everything the client can get wrong is checked
// before anything leaves the process; after that, the order is: idempotency
// record, claim-checked items, manifest, then the chunks. So a job id handed
// out is always backed by its record, and a chunk on the queue never points
// at an item not yet in S3.
func (p *Service) postJob(w http.ResponseWriter, r *http.Request) {
	ri := api.Info(r)
	fail := api.FailWith(w, r)
	if e := api.CheckContentType(r.Header.Values("Content-Type")); e != nil {
		fail(e)
		return
	}
	idemHeader, hasIdem := r.Header["Idempotency-Key"]
	if hasIdem && (len(idemHeader) != 1 || !api.ValidIdempotencyKey(idemHeader[0])) {
		fail(api.Err(http.StatusBadRequest, api.CodeInvalidIdempotency,
			"Idempotency-Key must be given once, as 1 to %d visible ASCII characters", api.MaxIdempotencyKey))
		return
	}
	tenantName, e := p.gate.RequestTenant(r)
	if e != nil {
		fail(e)
		return
	}
	// A body declared too large is refused before any of it is read; one
	// that turns out too large (sent chunked, without a length) is cut off
	// at the limit. The buffer is then at most MaxBodyBytes, but what the
	// request holds while it is handled is several times that (see
	// publisher/api/inflight.go): the budget of bodies in flight is what bounds the memory.
	if r.ContentLength > p.maxBody {
		fail(api.Err(http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge, "the request body is over the limit of %d bytes", p.maxBody))
		return
	}
	body, release, err := p.gate.ReadBody(w, r)
	defer release()
	if err != nil {
		fail(p.gate.BodyError(w, err))
		return
	}
	ri.BodyBytes = len(body)
	// Hashed now, so that nothing uses the body after it is decoded and the
	// collector may take it while the job is planned and sent.
	var bodySum [sha256.Size]byte
	if hasIdem {
		bodySum = sha256.Sum256(body)
	}
	req, e := DecodeJobRequest(body, p.Limits())
	if e != nil {
		fail(e)
		return
	}
	jobID := newJobID()
	chunkItems := req.chunkItems(p.cfg.ChunkItems)
	plan, e := p.planner.PlanFor(jobID, req.Endpoint, req.plannedItems(), chunkItems)
	if e != nil {
		fail(e)
		return
	}

	// From here the request is valid: what fails is ours (503/500).
	var key string
	var rec api.IdemRecord
	if hasIdem {
		ri.IdempotencyKey = true
		now := p.now().UTC()
		rec = api.IdemRecord{V: 1, JobID: jobID, RequestSHA256: hex.EncodeToString(bodySum[:]), State: api.StateSending, CreatedAt: now, UpdatedAt: now}
		key = api.IdemKey(api.Scope(r), idemHeader[0])
		old, err := p.idem.Claim(r.Context(), key, rec)
		if err != nil {
			p.log.Error("idempotency record", "err", err)
			fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable,
				"the idempotency record could not be written; nothing was sent, try again"))
			return
		}
		if old != nil {
			var prev acceptedBody // the answer a request that was accepted had
			switch {
			case old.RequestSHA256 != rec.RequestSHA256:
				fail(api.Err(http.StatusUnprocessableEntity, api.CodeIdempotencyReused, "this Idempotency-Key was used for a request with another body"))
				return
			case old.State == api.StateAccepted && json.Unmarshal(old.Response, &prev) == nil:
				ri.JobID, ri.Items, ri.Chunks, ri.Replayed = old.JobID, prev.Items, prev.Chunks, true
				p.gate.Replayed(w)
				p.writeAccepted(w, &prev)
				return
			case old.State == api.StateSending && now.Sub(old.UpdatedAt) < p.idemStale:
				w.Header().Set("Retry-After", "1")
				ri.JobID = old.JobID
				fail(api.Err(http.StatusConflict, api.CodeIdempotencyBusy, "a request with this Idempotency-Key is still being handled; retry shortly"))
				return
			}
			// The first request failed or died: send the same job again,
			// under its id, cut the same way.
			rec.JobID, rec.CreatedAt = old.JobID, old.CreatedAt
			if plan, e = p.planner.PlanFor(old.JobID, req.Endpoint, req.plannedItems(), chunkItems); e != nil {
				fail(e)
				return
			}
			jobID = old.JobID
			if err := p.idem.Put(r.Context(), key, rec); err != nil {
				p.log.Error("idempotency record", "err", err)
				fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable,
					"the idempotency record could not be written; nothing was sent, try again"))
				return
			}
			ri.Replayed = true
		}
	}

	ri.JobID, ri.Items, ri.Chunks, ri.ClaimChecked = jobID, len(req.Items), len(plan.Chunks), len(plan.Claims)
	resp := &acceptedBody{JobID: jobID, Chunks: len(plan.Chunks), Items: len(req.Items), ClaimChecked: len(plan.Claims)}
	if p.store != nil {
		resp.StatusURL = "/v1/jobs/" + jobID
	}
	ectx, cancel := Detach(r.Context())
	defer cancel()
	sent, e := p.Enqueue(ectx, jobID, tenantName, p.gate.Owner(r), plan, len(req.Items))
	if key != "" {
		// The answer is recorded even if the client has gone, so its retry
		// finds it: under a context that outlives the request.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
		rec.State, rec.UpdatedAt = api.StateFailed, p.now().UTC()
		if e == nil {
			rec.State, rec.Response = api.StateAccepted, api.EncodeJSON(resp)
		}
		if err := p.idem.Put(ctx, key, rec); err != nil {
			// The job stands; a retry will find "sending" and, once stale,
			// send it again, which downstream de-duplication absorbs.
			p.log.Warn("recording the outcome of an idempotent request", "job_id", jobID, "err", err)
		}
		cancel()
	}
	ri.Sent = sent
	if e != nil {
		ri.Code = e.Code
		api.WriteJSON(w, e.Status, api.ErrorBody{Error: e, JobID: jobID, Chunks: len(plan.Chunks), Sent: &sent})
		return
	}
	p.Accepted(tenantName, len(req.Items))
	p.writeAccepted(w, resp)
}

func (p *Service) writeAccepted(w http.ResponseWriter, resp *acceptedBody) {
	if resp.StatusURL != "" {
		w.Header().Set("Location", resp.StatusURL)
	}
	api.WriteJSON(w, http.StatusAccepted, resp)
}

// Enqueue uploads plan's claim-checked items, writes the job's manifest
// (with its owner), and sends the chunks, returning how many chunks SQS
// confirmed: POST /v1/jobs's enqueue (a batch's, too large to plan whole,
// goes by Measure and Stream). The job is counted accepted only by Accepted.
func (p *Service) Enqueue(ctx context.Context, jobID, tenantName, owner string, plan *Plan, items int) (int, *api.Error) {
	if len(plan.Claims) > 0 {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(uploadConcurrency)
		for _, c := range plan.Claims {
			g.Go(func() error {
				ref, err := p.store.Put(gctx, c.Ref.Key, c.Body)
				if err == nil && ref != c.Ref {
					err = fmt.Errorf("stored %s as %+v, planned %+v", c.Ref.Key, ref, c.Ref)
				}
				return err
			})
		}
		if err := g.Wait(); err != nil {
			p.log.Error("claim-check upload", "job_id", jobID, "err", err)
			return 0, api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "storing the job's large items failed; nothing was sent")
		}
		p.m.claimChecked.Add(float64(len(plan.Claims)))
	}
	if p.store != nil {
		var chunkItems []int
		for _, c := range plan.Chunks {
			chunkItems = append(chunkItems, c.Items)
		}
		if e := p.putManifest(ctx, jobID, owner, chunkItems, items, len(plan.Claims)); e != nil {
			return 0, e
		}
	}
	sent, err := p.sender.send(ctx, jobID, tenantName, plan.Chunks)
	if err != nil {
		p.log.Error("sending chunks", "job_id", jobID, "sent", sent, "chunks", len(plan.Chunks), "err", err)
		return sent, api.Err(http.StatusServiceUnavailable, api.CodeEnqueueFailed,
			"%d of %d chunks reached the queue; the job is incomplete "+
				"(retry with the same Idempotency-Key to send it again under the same id)", sent, len(plan.Chunks))
	}
	return sent, nil
}

// putManifest writes the manifest of job jobID, whose chunks hold
// chunkItems items each.
func (p *Service) putManifest(ctx context.Context, jobID, owner string, chunkItems []int, items, claims int) *api.Error {
	m := job.Manifest{V: 1, JobID: jobID, Owner: owner, Chunks: len(chunkItems), Items: items, ClaimChecked: claims,
		ChunkItems: chunkItems, CreatedAt: p.now().UTC()}
	if _, err := p.store.Put(ctx, job.ManifestKey(jobID), api.EncodeJSON(m)); err != nil {
		p.log.Error("job manifest", "job_id", jobID, "err", err)
		return api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "writing the job's manifest failed; nothing was sent")
	}
	return nil
}

// Limits are the bounds a job's request is checked against; a batch's
// lines are checked against the same.
func (p *Service) Limits() RequestLimits {
	return RequestLimits{MaxItems: p.cfg.MaxItems, MaxChunkItems: p.cfg.MaxChunkItems,
		Models: p.cfg.Models, MaxN: p.cfg.MaxN, MaxOutputTokens: p.cfg.MaxOutputTokens, AllowRemoteURLs: p.cfg.AllowRemoteURLs,
		Endpoints: p.cfg.ServedEndpoints}
}
