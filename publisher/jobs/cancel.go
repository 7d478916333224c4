package jobs

import (
	"net/http"

	"github.com/vramq/vramq/publisher/api"
)

// maxCancelRecord bounds the read of a cancel record: the publisher writes
// a few dozen bytes.
const maxCancelRecord = 4 << 10

// deleteJob is DELETE /v1/jobs/{id}: cancel the job. The answer is the
// job's status (as GET's, without results), 200 in every case the job
// exists: a job already finished is left as it is, and a second cancel finds
// the first one's record, so a client may repeat the request freely.
//
// The cancel is a record in the payload bucket, written once (a conditional
// put, so the first cancel's time stands); subscribers read it through a
// cache (subscriber/receive.go), so chunks received up to its TTL after the
// cancel may still run.
func (p *Service) deleteJob(w http.ResponseWriter, r *http.Request) {
	ri := api.Info(r)
	m, fail := p.loadJob(w, r)
	if m == nil {
		return
	}
	ctx := r.Context()
	st, err := p.status(ctx, m)
	if err == nil && st.Status == StatusRunning {
		if err = p.cancel(ctx, m.JobID); err == nil {
			st, err = p.status(ctx, m)
		}
	}
	if err != nil {
		p.log.Error("cancelling a job", "job_id", ri.JobID, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the job could not be cancelled; try again"))
		return
	}
	api.WriteJSON(w, http.StatusOK, st)
}
