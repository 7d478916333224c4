// Package payload keeps in S3 what is too large for an SQS message, and reads
// it back verified (the claim-check pattern of the SQS extended client
// libraries, which Go lacks), under the keys of job's bucket layout.
package payload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

var (
	// ErrMissing means the object is not there (never written, or expired).
	ErrMissing = errors.New("payload: object missing")
	// ErrCorrupt means the object is there but its size or SHA-256 is not
	// what the reference says.
	ErrCorrupt = errors.New("payload: object does not match its reference")
)

// Store is one payload bucket, safe for concurrent use. S3's refusals for
// good are a *queue.Error of kind queue.ErrRefused.
type Store struct {
	client *s3.Client
	bucket string
}

func New(client *s3.Client, bucket string) *Store { return &Store{client: client, bucket: bucket} }

func (s *Store) Bucket() string { return s.bucket }

// Put stores body at key and returns the reference to it.
func (s *Store) Put(ctx context.Context, key string, body []byte) (job.PayloadRef, error) {
	sum := sha256.Sum256(body)
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))), ContentType: aws.String("application/json"),
	})
	if err != nil {
		return job.PayloadRef{}, fmt.Errorf("payload: put s3://%s/%s: %w", s.bucket, key, classify(err))
	}
	return job.PayloadRef{Bucket: s.bucket, Key: key, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])}, nil
}

// PutIfAbsent stores body at key unless an object is already there, in which
// case it returns that object's content and created false. On S3 the check
// and the write are one atomic conditional request (If-None-Match); stores
// that ignore the condition are also checked by a read first.
func (s *Store) PutIfAbsent(ctx context.Context, key string, body []byte) (created bool, existing []byte, err error) {
	if b, err := s.Read(ctx, key); err == nil {
		return false, b, nil
	} else if !errors.Is(err, ErrMissing) {
		return false, nil, err
	}
	return s.Create(ctx, key, body)
}

// Create stores body at key unless an object is already there, as
// PutIfAbsent does, but writes first: one conditional PutObject
// (If-None-Match: *), and a read only when S3 refuses it because the object
// exists (412, or 409 for a concurrent conditional write). Nothing then
// hangs on how S3 answers a read of a missing key, which is 403 rather than
// 404 to a role without s3:ListBucket on it. A store that ignores the
// condition (the fauxqs emulator) overwrites the object and reports it
// created: use PutIfAbsent where that matters there.
func (s *Store) Create(ctx context.Context, key string, body []byte) (created bool, existing []byte, err error) {
	_, err = s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(body), IfNoneMatch: aws.String("*"),
		ContentLength: aws.Int64(int64(len(body))), ContentType: aws.String("application/json"),
	})
	if preconditionFailed(err) {
		b, rerr := s.Read(ctx, key)
		return false, b, rerr
	}
	if err != nil {
		return false, nil, fmt.Errorf("payload: put s3://%s/%s: %w", s.bucket, key, classify(err))
	}
	return true, nil, nil
}

// Get fetches what ref names and checks it against the reference's size and
// SHA-256: ErrMissing or ErrCorrupt (wrapped) when it cannot be trusted.
func (s *Store) Get(ctx context.Context, ref job.PayloadRef) ([]byte, error) {
	if err := ref.Validate(); err != nil {
		return nil, err
	}
	b, err := s.read(ctx, ref.Bucket, ref.Key, ref.Size+1)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != ref.Size {
		return nil, fmt.Errorf("%w: s3://%s/%s is %d bytes, reference says %d", ErrCorrupt, ref.Bucket, ref.Key, len(b), ref.Size)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != ref.SHA256 {
		return nil, fmt.Errorf("%w: s3://%s/%s has sha256 %s, reference says %s", ErrCorrupt, ref.Bucket, ref.Key, got, ref.SHA256)
	}
	return b, nil
}

// maxRead bounds an unverified read (manifests, results, markers).
const maxRead = 64 << 20

// Read fetches key from this store's bucket, unverified.
func (s *Store) Read(ctx context.Context, key string) ([]byte, error) {
	return s.read(ctx, s.bucket, key, maxRead)
}

// ErrTooLarge means an object is larger than its reader's limit.
var ErrTooLarge = errors.New("payload: object over the read limit")

// ReadLimit is Read of an object of at most limit bytes: a larger one is
// ErrTooLarge (wrapped), having read no more than limit+1 bytes of it.
func (s *Store) ReadLimit(ctx context.Context, key string, limit int64) ([]byte, error) {
	b, err := s.read(ctx, s.bucket, key, limit+1)
	if err == nil && int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: s3://%s/%s is over %d bytes", ErrTooLarge, s.bucket, key, limit)
	}
	return b, err
}

// Open starts a read of key from this store's bucket, unverified, and
// returns the object's body with its size, which S3 sends ahead of the body:
// so a reader can refuse an object, or account for it, before reading any of
// it. The caller closes the body. A missing object is ErrMissing (wrapped).
func (s *Store) Open(ctx context.Context, key string) (body io.ReadCloser, size int64, err error) {
	out, err := s.get(ctx, s.bucket, key)
	if err != nil {
		return nil, 0, err
	}
	if out.ContentLength == nil || *out.ContentLength < 0 {
		out.Body.Close()
		return nil, 0, fmt.Errorf("payload: get s3://%s/%s: the answer has no length", s.bucket, key)
	}
	return out.Body, *out.ContentLength, nil
}

