package job

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// The payload bucket's layout: every object vramq keeps there, so the
// publisher and the subscriber agree on it.
//
//	payloads/{job_id}/{sha256(item id)}.json   an item too large for a message (Item JSON)
//	jobs/{job_id}.json              the job's Manifest, written by the publisher
//	idempotency/{sha256}.json       Idempotency-Key → job id, by the publisher
//	results/{job_id}/{chunk}.json   a chunk's Result JSON, by the subscriber
//	failed/{job_id}/{chunk}.json    a FailedMarker: why a chunk was dead-lettered, by the subscriber
//	cancel/{job_id}.json            a CancelRecord: the job is cancelled, by the publisher (DELETE)
//	cancelled/{job_id}/{chunk}.json a CancelledMarker: a chunk deleted unrun, by the subscriber
//	itemerrors/{job_id}/{chunk}.json an ItemErrorsMarker: items of a chunk refused, by the subscriber
//	answers/{owner}/{job_id}/{chunk}/{sha256(item id)}.json an item's Output, kept as it is answered until its chunk's result is out, by the subscriber
//	done/{job_id}.json              a CompletionEvent: the job settled, its event sent (docs/events.md), by a subscriber
//	done/{job_id}.{rev}.json        a CompletionEvent: revision rev (2, 3, ...), a correction of it, by a subscriber
//	files/{owner}/{file_id}.jsonl   an uploaded file's content (POST /v1/files), by the publisher
//	files/{owner}/{file_id}.json    the file's record (name, size, expiry): the file exists while it does, by the publisher
//	batches/{owner}/{batch_id}.json a batch's record (POST /v1/batches): its request, state and files, by the publisher
//	batches/{owner}/{batch_id}.ids  the custom_id of each of its lines, one JSON string a line, by the publisher
//
// A batch is a job whose id is the batch's id: its chunks, results and
// markers are the job's, under the keys above.
//
// {owner} in files/ and batches/ is the SHA-256, in hex, of the tenant that owns the file
// (publisher's owner rule): a tenant name may hold any punctuation, '/'
// included, which would let one tenant's prefix list another's files.
//
// Cancelled chunks have a prefix of their own rather than a failed marker
// with a reason: a cancelled chunk has no DLQ copy, the publisher counts
// them with one List instead of reading every failed marker for its
// reason, and a job with cancelled chunks is not reported partial.

// ItemKey is where the publisher puts the claim-checked item itemID of job
// jobID: named by the SHA-256 of the item's id (ids are unique in a job), so
// that the subscriber can compute, from the message alone, the one key a
// reference to that item may name (subscriber/receive.go).
func ItemKey(jobID, itemID string) string {
	sum := sha256.Sum256([]byte(itemID))
	return "payloads/" + jobID + "/" + hex.EncodeToString(sum[:]) + ".json"
}

// AnswersPrefix is what the keys of the answers kept for chunk chunk of job
// jobID, sent by tenant, start with: {owner} is the SHA-256 of the tenant,
// as in files/, so that one tenant's chunk never reads another's answers.
func AnswersPrefix(tenant, jobID string, chunk int) string {
	sum := sha256.Sum256([]byte(tenant))
	return "answers/" + hex.EncodeToString(sum[:]) + "/" + jobID + "/" + strconv.Itoa(chunk) + "/"
}

// AnswerKey is where the Output of item itemID is kept under an
// AnswersPrefix: named by the SHA-256 of the item's id, as ItemKey is.
func AnswerKey(prefix, itemID string) string {
	sum := sha256.Sum256([]byte(itemID))
	return prefix + hex.EncodeToString(sum[:]) + ".json"
}

// ManifestKey is where job jobID's Manifest is.
func ManifestKey(jobID string) string { return "jobs/" + jobID + ".json" }

// IdempotencyKey is where the record of an Idempotency-Key, by its SHA-256
// in hex, is.
func IdempotencyKey(sha256hex string) string { return "idempotency/" + sha256hex + ".json" }

// ResultKey is where the Result of chunk chunk of job jobID is.
func ResultKey(jobID string, chunk int) string {
	return ResultPrefix(jobID) + strconv.Itoa(chunk) + ".json"
}

// FailedKey is where the FailedMarker of chunk chunk of job jobID is.
func FailedKey(jobID string, chunk int) string {
	return FailedPrefix(jobID) + strconv.Itoa(chunk) + ".json"
}

