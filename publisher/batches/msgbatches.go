package batches

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/jobs"
)

// Anthropic's Message Batches, as its API reference has them ("Create a
// Message Batch", https://docs.anthropic.com/en/api/creating-message-batches,
// and beside it retrieving, listing, canceling, deleting and results;
// "Errors", https://docs.anthropic.com/en/api/errors; "Versions",
// https://docs.anthropic.com/en/api/versioning):
//
//	POST   /v1/messages/batches                {"requests": [{"custom_id", "params"}]}
//	GET    /v1/messages/batches/{id}            the MessageBatch
//	GET    /v1/messages/batches                 before_id, after_id, limit 1 to 1000
//	POST   /v1/messages/batches/{id}/cancel
//	DELETE /v1/messages/batches/{id}            once ended
//	GET    /v1/messages/batches/{id}/results    JSONL, {"custom_id", "result": {"type", ...}}
//
// A message batch is a batch of the Batch API's state machine
// (batchstate.go) whose requests come inline rather than from a file: the
// same record, job, chunks, sweeper, cancel and finalizer, told apart by
// its id's prefix (msgbatch_). Its finalizer writes one results file in
// Anthropic's shape (finalizeMessageBatch) where an OpenAI batch's writes
// output and error files; its record's Completed and Failed are then the
// succeeded and errored requests, and the rest were canceled or expired,
// by the record's status. The routes take x-api-key as the API key (the
// same keys, tenants and owners as every route) and require
// anthropic-version; their errors take Anthropic's shape.

const (
	msgBatchIDPrefix = job.MessageBatchIDPrefix
	// Anthropic's bounds of one create: 100,000 requests or 256 MB.
	maxMsgBatchRequests = 100_000
	maxMsgBatchBytes    = 256 << 20
	// msgResultsKept is how long after its creation a batch's results may
	// be read: Anthropic's 29 days.
	msgResultsKept = 29 * 24 * time.Hour
	// Listing: Anthropic's limit, 1 to 1000, 20 by default.
	defaultMsgBatchList = 20
	maxMsgBatchList     = 1000
	// maxCustomID is Anthropic's custom_id bound: 1 to 64 of
	// [a-zA-Z0-9_-].
	maxCustomID = 64
)

func newMessageBatchID(now time.Time) string { return api.NewTimeID(msgBatchIDPrefix, now) }

// validMessageBatchID is checked before an id reaches an S3 key.
func validMessageBatchID(id string) bool { return api.ValidTimeID(msgBatchIDPrefix, id) }

// isMessageBatch tells a message batch's record from an OpenAI batch's.
func isMessageBatch(b *batchRecord) bool { return strings.HasPrefix(b.ID, msgBatchIDPrefix) }

// msgResultsKey is where the results of owner's message batch id are,
// beside its record.
func msgResultsKey(owner, id string) string { return job.BatchesPrefix(owner) + id + ".results.jsonl" }

// messageBatchRoutes registers the routes on mux.
func (p *Service) messageBatchRoutes(mux *http.ServeMux) {
	route := func(pattern string, h http.HandlerFunc) {
		mux.Handle(pattern, api.Anthropic(p.gate.Auth(p.gate.RateLimit(h))))
	}
	route("POST /v1/messages/batches", p.postMessageBatch)
	route("GET /v1/messages/batches", p.listMessageBatches)
	route("GET /v1/messages/batches/{id}", p.getMessageBatch)
	route("DELETE /v1/messages/batches/{id}", p.deleteMessageBatch)
	route("POST /v1/messages/batches/{id}/cancel", p.cancelMessageBatch)
	route("GET /v1/messages/batches/{id}/results", p.messageBatchResults)
	shaped := func(pattern string, h http.HandlerFunc) {
		mux.Handle(pattern, api.AnthropicErrors(h))
	}
	shaped("/v1/messages/batches", api.MethodNotAllowed("GET, HEAD, POST"))
	shaped("/v1/messages/batches/{id}", api.MethodNotAllowed("GET, HEAD, DELETE"))
	shaped("/v1/messages/batches/{id}/cancel", api.MethodNotAllowed("POST"))
	shaped("/v1/messages/batches/{id}/results", api.MethodNotAllowed("GET, HEAD"))
	shaped("/v1/messages/batches/", api.NotFound)
}

