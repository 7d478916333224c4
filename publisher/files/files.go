// Package files is OpenAI's Files API over the payload bucket: upload,
// list, get, content and delete, with their limits (size, lines, files per
// owner, expiry). The batch routes read a batch's input file and write its
// output files through the Record and ids this package owns.
package files

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// Config is what the Files API needs of the publisher's configuration;
// the fields mean what publisher.Config's of the same names mean, after its
// defaults.
type Config struct {
	MaxFileBytes      int64
	MaxFileLines      int
	MaxFileLineBytes  int64
	MaxFiles          int
	FileUploadTimeout time.Duration
	MinBodyRate       int64
	BodyGrace         time.Duration
	UploadHeld        int64 // the most bytes one upload holds at once: a part on its way to S3
	PublicURL         string
}

// Service serves the Files API over the payload bucket. Safe for
// concurrent use.
type Service struct {
	cfg   Config
	gate  *api.Gate
	store *payload.Store // nil: every route answers 501
	log   *slog.Logger
	now   func() time.Time
}

// New is the Files API over store, behind gate.
func New(cfg Config, gate *api.Gate, store *payload.Store, log *slog.Logger) *Service {
	return &Service{cfg: cfg, gate: gate, store: store, log: log, now: time.Now}
}

// Routes registers the Files API on mux.
func (fs *Service) Routes(mux *http.ServeMux) {
	// The files routes answer every error in OpenAI's shape (api.OpenAI),
	// their 404s and 405s included.
	mux.Handle("POST /v1/files", api.OpenAI(fs.gate.Auth(fs.gate.RateLimit(fs.withinFileLimit(http.HandlerFunc(fs.postFile))))))
	mux.Handle("GET /v1/files", api.OpenAI(fs.gate.Auth(fs.gate.RateLimit(http.HandlerFunc(fs.listFiles)))))
	mux.Handle("GET /v1/files/{id}", api.OpenAI(fs.gate.Auth(fs.gate.RateLimit(http.HandlerFunc(fs.getFile)))))
	mux.Handle("DELETE /v1/files/{id}", api.OpenAI(fs.gate.Auth(fs.gate.RateLimit(http.HandlerFunc(fs.deleteFile)))))
	mux.Handle("GET /v1/files/{id}/content", api.OpenAI(fs.gate.Auth(fs.gate.RateLimit(http.HandlerFunc(fs.fileContent)))))
	mux.Handle("/v1/files", api.OpenAI(api.MethodNotAllowed("GET, HEAD, POST")))
	mux.Handle("/v1/files/{id}", api.OpenAI(api.MethodNotAllowed("GET, HEAD, DELETE")))
	mux.Handle("/v1/files/{id}/content", api.OpenAI(api.MethodNotAllowed("GET, HEAD")))
	mux.Handle("/v1/files/", api.OpenAI(http.HandlerFunc(api.NotFound)))
}

// Files, as OpenAI's Files API has them for its Batch API: POST /v1/files
// uploads a JSONL file (fileupload.go), and GET, GET .../content and DELETE
// /v1/files/{id} and GET /v1/files read, list and delete them. A file
// belongs to the tenant whose key uploaded it, by the rule jobs follow
// (api.Gate.Owns); any other key is answered 404, as for a file that does not exist.
// Each lives in the payload bucket as two objects (job.FileKey,
// job.FileRecordKey): its content, then its record, written once the
// content is stored whole and checked. A file is there while its record is
// and it has not expired.

// Error codes of the files routes; docs/api.md lists them with the rest.
const (
	CodeMissingFile      = "missing_file"      // 400: no part named file
	CodeInvalidMultipart = "invalid_multipart" // 400: not a multipart/form-data body the publisher can read
	CodeFileTooLarge     = "file_too_large"    // 413: over MaxFileBytes
	CodeTooManyLines     = "too_many_lines"    // 400: over MaxFileLines
	CodeLineTooLarge     = "line_too_large"    // 400: a line over MaxFileLineBytes
	CodeUploadTooSlow    = "upload_too_slow"   // 408: over FileUploadTimeout
	CodeTooManyFiles     = "too_many_files"    // 403: the owner holds MaxFiles files
)

