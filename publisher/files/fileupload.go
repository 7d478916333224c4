package files

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"hash"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// An upload, POST /v1/files, is multipart/form-data with the file in a part
// named file, purpose=batch, and optionally expires_after[anchor]=created_at
// and expires_after[seconds] (OpenAI's form; expires_after.seconds is taken
// too). The parts may come in any order: the SDKs send the file first or
// last.
//
// The file is never held whole: its part is streamed to the bucket
// (payload.Store.Upload: one PutObject when it fits in one part of
// payload.UploadPartBytes, else a multipart upload a part at a time), and
// checked as it streams (lineCheck): its bytes, its lines and each line's
// bytes, so an upload over a limit is refused as soon as it goes over. What
// was stored of a refused upload is removed before the answer (a multipart
// upload is aborted; a stored object deleted), and the record that makes
// the file exist is written only after every check passed.
//
// Like a POST /v1/jobs body, an upload takes a place among its client's
// bodies in flight and is held to -min-body-rate (api.BodyPace). It is
// charged for the bytes it holds: those that have arrived of the part being
// filled, at most one part of the upload (or the whole file, when that is
// smaller), given back as the part goes to S3, whose buffer goes with it.
// What went on to S3 is not held, and charging a 200 MB file in full would
// refuse every file over a client's share of the budget. Uploads, which may
// last FileUploadTimeout, hold at most their part of the budget (bodyBudget).

// The form's other fields: each at most maxFormFieldBytes, at most
// maxFormParts parts in all, and formSlack bytes besides the file for
// them, the part headers and the boundaries.
const (
	maxFormFieldBytes = 1 << 10
	maxFormParts      = 16
	formSlack         = 64 << 10
	// maxFilenameBytes bounds the file name kept (the part's filename).
	maxFilenameBytes = 1 << 10
	// fileWriteGrace is the time, past FileUploadTimeout, to finish the
	// upload to S3 and write the answer.
	fileWriteGrace = 2 * time.Minute
	// fileCleanupTimeout bounds the removal of a refused upload's content,
	// which runs after the client may have gone.
	fileCleanupTimeout = 30 * time.Second
)

// errUploadTimeout: the upload took longer than FileUploadTimeout.
var errUploadTimeout = errors.New("the upload went past its deadline")

// fileForm is an upload's form as it is read, and what it says.
type fileForm struct {
	w    http.ResponseWriter // for the Retry-After of a refusal
	body *UploadBody

	id, owner, key string
	createdAt      time.Time

	purpose, anchor, seconds                string
	purposeGiven, anchorGiven, secondsGiven bool
	expiresAfter                            time.Duration

	sawFile  bool
	stored   bool // the file's content is in the bucket
	filename string
	size     int64
	lines    int

	// With an Idempotency-Key: the digest of the file's content, and
	// whether the file is only read, to compare with the first request's.
	content hash.Hash
	replay  bool
}

// sum is the form's digest for its idempotency record: the file, its name,
// and the fields as given.
func (f *fileForm) sum() string {
	if f.content == nil {
		return ""
	}
	given := func(ok bool, v string) []byte {
		if !ok {
			return nil
		}
		return []byte("=" + v)
	}
	return api.RequestSum("POST /v1/files", f.content.Sum(nil), []byte(f.filename), given(f.purposeGiven, f.purpose),
		given(f.anchorGiven, f.anchor), given(f.secondsGiven, f.seconds))
}