// messageBatch is Anthropic's MessageBatch.
type messageBatch struct {
	ID                string        `json:"id"`
	Type              string        `json:"type"`
	ProcessingStatus  string        `json:"processing_status"`
	RequestCounts     messageCounts `json:"request_counts"`
	EndedAt           *string       `json:"ended_at"`
	CreatedAt         string        `json:"created_at"`
	ExpiresAt         string        `json:"expires_at"`
	ArchivedAt        *string       `json:"archived_at"`
	CancelInitiatedAt *string       `json:"cancel_initiated_at"`
	ResultsURL        *string       `json:"results_url"`
}

type messageCounts struct {
	Processing int `json:"processing"`
	Succeeded  int `json:"succeeded"`
	Errored    int `json:"errored"`
	Canceled   int `json:"canceled"`
	Expired    int `json:"expired"`
}

// Anthropic's processing statuses.
const (
	msgInProgress = "in_progress"
	msgCanceling  = "canceling"
	msgEnded      = "ended"
)

// rfc3339 is Unix time t as Anthropic's times are written; nil for 0.
func rfc3339(t int64) *string {
	if t == 0 {
		return nil
	}
	s := time.Unix(t, 0).UTC().Format(time.RFC3339)
	return &s
}

// messageBatchView is b as Anthropic's MessageBatch, read as batchView
// reads an OpenAI batch (and never written): validating and in_progress
// are in_progress; a cancel before the window's end is canceling until the
// finalizer ends the batch; the ended ones count from their record. Until
// then, the requests of the job's failed and cancelled chunks are counted
// errored (the job's counts do not tell a cancelled chunk from a failed
// one); the finalizer's counts tell them apart.
func (p *Service) messageBatchView(r *http.Request, b *batchRecord) (*messageBatch, error) {
	o, err := p.batchView(r.Context(), b)
	if err != nil {
		return nil, err
	}
	mb := &messageBatch{ID: b.ID, Type: "message_batch", ProcessingStatus: msgInProgress, CreatedAt: *rfc3339(b.CreatedAt),
		ExpiresAt: *rfc3339(b.ExpiresAt), CancelInitiatedAt: rfc3339(b.CancellingAt)}
	c := o.RequestCounts
	switch o.Status {
	case batchCompleted, batchCancelled, batchExpired:
		mb.ProcessingStatus, mb.EndedAt = msgEnded, rfc3339(b.EndedAt)
		mb.RequestCounts = messageCounts{Succeeded: b.Completed, Errored: b.Failed}
		if notRun := b.Lines - b.Completed - b.Failed; o.Status == batchExpired {
			mb.RequestCounts.Expired = notRun
		} else {
			mb.RequestCounts.Canceled = notRun
		}
		if p.now().Before(time.Unix(b.CreatedAt, 0).Add(msgResultsKept)) {
			u := p.apiOrigin(r) + "/v1/messages/batches/" + b.ID + "/results"
			mb.ResultsURL = &u
		}
		return mb, nil
	case batchFailed:
		// Its chunks were not all sent (a publisher stopped mid-create):
		// nothing of it runs, and it has no results.
		mb.ProcessingStatus, mb.EndedAt = msgEnded, rfc3339(b.FailedAt)
		mb.RequestCounts = messageCounts{Errored: b.Lines}
		return mb, nil
	}
	mb.RequestCounts = messageCounts{Processing: c.Total - c.Completed - c.Failed, Succeeded: c.Completed, Errored: c.Failed}
	at := o.CancellingAt
	if o.Status == batchFinalizing {
		// Settled, or claimed by the finalizer: cancelled or not is the
		// job's cancel record's to say.
		if at, err = p.cancelledBefore(r.Context(), b); err != nil {
			return nil, err
		}
	}
	if at != nil {
		mb.ProcessingStatus, mb.CancelInitiatedAt = msgCanceling, rfc3339(*at)
	}
	return mb, nil
}

// cancelledBefore is when b's job was cancelled, if that was before its
// window's end (a cancel at or after it is the expiry).
func (p *Service) cancelledBefore(ctx context.Context, b *batchRecord) (*int64, error) {
	c, err := p.jobs.CancelRecord(ctx, b.ID)
	if err != nil || c == nil {
		return nil, err
	}
	if at := c.At.Unix(); at < b.ExpiresAt {
		return &at, nil
	}
	return nil, nil
}

