package payload_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
)

// pattern is n bytes that differ from part to part, so that parts sent out
// of order or twice would not read back the same.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/4093)
	}
	return b
}

// Upload stores a stream smaller than a part, one of exactly a part, and
// one of several parts with a short last one, each read back whole.
func TestUpload(t *testing.T) {
	c := sqstest.S3(t)
	s := payload.New(c, sqstest.Bucket(t, c))
	for _, n := range []int{0, 1000, payload.UploadPartBytes, 2*payload.UploadPartBytes + 12345} {
		want := pattern(n)
		key := "files/o/" + string(rune('a'+n%26)) + ".jsonl"
		// iotest.OneByteReader would take minutes; a reader that gives odd
		// sizes still crosses part boundaries mid-read.
		size, err := s.Upload(t.Context(), key, "application/octet-stream", &oddReader{r: bytes.NewReader(want)})
		if err != nil || size != int64(n) {
			t.Fatalf("Upload of %d bytes: size %d, %v", n, size, err)
		}
		got, err := s.Read(t.Context(), key)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("read back %d bytes of %d (%v); equal: %v", len(got), n, err, bytes.Equal(got, want))
		}
	}
}

// A stream that fails half-way, in its first part or after some parts were
// sent, leaves nothing: no object, and no multipart upload in progress
// (the emulator, like S3, refuses to delete a bucket that holds one).
func TestUploadFailureLeavesNothing(t *testing.T) {
	c := sqstest.S3(t)
	boom := errors.New("the client went away")
	for _, n := range []int{1000, 2*payload.UploadPartBytes + 1} {
		bucket := sqstest.Bucket(t, c)
		s := payload.New(c, bucket)
		src := io.MultiReader(bytes.NewReader(pattern(n)), errReader{boom})
		if _, err := s.Upload(t.Context(), "files/o/x.jsonl", "application/octet-stream", src); !errors.Is(err, boom) {
			t.Fatalf("Upload failing after %d bytes: %v; want the stream's error", n, err)
		}
		if keys, err := s.List(t.Context(), ""); err != nil || len(keys) != 0 {
			t.Errorf("after a failed upload of %d bytes the bucket holds %q (%v)", n, keys, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if _, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &bucket}); err != nil {
			t.Errorf("after a failed upload of %d bytes the bucket cannot be deleted (an upload left in progress?): %v", n, err)
		}
		cancel()
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// oddReader returns at most 100,003 bytes a read.
type oddReader struct{ r io.Reader }

func (o *oddReader) Read(p []byte) (int, error) {
	if len(p) > 100_003 {
		p = p[:100_003]
	}
	return o.r.Read(p)
}
