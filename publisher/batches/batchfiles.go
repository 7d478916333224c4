package batches

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/files"
	"github.com/vramq/vramq/publisher/jobs"
)

// A batch's output and error files, as OpenAI writes them (its API
// reference, "The request output object"): one line per request,
//
//	{"id": "batch_req_…", "custom_id": "…", "response": {"status_code", "request_id", "body"}, "error": null}
//
// the answers of status 2xx in the output file, and everything else in the
// error file: a request the server refused (its response kept, and the
// error), an item the subscriber refused, a request of a chunk that was
// dead-lettered, and one never run, batch_cancelled or batch_expired.
// Lines keep the input file's order. They are written once the job has
// settled, by the finalizer that holds the batch's finalizing claim
// (batchstate.go), streamed from the results into the bucket a chunk at a
// time; one that takes over a stale claim writes the same files under the
// same ids.

// Error codes of the error file's lines that are not the subscriber's item
// errors (job.ItemInvalidInput and the rest).
const (
	lineCancelled    = "batch_cancelled"
	lineExpired      = "batch_expired"
	lineDeadLettered = "dead_lettered"  // the line's chunk went to the DLQ; the message says why
	lineNoOutput     = "missing_output" // the chunk's result has no output for the line
)

type batchOutputLine struct {
	ID       string             `json:"id"`
	CustomID string             `json:"custom_id"`
	Response *batchLineResponse `json:"response"`
	Error    *batchLineError    `json:"error"`
}

type batchLineResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type batchLineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// finalizeBatch writes the output and error files of b, whose job has
// settled (st) and whose finalizing claim is the record at etag, and records
// b as ended, if the claim is still its own (payload.ErrPrecondition
// otherwise: one that took a stale claim over wrote the same files).
func (p *Service) finalizeBatch(ctx context.Context, b *batchRecord, etag string, m *job.Manifest, st *jobs.Status) error {
	if isMessageBatch(b) {
		return p.finalizeMessageBatch(ctx, b, etag, m, st)
	}
	// A sweep that is stopped does not stop the files half written.
	ctx, cancel := jobs.Detach(ctx)
	defer cancel()
	b.ending(st)
	notRun := lineCancelled
	if b.Status == batchExpired {
		notRun = lineExpired
	}
	out := p.newLineFile(ctx, b, "output")
	errs := p.newLineFile(ctx, b, "error")
	defer out.abort()
	defer errs.abort()
	var usage batchUsage
	err := p.eachLine(ctx, b, m, st, func(l *batchLine) error {
		line := batchOutputLine{ID: requestID("batch_req_", b.ID, l.id), CustomID: l.id}
		switch {
		case l.done:
			o := l.o
			switch {
			case o == nil:
				line.Error = &batchLineError{Code: lineNoOutput, Message: "the result of the line's chunk has no output for it"}
			case o.Response != nil:
				body := o.Response.Body
				if !json.Valid(body) {
					body, _ = json.Marshal(string(body))
				}
				line.Response = &batchLineResponse{StatusCode: o.Response.StatusCode, RequestID: requestID("req_", b.ID, l.id), Body: body}
				if o.Response.StatusCode/100 == 2 {
					usage.add(body)
				}
			}
			if o != nil && o.Error != nil {
				line.Error = &batchLineError{Code: o.Error.Code, Message: o.Error.Message}
			} else if o != nil && o.Response == nil {
				line.Error = &batchLineError{Code: lineNoOutput, Message: "the model answered the line without a response body"}
			}
		case l.reason != "":
			line.Error = &batchLineError{Code: lineDeadLettered, Message: "the line's chunk was dead-lettered: " + l.reason}
		default:
			line.Error = &batchLineError{Code: notRun, Message: notRunMessage(notRun)}
		}
		f := out
		if line.Error != nil || line.Response.StatusCode/100 != 2 {
			f = errs
		}
		return f.write(&line)
	})
	if err != nil {
		return err
	}
	if b.OutputFileID, err = out.close(); err != nil {
		return err
	}
	if b.ErrorFileID, err = errs.close(); err != nil {
		return err
	}
	b.Completed, b.Failed = out.lines, errs.lines
	if usage.TotalTokens > 0 {
		b.Usage = &usage
	}
	b.EndedAt = p.now().Unix()
	_, err = p.putBatchIf(ctx, b, etag)
	return err
}

func notRunMessage(code string) string {
	if code == lineExpired {
		return "This request could not be executed before the completion window expired."
	}
	return "The batch was cancelled before this request ran."
}

