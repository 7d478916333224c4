package batches

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/jobs"
)

// A batch's input file is validated after POST /v1/batches has answered
// (issue 32, item 5), by the owner of the validating state: the sweeper,
// nudged at once in server mode, under Lambda its scheduled pass. It claims
// the batch with a conditional write (validating_at), then reads the file
// twice, line by line. The first pass checks every line and keeps of each
// request only its custom id and the size of its encoding, which is enough
// to cut the chunks; a bad line ends the batch failed, every bad line named,
// and nothing sent. The second pass encodes the lines again and sends each
// window of chunks as it fills; then the batch is in_progress. Neither pass
// holds the file: a validation holds the custom ids (MaxFileLines of them at
// most), one size a request, and a window of chunks.
//
// A validator that dies leaves its claim behind: the sweeper takes a claim
// older than batchSendStale for a dead one, cancels the batch's job, so
// that what was sent does not run, and fails the batch (advanceBatch). A
// validator refreshes its claim while it sends, so a long one is not taken
// for dead, and stops, its job cancelled, when a refresh finds the batch
// moved by another owner.

// Error codes of a batch that could not be validated (errors.data[].code).
const (
	CodeInputFileMissing = "input_file_missing" // the input file was deleted before it was read
	CodeInputFileChanged = "input_file_changed" // the two passes read different files
)

// batchRecordVersion is the record's version: records of version 1 were
// validated before POST /v1/batches answered, so one left validating was
// being sent when its publisher stopped.
const batchRecordVersion = 2

// validationBeat is how often a validator refreshes its claim: well within
// batchSendStale.
const validationBeat = batchSendStale / 4

// validationTimeout bounds one validation that has no deadline of its own.
const validationTimeout = time.Hour

// validateBatch claims b, validating and unclaimed at etag, and validates
// it. It reports whether b has ended (failed); an error leaves the claim
// given back, for the next pass to try again, or, once chunks may have been
// sent, the batch failed.
func (p *Service) validateBatch(ctx context.Context, b *batchRecord, etag string) (ended bool, err error) {
	// A pass that is stopped does not stop a validation halfway, and one
	// without a deadline of its own (not a Lambda invocation's) may take as
	// long as its claim is refreshed, up to validationTimeout: a job's 90 s
	// (jobs.Detach) is for a request's body, and a file of OpenAI's
	// largest size, read twice from a slow store, takes longer.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, validationTimeout)
		defer cancel()
	}
	ctx, cancel := jobs.Detach(ctx)
	defer cancel()
	prev := *b
	b.ValidatingAt = p.now().Unix()
	if etag, err = p.putBatchIf(ctx, b, etag); err != nil {
		return false, ignoreLost(err) // another validator claimed it
	}
	v := &validation{p: p, b: b, etag: etag}
	if err := v.check(ctx); err != nil {
		if e, ok := errors.AsType[*batchFault](err); ok {
			return v.fail(ctx, []batchError{e.batchError})
		}
		p.release(ctx, &prev, v.etag)
		return false, err
	}
	if len(v.bad) > 0 {
		return v.fail(ctx, v.bad)
	}
	if err := v.send(ctx); err != nil {
		// What was sent must not run: the job is cancelled, and the
		// batch failed, saying why.
		if cerr := p.jobs.Cancel(ctx, b.ID); cerr != nil {
			return false, cerr // the claim goes stale, and the sweeper fails it
		}
		if errors.Is(err, payload.ErrPrecondition) {
			return false, nil // the sweeper took the claim for dead, and failed the batch
		}
		be := batchError{Code: CodeEnqueueInterrupted, Message: "the batch's requests could not all be sent; create the batch again"}
		if e, ok := errors.AsType[*batchFault](err); ok {
			be = e.batchError
		}
		return v.fail(ctx, []batchError{be})
	}
	b.Status, b.InProgressAt = batchInProgress, p.now().Unix()
	if _, err := p.putBatchIf(ctx, b, v.etag); err != nil {
		if errors.Is(err, payload.ErrPrecondition) {
			// Failed by the sweeper meanwhile: what was sent must not run.
			return false, p.jobs.Cancel(ctx, b.ID)
		}
		return false, err // the claim goes stale: the sweeper cancels the job and fails it
	}
	p.jobs.Accepted(b.Tenant, v.items)
	return false, nil
}

// batchFault is what is wrong with a batch's file as a whole: it fails the
// batch rather than waiting for a retry.
type batchFault struct{ batchError }

