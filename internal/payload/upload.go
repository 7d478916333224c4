package payload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// UploadPartBytes is what Upload holds of a stream at once: S3's smallest
// part of a multipart upload (all but the last must be at least 5 MiB).
const UploadPartBytes = 5 << 20

// MaxUploadBytes is the largest stream Upload stores: S3's 10,000 parts of
// UploadPartBytes.
const MaxUploadBytes = 10_000 * UploadPartBytes

// uploadStep is the first buffer of an upload: a small file does not cost a
// whole part's buffer.
const uploadStep = 32 << 10

// cleanupTimeout bounds the abort of a failed multipart upload, which runs
// even when the caller's context has ended (a client that went away).
const cleanupTimeout = 30 * time.Second

// Pauser is a stream that Upload tells when it stops reading it to send a
// part to S3 (Pause) and when it reads on (Resume): a stream held to a pace
// (a client's request body) must not be blamed for the time S3 takes.
type Pauser interface {
	Pause()
	Resume()
}

// Upload stores what src yields, to its EOF, at key, and returns its size. It
// streams: it holds at most UploadPartBytes of src at once, whatever src's
// size. A stream that fits in one part is one PutObject of known length; a
// larger one is a multipart upload, one part at a time, aborted on any error
// so that none of it stays stored (the bucket's lifecycle rule aborts what a
// process that died mid-way leaves). S3 needs a part's length before its
// first byte, which a stream of unknown size (a multipart/form-data file) has
// only part by part.
//
// A src that is a Pauser is paused around each request to S3.
//
// An error of src is returned wrapped (errors.Is and errors.As find it), and
// nothing is stored; so is a stream over MaxUploadBytes.
func (s *Store) Upload(ctx context.Context, key, contentType string, src io.Reader) (int64, error) {
	buf := make([]byte, 0, uploadStep)
	eof, err := fillPart(&buf, src)
	if err != nil {
		return 0, err
	}
	// src's form may go on after it (more fields), and is read again once
	// the upload is done.
	pause, resume := pauser(src)
	pause()
	defer resume()
	if eof {
		_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(buf),
			ContentLength: aws.Int64(int64(len(buf))), ContentType: &contentType,
		})
		if err != nil {
			return 0, fmt.Errorf("payload: put s3://%s/%s: %w", s.bucket, key, classify(err))
		}
		return int64(len(buf)), nil
	}
	// CRC32 named from the start: S3 checks each part against it and the
	// completed object against them all; left unnamed, S3 picks a default
	// that the SDK's own part checksums need not match.
	created, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket: &s.bucket, Key: &key, ContentType: &contentType, ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
	})
	if err != nil {
		return 0, fmt.Errorf("payload: start upload s3://%s/%s: %w", s.bucket, key, classify(err))
	}
	size, err := s.uploadParts(ctx, key, created.UploadId, buf, src, pause, resume)
	if err != nil {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if _, aerr := s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{
			Bucket: &s.bucket, Key: &key, UploadId: created.UploadId,
		}); aerr != nil {
			err = errors.Join(err, fmt.Errorf("payload: abort upload s3://%s/%s: %w", s.bucket, key, aerr))
		}
		return 0, err
	}
	return size, nil
}

// uploadParts sends buf, a full first part, and the rest of src, a part at
// a time through buf, then completes the upload.
func (s *Store) uploadParts(ctx context.Context, key string, uploadID *string, buf []byte, src io.Reader, pause, resume func()) (int64, error) {
	var parts []types.CompletedPart
	var size int64
	for n, last := int32(1), false; ; n++ {
		pause() // a no-op for the first part
		out, err := s.client.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: &s.bucket, Key: &key, UploadId: uploadID, PartNumber: aws.Int32(n),
			Body: bytes.NewReader(buf), ContentLength: aws.Int64(int64(len(buf))),
			ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
		})
		if err != nil {
			return 0, fmt.Errorf("payload: upload part %d of s3://%s/%s: %w", n, s.bucket, key, classify(err))
		}
		// The ETag without its quotes, which S3 takes either way: the SDK
		// writes a quote in XML as &#34;, which the fauxqs emulator does not
		// read as one.
		etag := strings.Trim(aws.ToString(out.ETag), `"`)
		parts = append(parts, types.CompletedPart{PartNumber: aws.Int32(n), ETag: &etag, ChecksumCRC32: out.ChecksumCRC32})
		size += int64(len(buf))
		if last {
			break
		}
		resume()
		// The part's buffer goes with it: a stream slow to yield the next
		// holds only what it has yielded of it (the publisher charges an
		// upload so), not a whole part while it waits.
		buf = nil
		eof, err := fillPart(&buf, src)
		if err != nil {
			return 0, err
		}
		if len(buf) == 0 {
			break // src ended with the part just sent
		}
		if size+int64(len(buf)) > MaxUploadBytes {
			return 0, fmt.Errorf("payload: upload to s3://%s/%s is over %d bytes", s.bucket, key, int64(MaxUploadBytes))
		}
		last = eof // the last part may be shorter than the rest
	}
	pause()
	_, err := s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &s.bucket, Key: &key, UploadId: uploadID, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	})
	if err != nil {
		return 0, fmt.Errorf("payload: complete upload s3://%s/%s: %w", s.bucket, key, classify(err))
	}
	return size, nil
}

// fillPart reads src into *buf until it holds UploadPartBytes or src ends
// (eof). The buffer doubles from its capacity up to UploadPartBytes, so
// what it holds is never more than twice what src gave.
func fillPart(buf *[]byte, src io.Reader) (eof bool, err error) {
	b := *buf
	defer func() { *buf = b }()
	for len(b) < UploadPartBytes {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), min(max(2*cap(b), uploadStep), UploadPartBytes))
			copy(nb, b)
			b = nb
		}
		n, err := src.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("payload: reading the stream to upload: %w", err)
		}
	}
	return false, nil
}

// pauser is src's Pause and Resume, or no-ops; pause after pause, or resume
// after resume, does nothing.
func pauser(src io.Reader) (pause, resume func()) {
	ps, ok := src.(Pauser)
	if !ok {
		return func() {}, func() {}
	}
	paused := false
	return func() {
			if !paused {
				paused = true
				ps.Pause()
			}
		}, func() {
			if paused {
				paused = false
				ps.Resume()
			}
		}
}