// requestID is an id for custom id id of batch batchID, the same each time
// the files are written.
func requestID(prefix, batchID, id string) string {
	sum := sha256.Sum256([]byte(batchID + "\x00" + prefix + "\x00" + id))
	return prefix + hex.EncodeToString(sum[:16])
}

// chunkRead is a chunk's outputs as the jobs' Outputs read them; held says it
// holds a place of the prefetch's.
type chunkRead struct {
	outputs map[string]*job.Output
	err     error
	held    bool
}

// finalizeReadAhead is how many results prefetch reads at once; a variable so
// that BenchmarkBatchLifecycle can compare one at a time.
var finalizeReadAhead = api.ReadConcurrency

// prefetch reads the results of a job's done chunks api.ReadConcurrency at a
// time and at most that many ahead of its reader, who takes them in chunk
// order (get). Read one at a time, a large batch's files took a round trip
// per chunk.
type prefetch struct {
	ch    []chan chunkRead // nil for a chunk not done
	ahead chan struct{}    // a place is held from the read's start until get
}

func (p *Service) prefetchOutputs(ctx context.Context, jobID string, chunks int, st *jobs.Status) *prefetch {
	f := &prefetch{ch: make([]chan chunkRead, chunks), ahead: make(chan struct{}, finalizeReadAhead)}
	for c := range f.ch {
		if st.Done(c) {
			f.ch[c] = make(chan chunkRead, 1)
		}
	}
	go func() {
		for c, ch := range f.ch {
			if ch == nil {
				continue
			}
			select {
			case f.ahead <- struct{}{}:
				go func() {
					outputs, err := p.jobs.Outputs(ctx, jobID, c)
					ch <- chunkRead{outputs, err, true}
				}()
			case <-ctx.Done():
				// The reader has stopped (its context ends with it):
				// nothing more is read.
				ch <- chunkRead{err: ctx.Err()}
			}
		}
	}()
	return f
}

// get waits for chunk c's outputs.
func (f *prefetch) get(c int) chunkRead {
	r := <-f.ch[c]
	if r.held {
		<-f.ahead
	}
	return r
}