// postFile is POST /v1/files.
func (fs *Service) postFile(w http.ResponseWriter, r *http.Request) {
	fail := api.FailWith(w, r)
	if fs.store == nil {
		fail(noFileStore())
		return
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" || len(r.Header.Values("Content-Type")) != 1 {
		fail(api.Err(http.StatusUnsupportedMediaType, api.CodeUnsupportedMedia,
			"Content-Type must be multipart/form-data, with a boundary, given once"))
		return
	}
	limit := fs.cfg.MaxFileBytes + formSlack
	if r.ContentLength > limit {
		fail(fs.fileTooLarge())
		return
	}
	// An upload can take FileUploadTimeout: a retry is told the first is
	// still at work until then.
	once, e := fs.gate.NewCreateOnce(r, fs.cfg.FileUploadTimeout+fileWriteGrace)
	if e != nil {
		fail(e)
		return
	}
	charge, err := fs.gate.OpenUpload(r)
	if err != nil {
		fail(fs.gate.BodyError(w, err))
		return
	}
	defer charge.Release()
	// The request's digest is known only once its form is read: the key is
	// claimed first, and a retry of an upload that was answered reads its
	// form, storing nothing, to tell whether it is the same.
	replay := false
	if once != nil {
		c, e := once.Claim(r, w, api.KindFile, "")
		if e != nil {
			fail(e)
			return
		}
		replay = c == api.ClaimReplay
		defer once.Fail(r.Context())
	}
	// A file may take far longer to come than the server's ReadTimeout
	// allows any body: this request's deadlines are its own. Where the
	// connection has none to move (Lambda), this does nothing.
	rc := http.NewResponseController(w)
	now := time.Now()
	_ = rc.SetReadDeadline(now.Add(fs.cfg.FileUploadTimeout))
	_ = rc.SetWriteDeadline(now.Add(fs.cfg.FileUploadTimeout + fileWriteGrace))
	pace := api.StartPace(float64(fs.cfg.MinBodyRate), fs.cfg.BodyGrace, api.CutRead(w))
	held := fs.cfg.UploadHeld
	if replay {
		held = api.BodyStep // the file is read past, not held: only the reader's buffer
	}
	body := NewUploadBody(http.MaxBytesReader(w, r.Body, limit), charge, pace, held)

	f := &fileForm{w: w, body: body, owner: fs.gate.Owner(r), createdAt: fs.now(), replay: replay}
	if once != nil {
		f.content = sha256.New()
	}
	f.id = NewID(f.createdAt)
	f.key = job.FileKey(f.owner, f.id)
	e = fs.readFileForm(r.Context(), multipart.NewReader(body, params["boundary"]), f)
	if tooSlow := pace.Stop(); e != nil && tooSlow {
		e = fs.gate.BodyError(w, api.ErrTooSlow)
	}
	if e == nil {
		e = f.check()
	}
	if e == nil && replay {
		if e = once.Replay(w, f.sum()); e == nil {
			return
		}
	}
	var rec *Record
	recordKey := job.FileRecordKey(f.owner, f.id)
	if e == nil {
		rec = &Record{V: 1, ID: f.id, Owner: f.owner, Filename: f.filename, Bytes: f.size, Lines: f.lines,
			Purpose: f.purpose, CreatedAt: f.createdAt.Unix(), ExpiresAt: f.createdAt.Add(f.expiresAfter).Unix()}
		raw, _ := json.Marshal(rec) // a struct of strings and numbers
		if _, err := fs.store.Put(r.Context(), recordKey, raw); err != nil {
			fs.log.Error("storing a file record", "file_id", f.id, "err", err)
			e = api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the file could not be stored; nothing was kept, retry")
		}
	}
	if e != nil {
		if f.stored {
			// A failed Put of the record may still have written it: it goes
			// first, as in a delete.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), fileCleanupTimeout)
			defer cancel()
			keys := []string{f.key}
			if rec != nil {
				keys = []string{recordKey, f.key}
			}
			for _, k := range keys {
				if err := fs.store.Delete(ctx, k); err != nil {
					fs.log.Warn("removing a refused upload (the lifecycle rule will)", "file_id", f.id, "key", k, "err", err)
				}
			}
		}
		fail(e)
		return
	}
	fs.log.Debug("file uploaded", "file_id", f.id, "bytes", f.size, "lines", f.lines)
	once.Answer(r.Context(), w, f.sum(), rec.object())
}

// readFileForm reads the form's parts, streaming the file's to the bucket.
// It stops at the first problem, which is refused before more is read: a
// purpose other than batch given ahead of the file refuses the upload
// before any of the file is stored.
func (fs *Service) readFileForm(ctx context.Context, mr *multipart.Reader, f *fileForm) *api.Error {
	for parts := 0; ; parts++ {
		part, err := mr.NextPart()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fs.formError(f, err)
		}
		if parts == maxFormParts {
			return api.Err(http.StatusBadRequest, CodeInvalidMultipart, "the form has more than %d parts", maxFormParts)
		}
		var e *api.Error
		switch name := part.FormName(); name {
		case "file":
			e = fs.storeFile(ctx, part, f)
		case "purpose":
			f.purpose, e = fs.formField(part, f, name)
			f.purposeGiven = true
			if e == nil && f.purpose != PurposeBatch {
				e = badPurpose()
			}
		case "expires_after[anchor]", "expires_after.anchor":
			f.anchor, e = fs.formField(part, f, "expires_after")
			f.anchorGiven = true
		case "expires_after[seconds]", "expires_after.seconds":
			f.seconds, e = fs.formField(part, f, "expires_after")
			f.secondsGiven = true
		default:
			// OpenAI's SDKs send nothing else; what another client adds is
			// read past, within the form's bound.
			if _, err := io.Copy(io.Discard, part); err != nil {
				e = fs.formError(f, err)
			}
		}
		part.Close()
		if e != nil {
			return e
		}
	}
}