// apiOrigin is where clients reach this API: Config.PublicURL, else the
// request's own host (behind a proxy that ends TLS, set PublicURL).
func (p *Service) apiOrigin(r *http.Request) string {
	if p.fileCfg.PublicURL != "" {
		return strings.TrimSuffix(p.fileCfg.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// postMessageBatch is POST /v1/messages/batches. Every request is checked
// before anything is sent, params by the rule a job's item is checked by
// (job.CheckRequest for /v1/messages): a bad one refuses the whole create,
// naming it, where Anthropic would accept the batch and error the request
// at its turn; nothing is then enqueued. The requests become the items of
// one job, custom_id the item id, params the body, sent as a batch's
// (startBatch).
//
// The create holds what an OpenAI batch's validation holds (batchvalidate.go),
// not its requests: as each is read and checked, it is written on to a staged
// copy in the bucket (msgRequestsKey) and only its custom id and the size of
// its encoding are kept, which is enough to cut the chunks; the staged copy
// is then read back and sent a window of chunks at a time, and deleted.
func (p *Service) postMessageBatch(w http.ResponseWriter, r *http.Request) {
	ri := api.Info(r)
	fail := api.FailWith(w, r)
	once, tenantName, done, ok := p.startCreate(w, r, fail)
	if !ok {
		return
	}
	defer done()
	tooLarge := api.Err(http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge, "the request body is over the limit of %d bytes", maxMsgBatchBytes)
	if r.ContentLength > maxMsgBatchBytes {
		fail(tooLarge)
		return
	}
	// Charged as before the create streamed its requests, under the same
	// bound of bytes read at once: now more than it holds (a part of the
	// staged upload, a window of chunks, an id and a size a request), which
	// keeps the bound's meaning for the operator (-max-file-bytes).
	charge := p.fileCfg.MaxFileBytes
	if r.ContentLength >= 0 {
		charge = min(r.ContentLength, charge)
	}
	release, ok := p.takeBatchBytes(w, r, fail, charge)
	if !ok {
		return
	}
	defer release()
	// Read at the pace every body must keep (api.BodyPace): a create that
	// trickles would hold its share of the bytes above from others. And
	// charged to the client's bodies in flight as an upload is (a body
	// that may be far larger than a job's: up to what an upload holds),
	// so that a client's creates and its other bodies share one bound.
	bodies, err := p.gate.OpenUpload(r)
	if err != nil {
		fail(p.gate.BodyError(w, err))
		return
	}
	defer bodies.Release()
	pace := api.StartPace(float64(p.fileCfg.MinBodyRate), p.fileCfg.BodyGrace, api.CutRead(w))
	read := &countedBody{r: files.NewUploadBody(http.MaxBytesReader(w, r.Body, maxMsgBatchBytes), bodies, pace, p.fileCfg.UploadHeld)}
	var body io.Reader = read
	// With an Idempotency-Key, the body's digest, taken as it is read (a
	// create is read to its end when it is taken), to compare a retry with.
	digest := sha256.New()
	if once != nil {
		body = io.TeeReader(body, digest)
	}
	now := p.now().UTC()
	owner := p.gate.Owner(r)
	b := &batchRecord{V: 1, ID: newMessageBatchID(now), Owner: owner, Endpoint: job.EndpointMessages,
		CompletionWindow: completionWindow, CreatedAt: now.Unix(), ExpiresAt: now.Add(completionDuration).Unix()}
	s := &stagedRequests{p: p, key: msgRequestsKey(owner, b.ID), measure: p.jobs.Measure(b.ID, job.EndpointMessages)}
	defer s.remove()
	tooSlow := false
	e := s.stage(r.Context(), body, func(pw io.Writer) io.Writer { return pausedWrite{w: pw, read: read, pace: pace} },
		func() { tooSlow = pace.Stop() })
	if tooSlow {
		fail(p.gate.BodyError(w, api.ErrTooSlow))
		return
	}
	if err := read.r.Err(); err != nil && !errors.As(err, new(*http.MaxBytesError)) {
		fail(p.gate.BodyError(w, err)) // over the client's share, or the uploads'
		return
	}
	if e != nil {
		if e.Status == http.StatusRequestEntityTooLarge && e.Code == api.CodeBodyTooLarge {
			e = tooLarge
		}
		fail(e)
		return
	}
	// The key is claimed once the request is known whole, as postBatch
	// claims it: a retry of a create that was answered gets that answer
	// again, and no second batch (publisher/api/idempotency.go).
	sum := api.RequestSum("POST /v1/messages/batches", digest.Sum(nil))
	if once != nil {
		if !once.Start(r, w, api.KindMessageBatch, sum, fail) {
			return
		}
		defer once.Fail(r.Context())
	}
	ri.JobID, b.Lines = b.ID, s.requests
	if e := p.startBatch(r.Context(), b, s, tenantName, ri); e != nil {
		fail(e)
		return
	}
	mb, err := p.messageBatchView(r, b)
	if err != nil {
		// Sent and running: answer what the record says.
		mb = &messageBatch{ID: b.ID, Type: "message_batch", ProcessingStatus: msgInProgress, CreatedAt: *rfc3339(b.CreatedAt),
			ExpiresAt: *rfc3339(b.ExpiresAt), RequestCounts: messageCounts{Processing: b.Lines}}
	}
	once.Answer(r.Context(), w, sum, mb)
}

// msgRequestsKey is where a create stages the requests of owner's message
// batch id while it sends them (stagedRequests), beside its record.
func msgRequestsKey(owner, id string) string { return job.BatchesPrefix(owner) + id + ".requests.json" }

// stagedRequests is a create's requests as it holds them: their custom ids
// (job.BatchIDsKey's form) and the sizes of their encodings (measure); the
// requests themselves are in the bucket, at key.
type stagedRequests struct {
	p        *Service
	key      string
	measure  *jobs.Measure
	ids      []byte
	requests int
	stored   bool
}

// stage reads the create's body, checking each request, keeping its id and
// size and writing it on to the staged copy; the error names the first bad
// request (a 413 when the body is over its bound). An item that cannot be
// sent (over a message without a payload bucket) is refused after every
// request is checked, as a plan of them all refused it. read is called once
// the body is read, before the upload's last part is sent: the client is
// not held to its pace for that.
func (s *stagedRequests) stage(ctx context.Context, body io.Reader, paused func(io.Writer) io.Writer, read func()) *api.Error {
	pr, pw := io.Pipe()
	uploaded := make(chan error, 1)
	go func() {
		_, err := s.p.store.Upload(ctx, s.key, "application/json", pr)
		pr.CloseWithError(err) // a write after a failed upload fails rather than blocks
		uploaded <- err
	}()
	out := bufio.NewWriterSize(paused(pw), 64<<10)
	var unsendable *api.Error
	n, e := s.p.readMessageRequests(body, func(it jobs.RequestItem) {
		if unsendable == nil {
			unsendable = s.measure.Add(it)
		}
		s.ids = append(append(s.ids, api.EncodeJSON(it.ID)...), '\n')
		// A JSON value a request, its params byte for byte as they came
		// (and were measured): the second read decodes them one after
		// another. out's first error stays, for Flush to return.
		out.WriteString(`{"custom_id":`)
		out.Write(api.EncodeJSON(it.ID))
		out.WriteString(`,"params":`)
		out.Write(it.Body)
		out.WriteByte('}')
	})
	read()
	werr := out.Flush()
	switch {
	case e != nil:
		pw.CloseWithError(errors.New("the create was refused"))
	case werr != nil:
		pw.CloseWithError(werr)
	default:
		pw.Close()
	}
	uerr := <-uploaded
	switch {
	case e != nil:
		return e
	case unsendable != nil:
		return unsendable
	case uerr != nil:
		s.p.log.Error("staging a message batch's requests", "key", s.key, "err", uerr)
		return api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batch's requests could not be stored; nothing was sent")
	}
	s.requests, s.stored = n, true
	return nil
}

// remove deletes the staged copy, whatever became of the create.
func (s *stagedRequests) remove() {
	if !s.stored {
		return // a failed upload leaves nothing
	}
	ctx, cancel := jobs.Detach(context.Background())
	defer cancel()
	if err := s.p.store.Delete(ctx, s.key); err != nil && !errors.Is(err, payload.ErrMissing) {
		s.p.log.Warn("deleting a message batch's staged requests", "key", s.key, "err", err)
	}
}

// send reads the staged requests back, in order, into out.
func (s *stagedRequests) send(ctx context.Context, out *jobs.Stream) error {
	staged, _, err := s.p.store.Open(ctx, s.key)
	if err != nil {
		return err
	}
	defer staged.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(staged, 64<<10))
	for range s.requests {
		var q messageRequest
		if err := dec.Decode(&q); err != nil {
			return fmt.Errorf("reading the staged requests: %w", err)
		}
		if q.CustomID == nil {
			return errors.New("reading the staged requests: a request without its custom_id")
		}
		if err := out.Add(ctx, jobs.RequestItem{ID: *q.CustomID, Body: q.Params}); err != nil {
			return err
		}
	}
	return out.Close(ctx)
}

// countedBody is the create's body, counting what has come of it for its
// pace's Resume.
type countedBody struct {
	r       *files.UploadBody
	arrived int64
}

func (c *countedBody) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.arrived += int64(n)
	return n, err
}

// pausedWrite is the staged copy's pipe as the body's reader writes to it:
// the body's pace stops while a write waits for the upload, which reads
// nothing while it sends a part to S3, so that the client is not held to
// its pace for the bucket's time. It is written from the goroutine that
// reads the body, so no read of the body is watched while paused.
type pausedWrite struct {
	w    io.Writer
	read *countedBody
	pace *api.BodyPace
}

func (p pausedWrite) Write(b []byte) (int, error) {
	p.pace.Pause()
	defer p.pace.Resume(p.read.arrived)
	return p.w.Write(b)
}

// messageRequest is an element of a create's requests.
type messageRequest struct {
	CustomID *string         `json:"custom_id"`
	Params   json.RawMessage `json:"params"`
}

// readMessageRequests reads a create's body, {"requests": [...]}, one
// request at a time, handing each good one to good as it is read: how many
// there were, or the error that names the first bad request (a 413 when the
// body is over its bound).
func (p *Service) readMessageRequests(body io.Reader, good func(jobs.RequestItem)) (int, *api.Error) {
	dec := json.NewDecoder(body)
	bad := func(format string, a ...any) (int, *api.Error) {
		return 0, api.Err(http.StatusBadRequest, api.CodeInvalidParameter, format, a...)
	}
	malformed := func(err error) (int, *api.Error) {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return 0, api.Err(http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge, "the request body is too large")
		}
		return 0, api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "the body is not the JSON of a create: {\"requests\": [{\"custom_id\", \"params\"}]}")
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return malformed(err)
	}
	n := 0
	seen := false
	lim := p.jobs.Limits()
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return malformed(err)
		}
		if t != "requests" || seen {
			return bad("the body may hold requests once, and nothing else")
		}
		seen = true
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return malformed(err)
		}
		ids := map[string]struct{}{}
		for i := 0; dec.More(); i++ {
			if i == maxMsgBatchRequests {
				return bad("requests: a batch holds at most %d requests", maxMsgBatchRequests)
			}
			var q messageRequest
			if err := dec.Decode(&q); err != nil {
				return malformed(err)
			}
			if q.CustomID == nil || !validCustomID(*q.CustomID) {
				return bad("requests.%d.custom_id: must be 1 to %d letters, digits, '-' or '_'", i, maxCustomID)
			}
			if _, dup := ids[*q.CustomID]; dup {
				return bad("requests.%d.custom_id: the custom_id is that of an earlier request; each must be unique", i)
			}
			ids[*q.CustomID] = struct{}{}
			if len(q.Params) == 0 || q.Params[0] != '{' {
				return bad("requests.%d.params: must be an object, the request for /v1/messages", i)
			}
			if e := lim.CheckBody(job.EndpointMessages, q.Params); e != nil {
				return bad("requests.%d.params: %s", i, e.Message)
			}
			good(jobs.RequestItem{ID: *q.CustomID, Body: q.Params})
			n++
		}
		if t, err := dec.Token(); err != nil || t != json.Delim(']') {
			return malformed(err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return malformed(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("the body has data after the create")
	}
	if n == 0 {
		return bad("requests: a batch holds at least one request")
	}
	return n, nil
}

func validCustomID(id string) bool {
	if id == "" || len(id) > maxCustomID {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// messageBatches are the /v1/messages/batches routes' batches.
func (p *Service) messageBatches() batchRoute[*messageBatch] {
	return batchRoute[*messageBatch]{valid: validMessageBatchID, missing: noMessageBatch, view: p.messageBatchView}
}

// loadMessageBatch reads the message batch r's path names, as it stands,
// answering r itself (and returning nil) when that fails.
func (p *Service) loadMessageBatch(w http.ResponseWriter, r *http.Request) (*batchRecord, *messageBatch, func(*api.Error)) {
	b, mb, fail, _ := p.messageBatches().load(p, w, r)
	return b, mb, fail
}

func noMessageBatch() *api.Error {
	return api.Err(http.StatusNotFound, api.CodeNotFound, "message batch not found")
}

// getMessageBatch is GET /v1/messages/batches/{id}.
func (p *Service) getMessageBatch(w http.ResponseWriter, r *http.Request) {
	if _, mb, _ := p.loadMessageBatch(w, r); mb != nil {
		api.WriteJSON(w, http.StatusOK, mb)
	}
}

// cancelMessageBatch is POST /v1/messages/batches/{id}/cancel: the job's
// cancel, as an OpenAI batch's (cancelBatch); the batch is canceling until
// its running chunks end, then ended with the requests not run canceled.
// A batch canceling or ended already is answered as it is.
func (p *Service) cancelMessageBatch(w http.ResponseWriter, r *http.Request) {
	b, mb, fail := p.loadMessageBatch(w, r)
	if mb == nil {
		return
	}
	if mb.ProcessingStatus != msgInProgress {
		api.WriteJSON(w, http.StatusOK, mb)
		return
	}
	p.messageBatches().cancel(p, w, r, b, fail)
}

// deleteMessageBatch is DELETE /v1/messages/batches/{id}: an ended batch's
// record, custom ids and results go; one still processing is refused, as
// Anthropic refuses it (cancel it first).
func (p *Service) deleteMessageBatch(w http.ResponseWriter, r *http.Request) {
	b, mb, fail := p.loadMessageBatch(w, r)
	if mb == nil {
		return
	}
	if mb.ProcessingStatus != msgEnded {
		fail(api.Err(http.StatusBadRequest, api.CodeInvalidParameter,
			"a message batch can be deleted only once it has ended; cancel it first, then delete it once ended"))
		return
	}
	// The record last: until it goes, the batch is there to be deleted
	// again should a step fail. The staged requests are there only when a
	// publisher stopped mid-create.
	for _, k := range []string{msgResultsKey(b.Owner, b.ID), msgRequestsKey(b.Owner, b.ID), job.BatchIDsKey(b.Owner, b.ID), job.BatchKey(b.Owner, b.ID)} {
		if err := p.store.Delete(r.Context(), k); err != nil && !errors.Is(err, payload.ErrMissing) {
			p.log.Error("deleting a message batch", "batch_id", b.ID, "err", err)
			fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batch could not be deleted; try again"))
			return
		}
	}
	api.WriteJSON(w, http.StatusOK, map[string]string{"id": b.ID, "type": "message_batch_deleted"})
}

// messageBatchResults is GET /v1/messages/batches/{id}/results: the
// results file, streamed from the bucket, once the batch has ended and for
// 29 days after its creation.
func (p *Service) messageBatchResults(w http.ResponseWriter, r *http.Request) {
	b, mb, fail := p.loadMessageBatch(w, r)
	switch {
	case mb == nil:
		return
	case mb.ProcessingStatus != msgEnded:
		fail(api.Err(http.StatusBadRequest, api.CodeInvalidParameter, "the batch's results are ready once its processing_status is ended"))
		return
	case mb.ResultsURL == nil:
		fail(api.Err(http.StatusNotFound, api.CodeNotFound, "the batch has no results: they are kept 29 days after its creation, and a batch that failed to start has none"))
		return
	}
	body, size, err := p.store.Open(r.Context(), msgResultsKey(b.Owner, b.ID))
	if err != nil {
		p.log.Error("opening a message batch's results", "batch_id", b.ID, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the results could not be read"))
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/x-jsonl")
	w.Header().Set("Content-Length", fmt.Sprint(size))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, body); err != nil {
		p.log.Warn("sending a message batch's results", "batch_id", b.ID, "err", err)
	}
}

// messageBatchPage is Anthropic's page of a list.
type messageBatchPage struct {
	Data    []*messageBatch `json:"data"`
	HasMore bool            `json:"has_more"`
	FirstID *string         `json:"first_id"`
	LastID  *string         `json:"last_id"`
}

// listMessageBatches is GET /v1/messages/batches: the caller's message
// batches, newest first; after_id pages on to older ones, before_id back to
// newer ones (the limit of them nearest it), as Anthropic's cursors do.
func (p *Service) listMessageBatches(w http.ResponseWriter, r *http.Request) {
	limit, fail, ok := p.messageBatches().startList(p, w, r, defaultMsgBatchList, maxMsgBatchList)
	if !ok {
		return
	}
	q := r.URL.Query()
	after, before := q.Get("after_id"), q.Get("before_id")
	if after != "" && !validMessageBatchID(after) || before != "" && !validMessageBatchID(before) {
		fail(api.Err(http.StatusBadRequest, api.CodeInvalidParameter, "after_id and before_id must be ids of message batches"))
		return
	}
	if after != "" && before != "" {
		fail(api.Err(http.StatusBadRequest, api.CodeInvalidParameter, "give after_id or before_id, not both"))
		return
	}
	owner := p.gate.Owner(r)
	all, err := api.ListIDs(r.Context(), p.store, job.BatchesPrefix(owner), validMessageBatchID)
	if err != nil {
		p.log.Error("listing message batches", "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batches could not be listed"))
		return
	}
	// all is oldest first.
	var ids []string
	more := false
	if before != "" {
		i, _ := slices.BinarySearch(all, before)
		newer := all[i:]
		if len(newer) > 0 && newer[0] == before {
			newer = newer[1:]
		}
		more = len(newer) > limit
		ids = slices.Clone(newer[:min(limit, len(newer))])
		slices.Reverse(ids)
	} else {
		i, _ := slices.BinarySearch(all, after)
		if after == "" {
			i = len(all)
		}
		older := all[:i]
		more = len(older) > limit
		ids = slices.Clone(older[max(0, len(older)-limit):])
		slices.Reverse(ids)
	}
	views, err := p.messageBatches().readAll(p, r, owner, ids)
	if err != nil {
		p.log.Error("reading message batches", "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batches could not be listed"))
		return
	}
	page := messageBatchPage{Data: views, HasMore: more}
	if page.Data == nil {
		page.Data = []*messageBatch{}
	}
	if n := len(page.Data); n > 0 {
		page.FirstID, page.LastID = &page.Data[0].ID, &page.Data[n-1].ID
	}
	api.WriteJSON(w, http.StatusOK, page)
}

// startBatch records b, validating, with the custom ids of its staged
// requests (s), sends them as the job of tenantName, a window of chunks at a
// time, and records b in_progress. The record goes first: once a chunk may
// be on the queue, the batch is there to be read, cancelled and finalized;
// a publisher that dies while sending leaves it validating, which the
// sweeper fails once stale. A failed send cancels what was sent and fails
// the batch.
func (p *Service) startBatch(ctx context.Context, b *batchRecord, s *stagedRequests, tenantName string, ri *api.RequestInfo) *api.Error {
	unrecorded := api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the batch could not be recorded; nothing was sent")
	b.Status = batchValidating
	if _, err := p.store.Put(ctx, job.BatchIDsKey(b.Owner, b.ID), s.ids); err != nil {
		p.log.Error("storing a batch's custom ids", "batch_id", b.ID, "err", err)
		return unrecorded
	}
	s.ids = nil
	if p.openBatch(ctx, b) != nil || p.putBatch(ctx, b) != nil {
		return unrecorded
	}
	ectx, ecancel := jobs.Detach(ctx)
	defer ecancel()
	counts := s.measure.Chunks()
	ri.Items, ri.Chunks = s.requests, len(counts)
	var e *api.Error
	out, err := s.measure.Stream(ectx, tenantName, b.Owner, counts, nil)
	if err != nil {
		e = api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "writing the job's manifest failed; nothing was sent")
	} else if err := s.send(ectx, out); err != nil {
		ri.Sent = out.Sent()
		p.log.Error("sending chunks", "job_id", b.ID, "sent", ri.Sent, "chunks", len(counts), "err", err)
		e = api.Err(http.StatusServiceUnavailable, api.CodeEnqueueFailed,
			"%d of %d chunks reached the queue; the job is incomplete "+
				"(retry with the same Idempotency-Key to send it again under the same id)", ri.Sent, len(counts))
	} else {
		ri.Sent = out.Sent()
	}
	if e != nil {
		// What was sent must not run: the job is cancelled, and the
		// batch failed, saying why.
		_ = p.jobs.Cancel(ectx, b.ID)
		b.Status, b.FailedAt = batchFailed, p.now().Unix()
		b.Errors = []batchError{{Code: e.Code, Message: e.Message}}
		_ = p.putBatch(ectx, b)
		return e
	}
	b.Status, b.InProgressAt = batchInProgress, p.now().Unix()
	if err := p.putBatch(ectx, b); err != nil {
		// The job is sent and runs; the batch reads as validating until
		// a later write. Answer what it is.
		p.log.Warn("recording a batch in progress", "batch_id", b.ID, "err", err)
		b.Status, b.InProgressAt = batchValidating, 0
	}
	p.jobs.Accepted(tenantName, s.requests)
	return nil
}

// The results file's lines, Anthropic's MessageBatchIndividualResponse.
type messageResultLine struct {
	CustomID string        `json:"custom_id"`
	Result   messageResult `json:"result"`
}

type messageResult struct {
	Type    string                  `json:"type"` // succeeded, errored, canceled or expired
	Message json.RawMessage         `json:"message,omitempty"`
	Error   *api.AnthropicErrorBody `json:"error,omitempty"`
}

// messageResultOf is the result of a request whose chunk ran and left o
// (nil: the chunk's result has no output for it).
func messageResultOf(o *job.Output) messageResult {
	errored := func(typ, msg string) messageResult {
		return messageResult{Type: "errored", Error: &api.AnthropicErrorBody{Type: "error", Error: api.AnthropicError{Type: typ, Message: msg}}}
	}
	switch {
	case o == nil:
		return errored("api_error", "the result of the request's chunk has no output for it")
	case o.Response != nil && o.Response.StatusCode/100 == 2 && o.Error == nil && bytes.HasPrefix(o.Response.Body, []byte("{")):
		return messageResult{Type: "succeeded", Message: o.Response.Body}
	case o.Response != nil:
		// The server's refusal: its own error where it is in Anthropic's
		// shape (a native /v1/messages), else the item's.
		var server api.AnthropicErrorBody
		if json.Unmarshal(o.Response.Body, &server) == nil && server.Type == "error" && server.Error.Type != "" {
			return messageResult{Type: "errored", Error: &server}
		}
		msg := "the model server answered " + http.StatusText(o.Response.StatusCode)
		if o.Error != nil {
			msg = o.Error.Message
		}
		return errored(api.AnthropicErrorType(o.Response.StatusCode), msg)
	case o.Error != nil && o.Error.Code == job.ItemInvalidInput:
		return errored("invalid_request_error", o.Error.Message)
	case o.Error != nil && o.Error.Code == job.ItemTooLarge:
		return errored("request_too_large", o.Error.Message)
	case o.Error != nil:
		return errored("api_error", o.Error.Message)
	}
	return errored("api_error", "the model answered the request without a response body")
}

// finalizeMessageBatch is finalizeBatch for a message batch: it writes the
// results file, one line per request in the create's order, and records b
// as ended, its Completed the succeeded requests and its Failed the
// errored ones, if the finalizing claim at etag is still its own.
func (p *Service) finalizeMessageBatch(ctx context.Context, b *batchRecord, etag string, m *job.Manifest, st *jobs.Status) error {
	ctx, cancel := jobs.Detach(ctx)
	defer cancel()
	b.ending(st)
	notRun := "canceled"
	if b.Status == batchExpired {
		notRun = "expired"
	}
	pr, pw := io.Pipe()
	uploaded := make(chan error, 1)
	go func() {
		_, err := p.store.Upload(ctx, msgResultsKey(b.Owner, b.ID), "application/x-jsonl", pr)
		pr.CloseWithError(err) // a write after a failed upload fails rather than blocks
		uploaded <- err
	}()
	err := p.writeMessageResults(ctx, pw, b, m, st, notRun)
	pw.CloseWithError(err) // an error aborts the upload
	if uerr := <-uploaded; err == nil {
		err = uerr
	}
	if err != nil {
		return fmt.Errorf("writing the results of batch %s: %w", b.ID, err)
	}
	b.EndedAt = p.now().Unix()
	_, err = p.putBatchIf(ctx, b, etag)
	return err
}

// writeMessageResults writes b's result lines to w, counting them into b.
func (p *Service) writeMessageResults(ctx context.Context, w io.Writer, b *batchRecord, m *job.Manifest, st *jobs.Status, notRun string) error {
	out := bufio.NewWriterSize(w, 64<<10)
	b.Completed, b.Failed = 0, 0
	err := p.eachLine(ctx, b, m, st, func(l *batchLine) error {
		line := messageResultLine{CustomID: l.id}
		switch {
		case l.done:
			line.Result = messageResultOf(l.o)
		case l.reason != "":
			line.Result = messageResultOf(&job.Output{Error: &job.ItemError{Code: lineDeadLettered,
				Message: "the request's chunk was dead-lettered: " + l.reason}})
		default:
			line.Result = messageResult{Type: notRun}
		}
		switch line.Result.Type {
		case "succeeded":
			b.Completed++
		case "errored":
			b.Failed++
		}
		raw, err := api.MarshalUnescaped(&line)
		if err != nil {
			return err
		}
		_, err = out.Write(append(raw, '\n'))
		return err
	})
	if err != nil {
		return err
	}
	return out.Flush()
}
