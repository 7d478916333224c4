package batches

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/jobs"
)

// Batches, as OpenAI's Batch API has them (its API reference, "Batch"):
// POST /v1/batches makes a batch of a file uploaded with purpose "batch",
// GET /v1/batches/{id} and GET /v1/batches read them, and POST
// /v1/batches/{id}/cancel cancels one. A batch is a job whose id is the
// batch's: each line of its file is an item of the job, whose id is the
// line's custom_id and whose body is the line's request, and the job's
// results become the batch's output and error files when it settles.
//
// The batch's record (job.BatchKey) is written validating when the batch is
// created; its validator makes it in_progress once every chunk is sent, or
// failed with every bad line named (batchvalidate.go); from then on one owner moves it, by
// conditional writes (batchstate.go): the finalizer ends it once its job has
// settled, and the sweeper expires it at its window. Reads never write:
// between the record's states, the counts are read from the job, and
// cancelling from its cancel record, which is what a cancel writes.

// Batch statuses: OpenAI's.
const (
	batchValidating = "validating"
	batchFailed     = "failed"
	batchInProgress = "in_progress"
	batchFinalizing = "finalizing"
	batchCompleted  = "completed"
	batchExpired    = "expired"
	batchCancelling = "cancelling"
	batchCancelled  = "cancelled"
)

// Error codes of the batch routes (docs/api.md), and of errors.data[] of a
// batch that failed validation.
const (
	CodeBatchNotCancellable = "batch_not_cancellable" // 409: the batch has already ended
	// CodeBatchBusy: 503 when the files being read into batches at once
	// are at their bound for 30 s; 429 when the client is already creating
	// one.
	CodeBatchBusy = "batch_busy"
	// Validation of a batch's input file (errors.data[].code).
	CodeInvalidJSONLine    = "invalid_json_line"
	CodeInvalidCustomID    = "invalid_custom_id"
	CodeDuplicateCustomID  = "duplicate_custom_id"
	CodeInvalidMethod      = "invalid_method"
	CodeMismatchedURL      = "mismatched_url"
	CodeEmptyFile          = "empty_file"
	CodeTooManyErrors      = "too_many_errors"
	CodeEnqueueInterrupted = "enqueue_interrupted"
	// A line for an endpoint of OpenAI's that no subscriber serves
	// (job.BatchEndpoints).
	CodeEndpointNotServed = "endpoint_not_served"
	// Over OpenAI's 50,000 embedding inputs a batch.
	CodeTooManyEmbeddingInputs = "too_many_embedding_inputs"
)

// maxBatchEmbeddingInputs is OpenAI's bound on the inputs of all the
// embeddings requests of one batch (its Batch API guide, "Rate limits").
const maxBatchEmbeddingInputs = 50_000

// completionWindow is the one window OpenAI offers, and so the one a batch
// may ask for.
const (
	completionWindow   = "24h"
	completionDuration = 24 * time.Hour
)