// storeFile streams the file's part to the bucket, checking it as it goes.
func (fs *Service) storeFile(ctx context.Context, part *multipart.Part, f *fileForm) *api.Error {
	if f.sawFile {
		return api.ParamErr(http.StatusBadRequest, CodeInvalidMultipart, "file", "the form has more than one part named file")
	}
	f.sawFile = true
	name := part.FileName()
	if len(name) > maxFilenameBytes || !utf8.ValidString(name) {
		return api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "file",
			"the file's name must be valid UTF-8 of at most %d bytes", maxFilenameBytes)
	}
	var src io.Reader = part
	if f.content != nil {
		src = io.TeeReader(part, f.content)
	}
	check := &lineCheck{r: src, body: f.body, maxBytes: fs.cfg.MaxFileBytes, maxLines: fs.cfg.MaxFileLines, maxLineBytes: fs.cfg.MaxFileLineBytes}
	if f.replay {
		// Read and checked as the first was, and nothing kept.
		if _, err := io.Copy(io.Discard, check); err != nil {
			var limit *api.Error
			if errors.As(check.err, &limit) {
				return limit
			}
			return fs.formError(f, err)
		}
		f.filename, f.lines = name, check.lines
		return nil
	}
	size, err := fs.store.Upload(ctx, f.key, "application/octet-stream", check)
	if err != nil {
		if check.err == nil {
			// Not the file's fault: S3's, or the client went away while a
			// part was being sent. Upload left nothing stored.
			level := slog.LevelError
			if ctx.Err() != nil {
				level = slog.LevelDebug
			}
			fs.log.Log(ctx, level, "storing an uploaded file", "file_id", f.id, "err", err)
			return api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the file could not be stored; nothing was kept, retry")
		}
		var limit *api.Error
		if errors.As(check.err, &limit) {
			return limit
		}
		return fs.formError(f, check.err)
	}
	f.stored, f.filename, f.size, f.lines = true, name, size, check.lines
	return nil
}

// formField reads a form field other than the file.
func (fs *Service) formField(part *multipart.Part, f *fileForm, param string) (string, *api.Error) {
	b, err := io.ReadAll(io.LimitReader(part, maxFormFieldBytes+1))
	if err != nil {
		return "", fs.formError(f, err)
	}
	if len(b) > maxFormFieldBytes {
		return "", api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, param, "a form field other than file is over %d bytes", maxFormFieldBytes)
	}
	return string(b), nil
}

func badPurpose() *api.Error {
	return api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "purpose",
		"purpose must be batch: this API keeps files for the Batch API only")
}

// check reports what the whole form lacks or gets wrong, and works out the
// expiry.
func (f *fileForm) check() *api.Error {
	if !f.sawFile {
		return api.ParamErr(http.StatusBadRequest, CodeMissingFile, "file", "the form has no part named file")
	}
	if !f.purposeGiven {
		return api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "purpose", "purpose is required, and must be batch")
	}
	f.expiresAfter = DefaultExpiry
	if f.anchorGiven && f.anchor != "created_at" {
		return api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "expires_after", "expires_after[anchor] must be created_at")
	}
	if f.anchorGiven && !f.secondsGiven {
		return api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "expires_after", "expires_after needs seconds")
	}
	if f.secondsGiven {
		n, err := strconv.ParseInt(f.seconds, 10, 64)
		if err != nil || n < int64(MinExpiry/time.Second) || n > int64(MaxExpiry/time.Second) {
			return api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "expires_after",
				"expires_after[seconds] must be a whole number from %d to %d", int64(MinExpiry/time.Second), int64(MaxExpiry/time.Second))
		}
		f.expiresAfter = time.Duration(n) * time.Second
	}
	return nil
}

func (fs *Service) fileTooLarge() *api.Error {
	return api.ParamErr(http.StatusRequestEntityTooLarge, CodeFileTooLarge, "file",
		"the file is over the limit of %d bytes (the form, %d bytes more)", fs.cfg.MaxFileBytes, formSlack)
}