func (s *Store) get(ctx context.Context, bucket, key string) (*s3.GetObjectOutput, error) {
	// An object stored by a multipart upload (Upload) carries a checksum of
	// its parts' checksums, which the SDK cannot check on a read and says so
	// at warn level each time; S3 checked every part as it came.
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key},
		func(o *s3.Options) { o.DisableLogOutputChecksumValidationSkipped = true })
	if err != nil {
		var nsk *types.NoSuchKey
		var apiErr smithy.APIError
		if errors.As(err, &nsk) || (errors.As(err, &apiErr) && (apiErr.ErrorCode() == "NoSuchKey" || apiErr.ErrorCode() == "NotFound")) {
			return nil, fmt.Errorf("%w: s3://%s/%s", ErrMissing, bucket, key)
		}
		return nil, fmt.Errorf("payload: get s3://%s/%s: %w", bucket, key, classify(err))
	}
	return out, nil
}

func (s *Store) read(ctx context.Context, bucket, key string, limit int64) ([]byte, error) {
	out, err := s.get(ctx, bucket, key)
	if err != nil {
		return nil, err
	}
	defer out.Body.Close()
	b, err := io.ReadAll(io.LimitReader(out.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("payload: reading s3://%s/%s: %w", bucket, key, err)
	}
	return b, nil
}

// List returns every key under prefix, in S3's (lexical) order.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("payload: list s3://%s/%s: %w", s.bucket, prefix, classify(err))
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	return keys, nil
}

// refusalCodes are S3's error codes that refuse what was sent, not the
// moment it was sent in.
var refusalCodes = []string{
	"EntityTooLarge",
	"KeyTooLongError",
	"InvalidArgument",
	"MetadataTooLarge",
	"InvalidRequest",
	"MalformedXML",
	"InvalidObjectName",
}

// classify returns err as a *queue.Error of kind queue.ErrRefused when S3
// refuses what was sent for good, by one of refusalCodes or by an HTTP 413,
// and as it is otherwise.
func classify(err error) error {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && slices.Contains(refusalCodes, apiErr.ErrorCode()) {
		return &queue.Error{Kind: queue.ErrRefused, Code: apiErr.ErrorCode(), Err: err}
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusRequestEntityTooLarge {
		code := http.StatusText(http.StatusRequestEntityTooLarge)
		if apiErr != nil {
			code = apiErr.ErrorCode()
		}
		return &queue.Error{Kind: queue.ErrRefused, Code: code, Err: err}
	}
	return err
}

// Delete removes key from this store's bucket; a key that is not there is
// no error (S3 answers both alike).
func (s *Store) Delete(ctx context.Context, key string) error {
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &key}); err != nil {
		return fmt.Errorf("payload: delete s3://%s/%s: %w", s.bucket, key, err)
	}
	return nil
}

// PresignGet is a URL that reads key from this store's bucket with a plain
// GET, signed with the store's credentials (SigV4 in the query string) and
// good for expires from now, or less when those credentials expire sooner:
// S3 checks a presigned URL's signature and expiry when a request starts,
// so a download that starts in time runs to its end.
func (s *Store) PresignGet(ctx context.Context, key, contentType string, expires time.Duration) (string, error) {
	in := &s3.GetObjectInput{Bucket: &s.bucket, Key: &key}
	if contentType != "" {
		in.ResponseContentType = &contentType
	}
	req, err := s3.NewPresignClient(s.client).PresignGetObject(ctx, in, s3.WithPresignExpires(expires))
	if err != nil {
		return "", fmt.Errorf("payload: presigning s3://%s/%s: %w", s.bucket, key, err)
	}
	return req.URL, nil
}

// ErrPrecondition means a conditional write was refused: S3 answers 412
// PreconditionFailed when If-Match names an ETag the object no longer has,
// or If-None-Match: * finds the object there, and 409
// ConditionalRequestConflict when a concurrent conditional write to the key
// is under way (S3 User Guide, "Add preconditions to S3 operations with
// conditional requests"). Either way another writer won.
var ErrPrecondition = errors.New("payload: precondition failed")

// ReadVersion is ReadLimit that also returns the object's ETag, for a
// later PutIfMatch.
func (s *Store) ReadVersion(ctx context.Context, key string, limit int64) (body []byte, etag string, err error) {
	out, err := s.get(ctx, s.bucket, key)
	if err != nil {
		return nil, "", err
	}
	defer out.Body.Close()
	b, err := io.ReadAll(io.LimitReader(out.Body, limit+1))
	if err != nil {
		return nil, "", fmt.Errorf("payload: reading s3://%s/%s: %w", s.bucket, key, err)
	}
	if int64(len(b)) > limit {
		return nil, "", fmt.Errorf("%w: s3://%s/%s is over %d bytes", ErrTooLarge, s.bucket, key, limit)
	}
	return b, aws.ToString(out.ETag), nil
}

// PutIfMatch replaces key with body only if the object still has ETag etag
// (If-Match), and returns the new ETag; ErrPrecondition (wrapped) when it
// has changed since. A store that ignores the condition (the fauxqs
// emulator) overwrites it: a test of the race puts a proxy that honours it
// in front.
func (s *Store) PutIfMatch(ctx context.Context, key string, body []byte, etag string) (string, error) {
	out, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(body), IfMatch: aws.String(etag),
		ContentLength: aws.Int64(int64(len(body))), ContentType: aws.String("application/json"),
	})
	if preconditionFailed(err) {
		return "", fmt.Errorf("%w: s3://%s/%s", ErrPrecondition, s.bucket, key)
	}
	if err != nil {
		return "", fmt.Errorf("payload: put s3://%s/%s: %w", s.bucket, key, classify(err))
	}
	return aws.ToString(out.ETag), nil
}

// preconditionFailed reports whether err is S3's refusal of a conditional
// write (ErrPrecondition's two codes).
func preconditionFailed(err error) bool {
	var apiErr smithy.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode() == "PreconditionFailed" || apiErr.ErrorCode() == "ConditionalRequestConflict")
}