func (e *batchFault) Error() string { return e.Code + ": " + e.Message }

func fileFault(code, format string, a ...any) *batchFault {
	return &batchFault{batchError{Code: code, Message: fmt.Sprintf(format, a...)}}
}

// validation is one validator's work on a batch it has claimed.
type validation struct {
	p    *Service
	b    *batchRecord
	etag string // the record's, as this validator last wrote it

	bad     []batchError
	ids     []byte        // the custom ids, a JSON string a line (job.BatchIDsKey)
	measure *jobs.Measure // the requests' sizes
	items   int
	inputs  int // embedding inputs (count)
}

// check is the first pass: every line checked, and the ids and sizes of
// the requests kept.
func (v *validation) check(ctx context.Context) error {
	p := v.p
	v.measure = p.jobs.Measure(v.b.ID, v.b.Endpoint)
	requests, bad, err := p.scanBatchInput(ctx, v.b, func(it jobs.RequestItem) error {
		if e := v.measure.Add(it); e != nil {
			return fileFault(e.Code, "%s", e.Message)
		}
		if err := v.count(it.Body); err != nil {
			return err
		}
		v.ids = append(append(v.ids, api.EncodeJSON(it.ID)...), '\n')
		return nil
	})
	if err != nil {
		return err
	}
	v.b.Lines, v.bad, v.items = requests, bad, v.measure.Items()
	return nil
}

// count takes the model of the first request for the batch's, and counts
// the inputs of embeddings requests against OpenAI's bound for a batch: a
// string or one array of token ids is an input, an array of them one each.
func (v *validation) count(body json.RawMessage) error {
	var r struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return err // checkBody took it
	}
	if v.b.Model == "" {
		v.b.Model = r.Model
	}
	if v.b.Endpoint != job.EndpointEmbeddings {
		return nil
	}
	var inputs []json.RawMessage
	if json.Unmarshal(r.Input, &inputs) != nil || len(inputs) == 0 || inputs[0][0] != '"' && inputs[0][0] != '[' {
		v.inputs++
	} else {
		v.inputs += len(inputs)
	}
	if v.inputs > maxBatchEmbeddingInputs {
		return fileFault(CodeTooManyEmbeddingInputs, "the batch's requests have more than %d embedding inputs together", maxBatchEmbeddingInputs)
	}
	return nil
}

// send is the second pass: the custom ids and the manifest written, then
// the lines encoded again and sent a window of chunks at a time.
func (v *validation) send(ctx context.Context) error {
	p, b := v.p, v.b
	counts := v.measure.Chunks()
	if _, err := p.store.Put(ctx, job.BatchIDsKey(b.Owner, b.ID), v.ids); err != nil {
		return err
	}
	v.ids = nil
	beat := time.Unix(b.ValidatingAt, 0)
	out, err := v.measure.Stream(ctx, b.Tenant, b.Owner, counts, func(ctx context.Context) error {
		if now := p.now(); now.Sub(beat) >= validationBeat {
			beat, b.ValidatingAt = now, now.Unix()
			etag, err := p.putBatchIf(ctx, b, v.etag)
			if err != nil {
				return err
			}
			v.etag = etag
		}
		return nil
	})
	if err != nil {
		return err
	}
	n := 0 // requests encoded
	_, bad, err := p.scanBatchInput(ctx, b, func(it jobs.RequestItem) error {
		if n == v.items {
			return fileFault(CodeInputFileChanged, "the input file has more requests than when it was checked")
		}
		err := out.Add(ctx, it)
		if e, ok := errors.AsType[*api.Error](err); ok {
			return fileFault(e.Code, "%s", e.Message)
		}
		n++
		return err
	})
	switch {
	case err != nil:
		return err
	case len(bad) > 0 || n != v.items:
		return fileFault(CodeInputFileChanged, "the input file changed while it was read")
	}
	return out.Close(ctx)
}

// fail ends b failed with errs, if the validator's claim still stands.
func (v *validation) fail(ctx context.Context, errs []batchError) (bool, error) {
	b := v.b
	b.Status, b.FailedAt, b.Errors = batchFailed, v.p.now().Unix(), errs
	if _, err := v.p.putBatchIf(ctx, b, v.etag); err != nil {
		return false, ignoreLost(err)
	}
	v.p.ended(b)
	return true, nil
}