// PurposeBatch is the one purpose a file may be uploaded for: input to
// OpenAI's Batch API.
const PurposeBatch = "batch"

// PurposeBatchOutput is the purpose of a batch's output and error files,
// which the publisher writes (publisher/batches/batchfiles.go) and no client may upload.
const PurposeBatchOutput = "batch_output"

// File expiry, as OpenAI's: a batch file expires 30 days after it was
// created unless expires_after says otherwise, 1 hour to 30 days. The
// bucket's lifecycle rule for files/ deletes it some time after that.
const (
	DefaultExpiry = 30 * 24 * time.Hour
	MinExpiry     = time.Hour
	MaxExpiry     = 30 * 24 * time.Hour
)

// Listing: OpenAI's limit, 1 to 10,000, and 10,000 by default.
const maxFileList = 10_000

// maxListSkips bounds the records a listing reads beyond its page and the
// one more that says has_more: records of files that expired, or were
// deleted, since the keys were listed.
const maxListSkips = 100

// removeExpiredFile deletes owner's expired file id, record first, as
// DELETE does: it is gone for every route already, and this keeps the
// next listing from reading it again (the bucket's lifecycle rule would
// remove it only days later). A failure is left to the lifecycle rule.
func (fs *Service) removeExpiredFile(ctx context.Context, owner, id string) {
	if err := fs.store.Delete(ctx, job.FileRecordKey(owner, id)); err != nil {
		fs.log.Warn("deleting an expired file's record", "file_id", id, "err", err)
		return
	}
	if err := fs.store.Delete(ctx, job.FileKey(owner, id)); err != nil {
		fs.log.Warn("deleting an expired file's content", "file_id", id, "err", err)
	}
}