// formError is the answer to an error reading the form: the body's own
// (over its bound, too slow, over the budget, the connection's), or the
// multipart syntax's when the body read fine.
func (fs *Service) formError(f *fileForm, err error) *api.Error {
	var tooBig *http.MaxBytesError
	body := f.body
	switch {
	case body.err == nil:
		return api.Err(http.StatusBadRequest, CodeInvalidMultipart, "the body is not multipart/form-data the publisher can read")
	case errors.As(body.err, &tooBig):
		return fs.fileTooLarge()
	case errors.Is(body.err, errUploadTimeout):
		return api.Err(http.StatusRequestTimeout, CodeUploadTooSlow,
			"the upload took longer than %s; nothing was kept", fs.cfg.FileUploadTimeout)
	}
	return fs.gate.BodyError(f.w, body.err)
}

// UploadBody is an upload's request body: it charges the bytes that
// arrive to the client's bodies in flight, up to held, gives them back once
// sent, holds the body to its pace, and keeps the first error it met.
type UploadBody struct {
	r       io.Reader
	charge  *api.BodyCharge
	pace    *api.BodyPace
	held    int64
	charged int64
	arrived int64
	err     error
}

// NewUploadBody reads r as an upload: charged to charge up to held bytes
// at once, and held to pace.
func NewUploadBody(r io.Reader, charge *api.BodyCharge, pace *api.BodyPace, held int64) *UploadBody {
	return &UploadBody{r: r, charge: charge, pace: pace, held: held}
}

// Err is the first error a Read met, other than io.EOF.
func (b *UploadBody) Err() error { return b.err }

// sent gives back what the upload was charged: payload.Upload has sent
// the part that held it, and let its buffer go.
func (b *UploadBody) sent() {
	b.charge.Sub(b.charged)
	b.charged = 0
}

func (b *UploadBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.r.Read(p)
	if n > 0 {
		b.arrived += int64(n)
		if c := min(int64(n), b.held-b.charged); c > 0 {
			if e := b.charge.Add(c); e != nil {
				b.err = e
				return 0, e
			}
			b.charged += c
		}
		if !b.pace.Arrived(b.arrived) {
			b.err = api.ErrTooSlow
			return 0, b.err
		}
	}
	if err != nil && err != io.EOF {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The pace's cut, or FileUploadTimeout's deadline: postFile
			// asks the pace which.
			err = errUploadTimeout
		}
		b.err = err
	}
	return n, err
}

// lineCheck counts a file's bytes and JSONL lines as they are read through
// it, and fails the read that takes the file over a limit: MaxFileBytes,
// MaxFileLines, or MaxFileLineBytes for one line (its newline not
// counted). A line is counted from its first byte, so a last line without
// a newline is one, and a newline at the end starts none. err is the first
// error Read returned, other than io.EOF: a limit's *api.Error, or the
// source's.
type lineCheck struct {
	r            io.Reader
	body         *UploadBody // whose pace pauses while a part goes to S3
	maxBytes     int64
	maxLines     int
	maxLineBytes int64

	size    int64
	lines   int
	lineLen int64 // bytes of the current line so far
	midLine bool  // the last byte read was not a newline
	err     error
}

func (c *lineCheck) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.r.Read(p)
	if n > 0 {
		if e := c.scan(p[:n]); e != nil {
			c.err = e
			return 0, e
		}
	}
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

// Pause and Resume: payload.Upload stops reading the file while it sends a
// part to S3, and the client is not to be held to its pace for that time.
// On Resume the part has gone, and the upload holds none of what came
// before: its charge is given back, and what comes next is charged anew.
func (c *lineCheck) Pause() { c.body.pace.Pause() }
func (c *lineCheck) Resume() {
	c.body.sent()
	c.body.pace.Resume(c.body.arrived)
}

var _ payload.Pauser = (*lineCheck)(nil)

func (c *lineCheck) scan(b []byte) *api.Error {
	c.size += int64(len(b))
	if c.size > c.maxBytes {
		return api.ParamErr(http.StatusRequestEntityTooLarge, CodeFileTooLarge, "file", "the file is over the limit of %d bytes", c.maxBytes)
	}
	for len(b) > 0 {
		if !c.midLine {
			c.lines++
			c.lineLen = 0
			c.midLine = true
			if c.lines > c.maxLines {
				return api.ParamErr(http.StatusBadRequest, CodeTooManyLines, "file", "the file has more than %d lines", c.maxLines)
			}
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			c.lineLen += int64(len(b))
			b = nil
		} else {
			c.lineLen += int64(i)
			b = b[i+1:]
			c.midLine = false
		}
		if c.lineLen > c.maxLineBytes {
			return api.ParamErr(http.StatusBadRequest, CodeLineTooLarge, "file", "line %d of the file is over the limit of %d bytes", c.lines, c.maxLineBytes)
		}
	}
	return nil
}