// scanBatchInput reads the input file of b line by line, and hands good
// each line that is a good request, in order, as an item: its custom_id and
// its body. It returns how many lines are requests, bad or not (every line
// but blank ones), and the bad ones (the first maxBatchErrors of them, then
// one entry for the rest). A line is OpenAI's request input object,
// {"custom_id", "method", "url", "body"}: custom_id an item id of the
// grammar, unique in the file; method POST; url the batch's endpoint; body
// a request the publisher accepts for it (checkBody, as POST /v1/jobs
// checks an item's). An error of good's stops the scan.
func (p *Service) scanBatchInput(ctx context.Context, b *batchRecord, good func(jobs.RequestItem) error) (requests int, bad []batchError, err error) {
	body, _, err := p.store.Open(ctx, job.FileKey(b.Owner, b.InputFileID))
	if errors.Is(err, payload.ErrMissing) {
		return 0, nil, fileFault(CodeInputFileMissing, "the input file %s was deleted before the batch read it", b.InputFileID)
	}
	if err != nil {
		return 0, nil, err
	}
	defer body.Close()
	var (
		more     int
		seen     = map[string]struct{}{}
		lim      = p.jobs.Limits()
		endpoint = b.Endpoint
	)
	badLine := func(n int, code, param, format string, a ...any) {
		if len(bad) >= maxBatchErrors {
			more++
			return
		}
		e := batchError{Code: code, Message: fmt.Sprintf(format, a...), Line: &n}
		if param != "" {
			e.Param = &param
		}
		bad = append(bad, e)
	}
	lines := newLineReader(body, p.fileCfg.MaxFileLineBytes)
	n := 0
	for {
		line, err := lines.next()
		if err == io.EOF {
			break
		}
		n++
		if errors.Is(err, errLineTooLong) {
			requests++
			badLine(n, files.CodeLineTooLarge, "", "the line is over %d bytes", p.fileCfg.MaxFileLineBytes)
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		if n > p.fileCfg.MaxFileLines {
			badLine(n, files.CodeTooManyLines, "", "the file has more than %d lines", p.fileCfg.MaxFileLines)
			break
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue // a blank line, at the end of a file most often, is no request
		}
		requests++
		fields, err := job.Members(line)
		if err != nil {
			badLine(n, CodeInvalidJSONLine, "", "the line is not a JSON object without repeated keys")
			continue
		}
		var id, method, url string
		if v, ok := jobs.Present(fields, "custom_id"); !ok || json.Unmarshal(v, &id) != nil || job.CheckItemID(id) != nil {
			badLine(n, CodeInvalidCustomID, "custom_id",
				"custom_id must be a string of 1 to %d bytes of UTF-8 without control characters", job.MaxItemIDBytes)
			continue
		}
		if _, dup := seen[id]; dup {
			badLine(n, CodeDuplicateCustomID, "custom_id", "the custom_id %s is on an earlier line too", job.QuoteID(id))
			continue
		}
		seen[id] = struct{}{}
		if v, ok := jobs.Present(fields, "method"); !ok || json.Unmarshal(v, &method) != nil || method != http.MethodPost {
			badLine(n, CodeInvalidMethod, "method", "method must be POST")
			continue
		}
		if v, ok := jobs.Present(fields, "url"); !ok || json.Unmarshal(v, &url) != nil || url != endpoint {
			badLine(n, CodeMismatchedURL, "url", "url must be the batch's endpoint, %s", endpoint)
			continue
		}
		req, _ := jobs.Present(fields, "body")
		if len(req) == 0 || req[0] != '{' {
			badLine(n, api.CodeInvalidBody, "body", "body must be a JSON object: the request for %s", endpoint)
			continue
		}
		if !lim.Serves(endpoint) {
			badLine(n, CodeEndpointNotServed, "url", "%s is not served here: the model servers serve %s", endpoint, strings.Join(lim.ServedList(), ", "))
			continue
		}
		if e := lim.CheckBody(endpoint, req); e != nil {
			badLine(n, e.Code, "body", "%s", e.Message)
			continue
		}
		if err := good(jobs.RequestItem{ID: id, Body: req}); err != nil {
			return 0, nil, err
		}
	}
	if requests == 0 {
		bad = append(bad, batchError{Code: CodeEmptyFile, Message: "the input file has no lines"})
	}
	if more > 0 {
		bad = append(bad, batchError{Code: CodeTooManyErrors,
			Message: fmt.Sprintf("%d more lines are bad; the first %d are named", more, maxBatchErrors)})
	}
	return requests, bad, nil
}
