package subscriber

import (
	"context"
	"encoding/json"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// markFailed writes the failed marker of t's chunk. Best effort: the DLQ
// copy is the record that matters, so a failure is only logged.
//
// Only for a message that decoded as work (t.work): anyone who can send to
// the queue can send a body that names any job and chunk and decodes as
// nothing, and a marker for it would settle that job before its real
// chunk runs. Only for a chunk of the job's manifest, when it has one: a
// chunk at or past its count is none of the job's, and no count would use
// the marker. And only where none is: a sender must not replace the reason
// a real failure left there. A result still wins over a marker, in GET and
// in the completion event, and a result stored after a marker corrects the
// event (events.go).
func (e *ends) markFailed(t *task, reason string) {
	w, l := t.work, t.lease
	if w == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	if n, ok := e.manifestChunks(ctx, w.JobID); ok && w.Chunk >= n {
		e.log.Info("no failed marker for a chunk past its job's last", "message_id", l.msg.ID, "job_id", w.JobID,
			"chunk", w.Chunk, "chunks", n)
		return
	}
	body, err := json.Marshal(job.FailedMarker{V: job.Version, JobID: w.JobID, Chunk: w.Chunk, Reason: reason,
		MessageID: l.msg.ID, At: time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		return
	}
	created, _, err := e.payloads.PutIfAbsent(ctx, job.FailedKey(w.JobID, w.Chunk), body)
	switch {
	case err != nil:
		e.log.Warn("writing the failed marker failed; the DLQ copy stands",
			"message_id", l.msg.ID, "job_id", w.JobID, "chunk", w.Chunk, "err", err)
	case !created:
		e.log.Info("the chunk has a failed marker already; kept", "message_id", l.msg.ID, "job_id", w.JobID, "chunk", w.Chunk)
	}
	if err == nil {
		e.settling(w.JobID)
	}
}

// manifestChunks is the chunk count of jobID's manifest, when it can be
// read: a job without one (a publisher without a bucket) or a read that
// fails says nothing.
func (e *ends) manifestChunks(ctx context.Context, jobID string) (int, bool) {
	raw, err := e.payloads.Read(ctx, job.ManifestKey(jobID))
	if err != nil {
		return 0, false
	}
	var m job.Manifest
	if json.Unmarshal(raw, &m) != nil || m.JobID != jobID || m.Chunks < 1 {
		return 0, false
	}
	return m.Chunks, true
}

// chunkOf finds the chunk a message is for in whatever of its body parses (a
// malformed message may still name its job), with a job id of the grammar.
// Never from its attributes: the body is what was validated and run, and
// attributes may say anything.
func chunkOf(m queue.Message) (job.Key, bool) {
	var b struct {
		JobID string `json:"job_id"`
		Chunk *int   `json:"chunk"`
	}
	if json.Unmarshal([]byte(m.Body), &b) != nil || !job.ValidJobID(b.JobID) || b.Chunk == nil || *b.Chunk < 0 {
		return job.Key{}, false
	}
	return job.Key{JobID: b.JobID, Chunk: *b.Chunk}, true
}
