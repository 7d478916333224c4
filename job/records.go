package job

import "time"

// Manifest is jobs/{job_id}.json: what the publisher's GET /v1/jobs/{id}
// needs to know about a job without asking the queue. The publisher writes it
// before the first chunk is sent.
type Manifest struct {
	V     int    `json:"v"`
	JobID string `json:"job_id"`
	// Owner is the tenant whose API key created the job; GET and DELETE
	// /v1/jobs/{id} answer only that tenant's keys. Empty when the
	// publisher had no API keys (no caller to record), and in manifests
	// written before owners were recorded: a publisher with keys answers
	// no one for those.
	Owner        string    `json:"owner,omitempty"`
	Chunks       int       `json:"chunks"`
	Items        int       `json:"items"`
	ClaimChecked int       `json:"claim_checked"`
	ChunkItems   []int     `json:"chunk_items"` // items in each chunk, in chunk order
	CreatedAt    time.Time `json:"created_at"`
}

// FailedMarker is failed/{job_id}/{chunk}.json: why a chunk was
// dead-lettered. The subscriber writes it when it dead-letters a chunk; the
// publisher reads it for its progress answer.
type FailedMarker struct {
	V         int    `json:"v"`
	JobID     string `json:"job_id"`
	Chunk     int    `json:"chunk"`
	Reason    string `json:"reason"` // as in the DLQ copy's AttrReason attribute
	MessageID string `json:"message_id"`
	At        string `json:"at"` // RFC 3339, UTC
}

// CancelRecord is cancel/{job_id}.json: the job's owner asked for it to be
// cancelled. The publisher writes it once (a conditional put) on DELETE
// /v1/jobs/{id}; subscribers read it, through a cache, before running the
// job's chunks.
type CancelRecord struct {
	V     int       `json:"v"`
	JobID string    `json:"job_id"`
	At    time.Time `json:"at"`
}

// CancelledMarker is cancelled/{job_id}/{chunk}.json: a chunk of a
// cancelled job that was deleted without running. The subscriber writes it
// before the delete; the publisher counts them for its progress answer.
type CancelledMarker struct {
	V         int    `json:"v"`
	JobID     string `json:"job_id"`
	Chunk     int    `json:"chunk"`
	MessageID string `json:"message_id"`
	At        string `json:"at"` // RFC 3339, UTC
}

// ItemErrorsMarker is itemerrors/{job_id}/{chunk}.json: how many items of a
// chunk the model refused (job.Output.Error) while the others ran. The
// subscriber writes it with the chunk's result when any item failed; the
// publisher adds them up for items_failed.
type ItemErrorsMarker struct {
	V           int    `json:"v"`
	JobID       string `json:"job_id"`
	Chunk       int    `json:"chunk"`
	ItemsFailed int    `json:"items_failed"`
}

// Completion event statuses: the publisher's job states once nothing is
// pending (publisher/status.go).
const (
	EventComplete  = "complete"  // every chunk has a result
	EventPartial   = "partial"   // every chunk settled, some dead-lettered
	EventCancelled = "cancelled" // every chunk settled, some deleted unrun after DELETE /v1/jobs/{id}
)

// EventJobSettled is CompletionEvent.Event.
const EventJobSettled = "vramq.job.settled"

// CompletionEvent is what goes to the events topic when a job's last chunk
// settles (docs/events.md), and again, with a higher Revision, when a later
// count of the settled job sees more (Supersedes): a result stored after a
// chunk was dead-lettered, say. Each revision's done marker
// (DoneRevisionKey) is the same record, with PublishError set while that
// revision has not gone out.
type CompletionEvent struct {
	V     int    `json:"v"`
	Event string `json:"event"`
	JobID string `json:"job_id"`
	// BatchID is the job's id again when the job is a batch of the
	// publisher's Batch API or a Message Batch (BatchOf), so a consumer
	// knows to read it as one (GET /v1/batches/{id}, GET
	// /v1/messages/batches/{id}), and the publisher's function, subscribed
	// under Lambda, finalizes it at once; absent otherwise.
	BatchID string `json:"batch_id,omitempty"`
	// Revision is 1 for a job's first event and one more for each
	// correction: a consumer keeps, for each job, the event of the highest
	// revision it has seen, and (job_id, revision) names one event, which
	// may be delivered more than once.
	Revision        int    `json:"revision"`
	Status          string `json:"status"`
	Chunks          int    `json:"chunks"`
	ChunksDone      int    `json:"chunks_done"`
	ChunksFailed    int    `json:"chunks_failed"`
	ChunksCancelled int    `json:"chunks_cancelled"`
	Items           int    `json:"items"`
	// ItemsDone counts the items of done chunks that have an answer;
	// ItemsFailed those the model refused (their outputs carry an error).
	// Items of failed and cancelled chunks are in neither (Tally.Items).
	ItemsDone   int `json:"items_done"`
	ItemsFailed int `json:"items_failed"`
	// ResultsURI is the S3 prefix of the job's results, one object a chunk
	// (results/{job_id}/{chunk}.json); FailedURI of its failed markers.
	ResultsURI string `json:"results_uri"`
	FailedURI  string `json:"failed_uri"`
	At         string `json:"at"` // RFC 3339, when the job was found settled
	// PublishError, in the done marker only: the publish failed, and a later
	// check of the job (a redelivery of one of its chunks) sends it again.
	PublishError string `json:"publish_error,omitempty"`
}

// BatchIDPrefix starts the id of every batch of the publisher's Batch API,
// and so of its job (publisher/batches.go); MessageBatchIDPrefix that of
// every Message Batch (publisher/msgbatches.go).
const (
	BatchIDPrefix        = "batch_"
	MessageBatchIDPrefix = "msgbatch_"
)

// BatchOf is the batch whose job jobID is, of either API, or "" when it is
// not a batch's. Anyone who can send to the queue chooses job ids, so this
// says what the id looks like, not that the publisher made such a batch.
func BatchOf(jobID string) string {
	for _, prefix := range []string{BatchIDPrefix, MessageBatchIDPrefix} {
		if len(jobID) > len(prefix) && jobID[:len(prefix)] == prefix {
			return jobID
		}
	}
	return ""
}