// add counts the usage a response body reports: OpenAI's chat and
// completions say prompt_tokens and completion_tokens, embeddings
// prompt_tokens and total_tokens, responses input_tokens and output_tokens
// (with their own details), as the batch's usage does.
func (u *batchUsage) add(body json.RawMessage) {
	var r struct {
		Usage struct {
			PromptTokens        int64 `json:"prompt_tokens"`
			CompletionTokens    int64 `json:"completion_tokens"`
			TotalTokens         int64 `json:"total_tokens"`
			PromptTokensDetails struct {
				CachedTokens int64 `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
			CompletionTokensDetails struct {
				ReasoningTokens int64 `json:"reasoning_tokens"`
			} `json:"completion_tokens_details"`
			InputTokens        int64 `json:"input_tokens"`
			OutputTokens       int64 `json:"output_tokens"`
			InputTokensDetails struct {
				CachedTokens int64 `json:"cached_tokens"`
			} `json:"input_tokens_details"`
			OutputTokensDetails struct {
				ReasoningTokens int64 `json:"reasoning_tokens"`
			} `json:"output_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &r) != nil {
		return
	}
	if r.Usage.PromptTokens == 0 && r.Usage.CompletionTokens == 0 {
		r.Usage.PromptTokens, r.Usage.CompletionTokens = r.Usage.InputTokens, r.Usage.OutputTokens
		r.Usage.PromptTokensDetails.CachedTokens = r.Usage.InputTokensDetails.CachedTokens
		r.Usage.CompletionTokensDetails.ReasoningTokens = r.Usage.OutputTokensDetails.ReasoningTokens
	}
	u.InputTokens += r.Usage.PromptTokens
	u.OutputTokens += r.Usage.CompletionTokens
	u.InputTokensDetails.CachedTokens += r.Usage.PromptTokensDetails.CachedTokens
	u.OutputTokensDetails.ReasoningTokens += r.Usage.CompletionTokensDetails.ReasoningTokens
	u.TotalTokens += max(r.Usage.TotalTokens, r.Usage.PromptTokens+r.Usage.CompletionTokens)
}

// lineFile is one of a batch's files being written: a JSONL file of the
// batch's owner, streamed into the bucket as its lines are written, made
// only when it gets a first line (OpenAI leaves output_file_id or
// error_file_id null when there is nothing to put there).
type lineFile struct {
	p      *Service
	ctx    context.Context
	b      *batchRecord
	id     string
	name   string
	pw     *io.PipeWriter
	buf    *bufio.Writer
	done   chan error
	size   int64
	lines  int
	closed bool
}

// newLineFile is the file kind ("output" or "error") of b. Its id is made
// from b's, so that writing the files twice makes the same files.
func (p *Service) newLineFile(ctx context.Context, b *batchRecord, kind string) *lineFile {
	sum := sha256.Sum256([]byte(b.ID + "\x00" + kind))
	// The time half of b's id, then bits of the digest, the last one the
	// purpose's: ids still sort by creation among the owner's files, and
	// are of the file id grammar.
	id := files.WithPurpose(files.IDPrefix+b.ID[len(batchIDPrefix):len(batchIDPrefix)+12]+hex.EncodeToString(sum[:10]), files.PurposeBatchOutput)
	return &lineFile{p: p, ctx: ctx, b: b, id: id, name: b.ID + "_" + kind + ".jsonl"}
}

func (f *lineFile) write(line *batchOutputLine) error {
	if f.pw == nil {
		pr, pw := io.Pipe()
		f.pw, f.buf, f.done = pw, bufio.NewWriterSize(pw, 64<<10), make(chan error, 1)
		go func() {
			n, err := f.p.store.Upload(f.ctx, job.FileKey(f.b.Owner, f.id), "application/octet-stream", pr)
			f.size = n
			pr.CloseWithError(err) // a write after a failed upload fails rather than blocks
			f.done <- err
		}()
	}
	raw, err := api.MarshalUnescaped(line)
	if err != nil {
		return err
	}
	f.lines++
	if _, err := f.buf.Write(raw); err != nil {
		return err
	}
	return f.buf.WriteByte('\n')
}

// close finishes the upload and writes the file's record: the file's id, or
// "" when it had no lines.
func (f *lineFile) close() (string, error) {
	if f.pw == nil {
		return "", nil
	}
	f.closed = true
	err := f.buf.Flush()
	f.pw.CloseWithError(err)
	if uerr := <-f.done; err == nil {
		err = uerr
	}
	if err != nil {
		return "", fmt.Errorf("writing the %s of batch %s: %w", f.name, f.b.ID, err)
	}
	now := f.p.now()
	expiry := files.DefaultExpiry
	if f.b.OutputExpiresAfter > 0 {
		expiry = time.Duration(f.b.OutputExpiresAfter) * time.Second
	}
	rec := files.Record{V: 1, ID: f.id, Owner: f.b.Owner, Filename: f.name, Bytes: f.size, Lines: f.lines,
		Purpose: files.PurposeBatchOutput, CreatedAt: now.Unix(), ExpiresAt: now.Add(expiry).Unix()}
	raw, err := json.Marshal(rec)
	if err == nil {
		_, err = f.p.store.Put(f.ctx, job.FileRecordKey(f.b.Owner, f.id), raw)
	}
	if err != nil {
		return "", fmt.Errorf("recording the %s of batch %s: %w", f.name, f.b.ID, err)
	}
	return f.id, nil
}

// abort ends an upload that close did not: Upload aborts the multipart
// upload when its reader fails.
func (f *lineFile) abort() {
	if f.pw != nil && !f.closed {
		f.pw.CloseWithError(errors.New("batch finalization stopped"))
		<-f.done
	}
}

// errLineTooLong is a line over the reader's bound.
var errLineTooLong = errors.New("line too long")

// lineReader reads a file's lines without their newline, each at most max
// bytes; a longer one is skipped whole and reported as errLineTooLong.
type lineReader struct {
	r   *bufio.Reader
	max int64
	buf []byte
}

func newLineReader(r io.Reader, max int64) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// next returns the next line, valid until the following call, or io.EOF.
// A last line without a newline is a line; a newline at the end of the file
// does not start another.
func (l *lineReader) next() ([]byte, error) {
	l.buf = l.buf[:0]
	tooLong := false
	for {
		frag, err := l.r.ReadSlice('\n')
		if !tooLong {
			if int64(len(l.buf)+len(frag)) > l.max+1 { // +1: the newline
				tooLong, l.buf = true, l.buf[:0]
			} else {
				l.buf = append(l.buf, frag...)
			}
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && len(l.buf) == 0 && !tooLong:
			return nil, io.EOF
		case err != nil && err != io.EOF:
			return nil, err
		}
		if tooLong {
			return nil, errLineTooLong
		}
		return bytes.TrimSuffix(l.buf, []byte("\n")), nil
	}
}