// ResultPrefix and FailedPrefix are what the keys of a job's results and
// failed markers start with, to list them.
func ResultPrefix(jobID string) string { return "results/" + jobID + "/" }
func FailedPrefix(jobID string) string { return "failed/" + jobID + "/" }

// CancelKey is where job jobID's CancelRecord is.
func CancelKey(jobID string) string { return "cancel/" + jobID + ".json" }

// CancelledKey is where the CancelledMarker of chunk chunk of job jobID is.
func CancelledKey(jobID string, chunk int) string {
	return CancelledPrefix(jobID) + strconv.Itoa(chunk) + ".json"
}

// CancelledPrefix is what the keys of a job's cancelled markers start with.
func CancelledPrefix(jobID string) string { return "cancelled/" + jobID + "/" }

// ItemErrorsKey is where the ItemErrorsMarker of chunk chunk of job jobID
// is.
func ItemErrorsKey(jobID string, chunk int) string {
	return ItemErrorsPrefix(jobID) + strconv.Itoa(chunk) + ".json"
}

// ItemErrorsPrefix is what the keys of a job's item-error markers start
// with: the publisher counts a job's failed items with one List and a read
// of each marker, not a read of every result.
func ItemErrorsPrefix(jobID string) string { return "itemerrors/" + jobID + "/" }

// DoneKey is where job jobID's done marker (its CompletionEvent) is: the subscriber that writes it
// first (a conditional write) sends the job's completion event.
func DoneKey(jobID string) string { return "done/" + jobID + ".json" }

// DoneRevisionKey is where the done marker of revision rev of job jobID's
// completion event is: DoneKey for the first, done/{job_id}.{rev}.json for
// each correction (a job id has no '.', so no other job's marker is named
// so). One key a revision, each written with a conditional write, so that
// of the subscribers that find a correction due exactly one sends it.
func DoneRevisionKey(jobID string, rev int) string {
	if rev <= 1 {
		return DoneKey(jobID)
	}
	return "done/" + jobID + "." + strconv.Itoa(rev) + ".json"
}

// FilesPrefix is what the keys of owner's files start with, to list them.
func FilesPrefix(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return "files/" + hex.EncodeToString(sum[:]) + "/"
}

// FileKey is where the content of owner's file fileID is.
func FileKey(owner, fileID string) string { return FilesPrefix(owner) + fileID + ".jsonl" }

// FileRecordKey is where the record of owner's file fileID is: written once
// its content is stored whole and checked, and deleted first, so a file with
// a record always has its content.
func FileRecordKey(owner, fileID string) string { return FilesPrefix(owner) + fileID + ".json" }

// BatchesPrefix is what the keys of owner's batches start with, to list them.
func BatchesPrefix(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return "batches/" + hex.EncodeToString(sum[:]) + "/"
}

// BatchKey is where the record of owner's batch batchID is.
func BatchKey(owner, batchID string) string { return BatchesPrefix(owner) + batchID + ".json" }

// BatchIDsKey is where the custom ids of owner's batch batchID are, in the
// order of its input file's lines: what its output and error files are
// written from for lines that have no result.
func BatchIDsKey(owner, batchID string) string { return BatchesPrefix(owner) + batchID + ".ids" }

// OpenBatchesPrefix is what the keys of the batches not yet ended start
// with: the publisher's sweeper lists it, so that its pass costs what the
// open batches number, not every batch ever made. It is under batches/ (its
// expiry and the publisher's grants), and "open" is no owner's hash.
const OpenBatchesPrefix = "batches/open/"

// OpenBatchKey marks owner's batch batchID as open: written before its
// record at create, deleted once the batch has ended. The key names the
// record (OpenBatchRecord), so the sweeper reads no marker.
func OpenBatchKey(owner, batchID string) string {
	return OpenBatchesPrefix + strings.TrimPrefix(BatchesPrefix(owner), "batches/") + batchID
}

// OpenBatchRecord is the BatchKey of the batch an OpenBatchKey marks.
func OpenBatchRecord(openKey string) (string, bool) {
	rest, ok := strings.CutPrefix(openKey, OpenBatchesPrefix)
	if !ok || rest == "" || strings.HasSuffix(rest, "/") {
		return "", false
	}
	return "batches/" + rest + ".json", true
}