// Metadata bounds, OpenAI's: 16 pairs, keys of 64 characters, values of 512.
const (
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// Listing: OpenAI's limit for batches, 1 to 100, 20 by default.
const (
	defaultBatchList = 20
	maxBatchList     = 100
)

// maxBatchErrors bounds the bad lines a failed batch names one by one; one
// more entry says how many more there were. All 50,000 lines of a file can
// be bad, and every GET of the batch would carry them all.
const maxBatchErrors = 1000

// batchSendStale is how long a batch may stay validating before it is taken
// for one whose publisher died while sending its chunks: far longer than a
// send may take (jobs.Detach's 90 s).
const batchSendStale = 10 * time.Minute

// maxBatchRequest bounds POST /v1/batches's body: four fields and 16 pairs of
// metadata come to a few KiB.
const maxBatchRequest = 64 << 10

// maxBatchRecord bounds the read of a batch record: maxBatchErrors entries of
// a few hundred bytes at most, and the metadata.
const maxBatchRecord = 4 << 20

// Batch ids: "batch_", then a timeID, as file ids: they sort as the batches
// were made, and are ids of the job grammar, so the batch's job has its id.
const batchIDPrefix = job.BatchIDPrefix

func newBatchID(now time.Time) string { return api.NewTimeID(batchIDPrefix, now) }

// validBatchID is checked before an id reaches an S3 key.
func validBatchID(id string) bool { return api.ValidTimeID(batchIDPrefix, id) }

// batchRecord is what the bucket keeps of a batch.
type batchRecord struct {
	V                int               `json:"v"`
	ID               string            `json:"id"`
	Owner            string            `json:"owner"` // the owner rule's (api.Gate.Owns)
	Endpoint         string            `json:"endpoint"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	// OutputExpiresAfter is how long the output and error files are kept, in
	// seconds; 0 for the files' default.
	OutputExpiresAfter int64 `json:"output_expires_after,omitempty"`
	// Lines is the requests in the input file, the bad ones of a batch that
	// failed validation included.
	Lines int `json:"lines"`
	// Model is the model of the file's first request: OpenAI's Batch.model.
	Model string `json:"model,omitempty"`
	// Tenant is the tenant of the key that created the batch, whose job it
	// is (the chunks' attribute).
	Tenant string `json:"tenant,omitempty"`
	// ValidatingAt is when a validator claimed the batch, or last said it
	// was still at work (batchvalidate.go): 0 while no one has.
	ValidatingAt int64 `json:"validating_at,omitempty"`
	// Status is validating, in_progress or failed until the job settles,
	// then finalizing (the finalizer's claim), then completed, cancelled or
	// expired (batchstate.go).
	Status       string       `json:"status"`
	Errors       []batchError `json:"errors,omitempty"`
	CreatedAt    int64        `json:"created_at"` // Unix seconds, as every time below
	ExpiresAt    int64        `json:"expires_at"`
	InProgressAt int64        `json:"in_progress_at,omitempty"`
	FailedAt     int64        `json:"failed_at,omitempty"`
	// Set by the finalizer (finalizeBatch).
	CancellingAt int64       `json:"cancelling_at,omitempty"`
	FinalizingAt int64       `json:"finalizing_at,omitempty"`
	EndedAt      int64       `json:"ended_at,omitempty"` // completed_at, cancelled_at or expired_at, by Status
	OutputFileID string      `json:"output_file_id,omitempty"`
	ErrorFileID  string      `json:"error_file_id,omitempty"`
	Completed    int         `json:"completed,omitempty"`
	Failed       int         `json:"failed,omitempty"`
	Usage        *batchUsage `json:"usage,omitempty"`
}

func (b *batchRecord) final() bool {
	switch b.Status {
	case batchCompleted, batchCancelled, batchExpired, batchFailed:
		return true
	}
	return false
}

// batchError is an entry of a batch's errors.data: OpenAI's BatchError.
type batchError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

// batchObject is a batch as the API answers it: OpenAI's Batch, with null
// for every time and file that is not there yet.
type batchObject struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Endpoint         string            `json:"endpoint"`
	Errors           *batchErrors      `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        *int64            `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    batchCounts       `json:"request_counts"`
	Usage            *batchUsage       `json:"usage,omitempty"`
	Model            string            `json:"model,omitempty"`
	Metadata         map[string]string `json:"metadata"`
}

type batchErrors struct {
	Object string       `json:"object"`
	Data   []batchError `json:"data"`
}

type batchCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// batchUsage is OpenAI's BatchUsage: the tokens the answers in the output
// and error files report, added up.
type batchUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

func at(t int64) *int64 {
	if t == 0 {
		return nil
	}
	return &t
}

func orNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// object is the record as the API answers it, with the counts c (a final
// record has its own).
func (b *batchRecord) object(c batchCounts) *batchObject {
	o := &batchObject{
		ID: b.ID, Object: "batch", Endpoint: b.Endpoint, InputFileID: b.InputFileID, CompletionWindow: b.CompletionWindow,
		Status: b.Status, OutputFileID: orNil(b.OutputFileID), ErrorFileID: orNil(b.ErrorFileID), CreatedAt: b.CreatedAt,
		InProgressAt: at(b.InProgressAt), ExpiresAt: at(b.ExpiresAt), FinalizingAt: at(b.FinalizingAt), FailedAt: at(b.FailedAt),
		CancellingAt: at(b.CancellingAt), RequestCounts: c, Usage: b.Usage, Model: b.Model, Metadata: b.Metadata,
	}
	if len(b.Errors) > 0 {
		o.Errors = &batchErrors{Object: "list", Data: b.Errors}
	}
	switch b.Status {
	case batchCompleted:
		o.CompletedAt = at(b.EndedAt)
	case batchCancelled:
		o.CancelledAt = at(b.EndedAt)
	case batchExpired:
		o.ExpiredAt = at(b.EndedAt)
	}
	switch {
	case b.Status == batchFailed:
		// Nothing of a batch that failed ran: every request failed with
		// it, so that the counts add up (total = completed + failed), as
		// they do for every other batch that has ended.
		o.RequestCounts = batchCounts{Total: b.Lines, Failed: b.Lines}
	case b.final():
		o.RequestCounts = batchCounts{Total: b.Lines, Completed: b.Completed, Failed: b.Failed}
	}
	return o
}

func noBatchStore() *api.Error {
	return api.Err(http.StatusNotImplemented, api.CodeStatusUnavailable,
		"batches need a payload bucket, and this publisher has none (-payload-bucket)")
}

func noBatch() *api.Error {
	return api.ParamErr(http.StatusNotFound, api.CodeNotFound, "id", "No such Batch object")
}

// batchRequest is POST /v1/batches's body: OpenAI's BatchNewParams.
type batchRequest struct {
	InputFileID        string            `json:"input_file_id"`
	Endpoint           string            `json:"endpoint"`
	CompletionWindow   string            `json:"completion_window"`
	Metadata           map[string]string `json:"metadata"`
	OutputExpiresAfter *struct {
		Anchor  string `json:"anchor"`
		Seconds int64  `json:"seconds"`
	} `json:"output_expires_after"`
}

func (q *batchRequest) check() *api.Error {
	bad := func(param, format string, a ...any) *api.Error {
		return api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, param, format, a...)
	}
	switch {
	case q.InputFileID == "":
		return bad("input_file_id", "input_file_id is required: the id of a file uploaded with purpose batch")
	case !slices.Contains(job.BatchEndpoints, q.Endpoint):
		return bad("endpoint", "endpoint must be one of %s", strings.Join(job.BatchEndpoints, ", "))
	case q.CompletionWindow != completionWindow:
		return bad("completion_window", "completion_window must be %q", completionWindow)
	case len(q.Metadata) > maxMetadataPairs:
		return bad("metadata", "metadata may hold at most %d pairs", maxMetadataPairs)
	}
	for k, v := range q.Metadata {
		if len([]rune(k)) > maxMetadataKey || len([]rune(v)) > maxMetadataValue {
			return bad("metadata", "a metadata key may be at most %d characters, and a value %d", maxMetadataKey, maxMetadataValue)
		}
	}
	if e := q.OutputExpiresAfter; e != nil && (e.Anchor != "created_at" || e.Seconds < int64(files.MinExpiry/time.Second) ||
		e.Seconds > int64(files.MaxExpiry/time.Second)) {
		return bad("output_expires_after", "output_expires_after must have anchor created_at and seconds from %d to %d",
			int64(files.MinExpiry/time.Second), int64(files.MaxExpiry/time.Second))
	}
	return nil
}

// postBatch is POST /v1/batches: the request and the input file's record
// are checked, and the batch is recorded validating and answered so, as
// OpenAI answers; its file is read, checked line by line and sent as one
// job after the answer (batchvalidate.go). A file with a bad line ends the
// batch failed, every bad line named, and nothing enqueued; otherwise the
// lines become the items of a job whose id is the batch's, and the batch is
// in_progress. A client polls either way.
func (p *Service) postBatch(w http.ResponseWriter, r *http.Request) {
	ri := api.Info(r)
	fail := api.FailWith(w, r)
	once, tenantName, done, ok := p.startCreate(w, r, fail)
	if !ok {
		return
	}
	defer done()
	// Read as a job's body is read (publisher/api/inflight.go): paced, and charged to the
	// client's bodies in flight.
	if r.ContentLength > maxBatchRequest {
		fail(api.Err(http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge, "the request body is over the limit of %d bytes", maxBatchRequest))
		return
	}
	body, release, err := p.gate.ReadBody(w, r)
	defer release()
	if err != nil {
		fail(p.gate.BodyError(w, err))
		return
	}
	if len(body) > maxBatchRequest {
		fail(api.Err(http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge, "the request body is over the limit of %d bytes", maxBatchRequest))
		return
	}
	var q batchRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		fail(jobs.DecodeError(err))
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		fail(api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "the body has data after the batch request"))
		return
	}
	if e := q.check(); e != nil {
		fail(e)
		return
	}
	sum := api.RequestSum("POST /v1/batches", body)
	if once != nil {
		// A retry of a create that answered 200 gets that answer again,
		// and no second batch (publisher/api/idempotency.go).
		if !once.Start(r, w, api.KindBatch, sum, fail) {
			return
		}
		defer once.Fail(r.Context())
	}
	owner := p.gate.Owner(r)
	if !files.ValidID(q.InputFileID) {
		fail(api.ParamErr(http.StatusNotFound, api.CodeNotFound, "input_file_id", "No such File object"))
		return
	}
	f, err := p.files.ReadRecord(r, job.FileRecordKey(owner, q.InputFileID))
	switch {
	case errors.Is(err, payload.ErrMissing) || err == nil && f.ID != q.InputFileID:
		fail(api.ParamErr(http.StatusNotFound, api.CodeNotFound, "input_file_id", "No such File object"))
		return
	case err != nil:
		p.log.Error("reading a file record", "file_id", q.InputFileID, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the input file's record could not be read"))
		return
	case f.Purpose != files.PurposeBatch:
		fail(api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "input_file_id",
			"the input file was not uploaded with purpose batch"))
		return
	}

	now := p.now().UTC()
	b := &batchRecord{V: batchRecordVersion, ID: newBatchID(now), Owner: owner, Endpoint: q.Endpoint, InputFileID: f.ID,
		CompletionWindow: q.CompletionWindow, Metadata: q.Metadata, Tenant: tenantName, Status: batchValidating,
		CreatedAt: now.Unix(), ExpiresAt: now.Add(completionDuration).Unix()}
	if q.OutputExpiresAfter != nil {
		b.OutputExpiresAfter = q.OutputExpiresAfter.Seconds
	}
	ri.JobID = b.ID
	// The marker first, so that no batch is left without one; then the
	// record, validating, for the validator to claim (batchvalidate.go).
	if err := p.openBatch(r.Context(), b); err != nil {
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batch could not be recorded"))
		return
	}
	if err := p.putBatch(r.Context(), b); err != nil {
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batch could not be recorded"))
		return
	}
	p.nudge(job.BatchKey(b.Owner, b.ID))
	once.Answer(r.Context(), w, sum, b.object(batchCounts{}))
}

// putBatch writes b's record.
func (p *Service) putBatch(ctx context.Context, b *batchRecord) error {
	raw, err := json.Marshal(b)
	if err == nil {
		_, err = p.store.Put(ctx, job.BatchKey(b.Owner, b.ID), raw)
	}
	if err != nil {
		p.log.Error("writing a batch record", "batch_id", b.ID, "err", err)
	}
	return err
}

// readBatch reads the record of owner's batch id: payload.ErrMissing
// (wrapped) when there is none, or it is not the caller's.
func (p *Service) readBatch(r *http.Request, owner, id string) (*batchRecord, error) {
	raw, err := p.store.ReadLimit(r.Context(), job.BatchKey(owner, id), maxBatchRecord)
	if err != nil {
		return nil, err
	}
	var b batchRecord
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, fmt.Errorf("batch record %s: %w", id, err)
	}
	if b.ID != id || !p.gate.Owns(r, b.Owner) {
		return nil, payload.ErrMissing
	}
	return &b, nil
}

// openAIBatches are the /v1/batches routes' batches.
func (p *Service) openAIBatches() batchRoute[*batchObject] {
	return batchRoute[*batchObject]{valid: validBatchID, missing: noBatch,
		view: func(r *http.Request, b *batchRecord) (*batchObject, error) { return p.batchView(r.Context(), b) }}
}

// loadBatch reads the batch r's path names and how it stands (batchView),
// answering r itself (and returning nil) when that fails.
func (p *Service) loadBatch(w http.ResponseWriter, r *http.Request) (*batchRecord, *batchObject, func(*api.Error)) {
	b, o, fail, _ := p.openAIBatches().load(p, w, r)
	return b, o, fail
}

// getBatch is GET /v1/batches/{id}.
func (p *Service) getBatch(w http.ResponseWriter, r *http.Request) {
	if _, o, _ := p.loadBatch(w, r); o != nil {
		api.WriteJSON(w, http.StatusOK, o)
	}
}

// cancelBatch is POST /v1/batches/{id}/cancel: the job is cancelled (its
// cancel record, the command), so lines not yet run are not run, and the
// batch is cancelling until its running chunks end; the finalizer then ends
// it cancelled, with what finished in its output file (batchstate.go). A
// batch cancelling or cancelled already is answered as it is; one that has
// ended otherwise, or is finalizing, is a 409.
func (p *Service) cancelBatch(w http.ResponseWriter, r *http.Request) {
	b, o, fail := p.loadBatch(w, r)
	if o == nil {
		return
	}
	switch o.Status {
	case batchCancelling, batchCancelled:
		api.WriteJSON(w, http.StatusOK, o)
		return
	case batchCompleted, batchFailed, batchExpired, batchFinalizing:
		fail(api.Err(http.StatusConflict, CodeBatchNotCancellable, "the batch is %s: it can no longer be cancelled", o.Status))
		return
	}
	p.openAIBatches().cancel(p, w, r, b, fail)
}

// listBatches is GET /v1/batches: the caller's batches, newest first, limit
// of them after the batch after names (which need not still exist). Each
// is read as GET reads one, api.ReadConcurrency at a time.
func (p *Service) listBatches(w http.ResponseWriter, r *http.Request) {
	limit, fail, ok := p.openAIBatches().startList(p, w, r, defaultBatchList, maxBatchList)
	if !ok {
		return
	}
	q := r.URL.Query()
	after := q.Get("after")
	if after != "" && !validBatchID(after) {
		fail(api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "after", "after must be the id of a batch"))
		return
	}
	owner := p.gate.Owner(r)
	all, err := api.ListIDs(r.Context(), p.store, job.BatchesPrefix(owner), validBatchID)
	if err != nil {
		p.log.Error("listing batches", "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batches could not be listed"))
		return
	}
	// Newest first, past after.
	var ids []string
	for _, id := range slices.Backward(all) {
		if after == "" || id < after {
			ids = append(ids, id)
		}
	}
	more := len(ids) > limit
	if more {
		ids = ids[:limit]
	}
	data, err := p.openAIBatches().readAll(p, r, owner, ids)
	if err != nil {
		p.log.Error("reading batches", "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batches could not be listed"))
		return
	}
	out := api.NewListPage(data, more, func(o *batchObject) string { return o.ID })
	api.WriteJSON(w, http.StatusOK, out)
}

// keySet is a set of keys taken one at a time: the clients with a batch
// being created, the batches being advanced.
type keySet struct {
	mu sync.Mutex
	in map[string]bool
}

// add adds key, reporting false when it was there already.
func (s *keySet) add(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.in[key] {
		return false
	}
	if s.in == nil {
		s.in = map[string]bool{}
	}
	s.in[key] = true
	return true
}

func (s *keySet) remove(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.in, key)
}