// fileObject is a file as the API answers it: OpenAI's FileObject. status is
// deprecated there but still sent, always "processed" once the upload is
// answered.
type fileObject struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	ExpiresAt int64  `json:"expires_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	Status    string `json:"status"`
}

// Record is what the bucket keeps of a file besides its content.
type Record struct {
	V         int    `json:"v"`
	ID        string `json:"id"`
	Owner     string `json:"owner"` // the owner rule's (api.Gate.Owner), "" without keys
	Filename  string `json:"filename"`
	Bytes     int64  `json:"bytes"`
	Lines     int    `json:"lines"` // JSONL lines, as MaxFileLines counts them
	Purpose   string `json:"purpose"`
	CreatedAt int64  `json:"created_at"` // Unix seconds
	ExpiresAt int64  `json:"expires_at"` // Unix seconds
}

func (f *Record) object() fileObject {
	return fileObject{ID: f.ID, Object: "file", Bytes: f.Bytes, CreatedAt: f.CreatedAt, ExpiresAt: f.ExpiresAt,
		Filename: f.Filename, Purpose: f.Purpose, Status: "processed"}
}

func (f *Record) expired(now time.Time) bool { return now.Unix() >= f.ExpiresAt }

// maxFileRecord bounds the read of a record: a few hundred bytes, and a
// file name of at most maxFilenameBytes.
const maxFileRecord = 8 << 10

// File ids: "file-", then a timeID whose last bit says the file's purpose
// (WithPurpose). The time first, so that ids sort as the files were
// created: a listing sorts the keys S3 lists and reads only the records of
// the page it answers. The purpose bit lets a listing for one purpose pass
// the other's files by without reading their records, and the time lets it
// pass by files older than the longest expiry. The random bits (79) keep
// ids unguessable, though another tenant's id would only get a 404 anyway.
const IDPrefix = "file-"

// NewID is the id of a file uploaded now.
func NewID(now time.Time) string { return WithPurpose(api.NewTimeID(IDPrefix, now), PurposeBatch) }

// WithPurpose is id, a file id, with its last bit set for purpose: 1 for a
// batch's output or error file, 0 for an upload.
func WithPurpose(id, purpose string) string {
	v := strings.IndexByte(hexDigits, id[len(id)-1]) &^ 1
	if purpose == PurposeBatchOutput {
		v |= 1
	}
	return id[:len(id)-1] + hexDigits[v:v+1]
}

const hexDigits = "0123456789abcdef"

// idPurpose is the purpose WithPurpose put in id. The id of a file made
// before ids carried one (vramq before issue 34) says either at random, so
// a listing by purpose may leave such a file out (never list one of the
// other purpose: the record's is checked too) until it expires, within 30
// days.
func idPurpose(id string) string {
	if strings.IndexByte(hexDigits, id[len(id)-1])&1 == 1 {
		return PurposeBatchOutput
	}
	return PurposeBatch
}

// surelyExpired reports whether file id has expired whatever its record
// says: it was made (its timeID's milliseconds) longer ago than the longest
// expiry.
func surelyExpired(id string, now time.Time) bool {
	var b [8]byte
	_, _ = hex.Decode(b[2:], []byte(id[len(IDPrefix):len(IDPrefix)+12])) // ValidID: hex
	made := time.UnixMilli(int64(binary.BigEndian.Uint64(b[:])))
	return now.Sub(made) > MaxExpiry
}

// ValidID is checked before an id reaches an S3 key, so that no id can
// name another object.
func ValidID(id string) bool { return api.ValidTimeID(IDPrefix, id) }

func noFile() *api.Error {
	return api.ParamErr(http.StatusNotFound, api.CodeNotFound, "id", "No such File object")
}

func noFileStore() *api.Error {
	return api.Err(http.StatusNotImplemented, api.CodeStatusUnavailable,
		"files need a payload bucket, and this publisher has none (-payload-bucket)")
}

// loadFile reads the record of the file r's path names, answering the
// request itself (and returning nil) when there is no bucket, no such file
// of the caller's, or the record cannot be read.
func (fs *Service) loadFile(w http.ResponseWriter, r *http.Request) (f *Record, fail func(*api.Error)) {
	fail = api.FailWith(w, r)
	if fs.store == nil {
		fail(noFileStore())
		return nil, fail
	}
	id := r.PathValue("id")
	if !ValidID(id) {
		fail(noFile())
		return nil, fail
	}
	f, err := fs.ReadRecord(r, job.FileRecordKey(fs.gate.Owner(r), id))
	switch {
	case errors.Is(err, payload.ErrMissing):
		fail(noFile())
		return nil, fail
	case err != nil:
		fs.log.Error("reading a file record", "file_id", id, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the file's record could not be read"))
		return nil, fail
	case f.ID != id:
		fail(noFile())
		return nil, fail
	}
	return f, fail
}

// errFileExpired is readFileRecord's payload.ErrMissing for a record that
// is there, the caller's, and expired.
var errFileExpired = fmt.Errorf("%w: the file has expired", payload.ErrMissing)

// readFileRecord reads the record at key: payload.ErrMissing (wrapped) when
// there is none, or it is not the caller's, or it has expired
// (errFileExpired).
func (fs *Service) ReadRecord(r *http.Request, key string) (*Record, error) {
	raw, err := fs.store.ReadLimit(r.Context(), key, maxFileRecord)
	if err != nil {
		return nil, err
	}
	var f Record
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, err
	}
	// The key is the owner's already; the record's own word is checked too,
	// by the rule every route follows.
	if !fs.gate.Owns(r, f.Owner) {
		return nil, payload.ErrMissing
	}
	if f.expired(fs.now()) {
		return nil, errFileExpired
	}
	return &f, nil
}

// getFile is GET /v1/files/{id}: the file object.
func (fs *Service) getFile(w http.ResponseWriter, r *http.Request) {
	f, _ := fs.loadFile(w, r)
	if f == nil {
		return
	}
	api.WriteJSON(w, http.StatusOK, f.object())
}

// contentLinkExpiry is how long the presigned URL a large download is sent
// to may be started in: long enough for a client to follow the redirect,
// short enough that a URL seen in a log is soon worthless.
const contentLinkExpiry = 5 * time.Minute

// fileContent is GET /v1/files/{id}/content: the file's bytes as uploaded,
// streamed from the bucket; or, for a file too large for the response
// (under Lambda, which sends a response in one piece of at most 6 MB), a
// 307 to a presigned URL of the content, which the SDKs' HTTP clients
// follow. S3 serves that GET itself, to any size; the redirect goes to
// another host, so a client's bearer key is not sent on to S3 (Go's
// net/http and the Fetch standard both drop Authorization there).
func (fs *Service) fileContent(w http.ResponseWriter, r *http.Request) {
	f, fail := fs.loadFile(w, r)
	if f == nil {
		return
	}
	if most := api.MaxResponseBody(r); most >= 0 && f.Bytes > most && r.Method != http.MethodHead {
		u, err := fs.store.PresignGet(r.Context(), job.FileKey(f.Owner, f.ID), "application/octet-stream", contentLinkExpiry)
		if err != nil {
			fs.log.Error("presigning a file's content", "file_id", f.ID, "err", err)
			fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the file could not be read"))
			return
		}
		if fs.cfg.PublicURL != "" {
			// The same path and query on the API's own origin, which the
			// edge routes to the bucket: S3 checks the signature against
			// the bucket's host, which the edge sets.
			pu, err := url.Parse(u)
			if err != nil {
				fs.log.Error("presigning a file's content", "file_id", f.ID, "err", err)
				fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the file could not be read"))
				return
			}
			u = strings.TrimSuffix(fs.cfg.PublicURL, "/") + pu.EscapedPath() + "?" + pu.RawQuery
		}
		w.Header().Set("Location", u)
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusTemporaryRedirect)
		return
	}
	body, size, err := fs.store.Open(r.Context(), job.FileKey(f.Owner, f.ID))
	switch {
	case errors.Is(err, payload.ErrMissing):
		// The record is written after the content and deleted before it:
		// the bucket's lifecycle rule took it.
		fail(noFile())
		return
	case err != nil:
		fs.log.Error("reading a file", "file_id", f.ID, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the file could not be read"))
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if n, err := io.Copy(w, body); err != nil {
		// The status is sent: the client sees a body shorter than its
		// Content-Length.
		fs.log.Warn("sending a file", "file_id", f.ID, "sent", n, "bytes", size, "err", err)
	}
}

// fileDeleted is DELETE's answer: OpenAI's FileDeleted.
type fileDeleted struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Deleted bool   `json:"deleted"`
}

// deleteFile is DELETE /v1/files/{id}. The record goes first: once it is
// gone the file is, for every route; content left behind by a failed
// delete is the bucket's lifecycle rule's to remove.
func (fs *Service) deleteFile(w http.ResponseWriter, r *http.Request) {
	f, fail := fs.loadFile(w, r)
	if f == nil {
		return
	}
	if err := fs.store.Delete(r.Context(), job.FileRecordKey(f.Owner, f.ID)); err != nil {
		fs.log.Error("deleting a file record", "file_id", f.ID, "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the file could not be deleted; it is still there, and the DELETE may be repeated"))
		return
	}
	if err := fs.store.Delete(r.Context(), job.FileKey(f.Owner, f.ID)); err != nil {
		fs.log.Warn("deleting a file's content (its record is gone; the lifecycle rule will remove it)", "file_id", f.ID, "err", err)
	}
	api.WriteJSON(w, http.StatusOK, fileDeleted{ID: f.ID, Object: "file", Deleted: true})
}

// listFiles is GET /v1/files: the caller's files, newest first unless
// order=asc, limit of them after the file after names (which need not
// still exist), only those of purpose when it is given. The keys of the
// caller's files are listed and sorted by id, which sorts them by creation;
// ids of the other purpose (idPurpose) and of files made longer ago than
// the longest expiry are passed by unread; then only the records the page
// needs are read (and one more, for has_more), api.ReadConcurrency at a time,
// and at most limit+1+maxListSkips of them: a page the bound cuts short
// says has_more. Expired records that are read are deleted, so that each
// costs one read once.
func (fs *Service) listFiles(w http.ResponseWriter, r *http.Request) {
	fail := api.FailWith(w, r)
	if fs.store == nil {
		fail(noFileStore())
		return
	}
	if e := fs.gate.CanList(r); e != nil {
		fail(e)
		return
	}
	q := r.URL.Query()
	limit, e := api.ListLimit(q, maxFileList, maxFileList)
	if e != nil {
		fail(e)
		return
	}
	desc := true
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		desc = false
	default:
		fail(api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "order", "order must be asc or desc"))
		return
	}
	after := q.Get("after")
	if after != "" && !ValidID(after) {
		fail(api.ParamErr(http.StatusBadRequest, api.CodeInvalidParameter, "after", "after must be the id of a file"))
		return
	}
	purpose := q.Get("purpose")

	prefix := job.FilesPrefix(fs.gate.Owner(r))
	ids, err := api.ListIDs(r.Context(), fs.store, prefix, ValidID)
	if err != nil {
		fs.log.Error("listing files", "err", err)
		fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the files could not be listed"))
		return
	}
	now := fs.now()
	ids = slices.DeleteFunc(ids, func(id string) bool {
		return surelyExpired(id, now) || purpose != "" && idPurpose(id) != purpose
	})
	if desc {
		slices.Reverse(ids)
	}
	if after != "" {
		i, _ := slices.BinarySearchFunc(ids, after, func(id, after string) int {
			if desc {
				return strings.Compare(after, id)
			}
			return strings.Compare(id, after)
		})
		for i < len(ids) && ids[i] == after {
			i++
		}
		ids = ids[i:]
	}

	page := []fileObject{}
	reads, most := 0, limit+1+maxListSkips
	for len(page) <= limit && len(ids) > 0 && reads < most {
		// Read as many as the page still needs (one over it: has_more),
		// at least a round of api.ReadConcurrency, within the bound.
		n := min(len(ids), max(limit+1-len(page), api.ReadConcurrency), most-reads)
		recs := make([]*Record, n)
		g, gctx := errgroup.WithContext(r.Context())
		g.SetLimit(api.ReadConcurrency)
		for i, id := range ids[:n] {
			g.Go(func() error {
				f, err := fs.ReadRecord(r.WithContext(gctx), prefix+id+".json")
				if errors.Is(err, errFileExpired) {
					fs.removeExpiredFile(gctx, fs.gate.Owner(r), id)
				}
				if errors.Is(err, payload.ErrMissing) {
					return nil // deleted since the listing, or expired
				}
				if err != nil {
					return err
				}
				if f.ID == id {
					recs[i] = f
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			fs.log.Error("reading file records", "err", err)
			fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the files could not be listed"))
			return
		}
		for _, f := range recs {
			if f != nil && (purpose == "" || f.Purpose == purpose) {
				page = append(page, f.object())
			}
		}
		ids, reads = ids[n:], reads+n
	}
	// Past limit, or cut short by the bound with ids left unread.
	more := len(page) > limit || len(ids) > 0 && reads >= most
	if len(page) > limit {
		page = page[:limit]
	}
	out := api.NewListPage(page, more, func(f fileObject) string { return f.ID })
	api.WriteJSON(w, http.StatusOK, out)
}

// withinFileLimit refuses an upload, before its body is read, while the
// caller's owner holds MaxFiles files: their records' keys, less those
// surely expired (one List a 1,000 keys, no record read). 403, not 429:
// the SDKs retry a 429, and only a DELETE or an expiry makes room.
func (fs *Service) withinFileLimit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fs.store == nil {
			next.ServeHTTP(w, r)
			return
		}
		fail := api.FailWith(w, r)
		ids, err := api.ListIDs(r.Context(), fs.store, job.FilesPrefix(fs.gate.Owner(r)), ValidID)
		if err != nil {
			fs.log.Error("counting files", "err", err)
			fail(api.Err(http.StatusServiceUnavailable, api.CodeStoreUnavailable, "the files could not be counted; nothing was kept"))
			return
		}
		now := fs.now()
		held := 0
		for _, id := range ids {
			if !surelyExpired(id, now) {
				held++
			}
		}
		if held >= fs.cfg.MaxFiles {
			fail(api.ParamErr(http.StatusForbidden, CodeTooManyFiles, "file",
				"this caller holds %d files, the most it may (-max-files); delete some (DELETE /v1/files/{id}) or wait for them to expire", fs.cfg.MaxFiles))
			return
		}
		next.ServeHTTP(w, r)
	})
}
