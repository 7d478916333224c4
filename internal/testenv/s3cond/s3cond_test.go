package s3cond_test

import (
	"errors"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/s3cond"
	"github.com/vramq/vramq/internal/testenv/sqstest"
)

// Through the proxy, the emulator's bucket refuses what S3 refuses: a
// create-if-absent of a key that exists, and a write If-Match an ETag the
// object no longer has (412), or of an object that is not there (404).
func TestConditionalWrites(t *testing.T) {
	c := sqstest.S3(t)
	bucket := sqstest.Bucket(t, c)
	endpoint := os.Getenv("AWS_ENDPOINT_URL_S3")
	if endpoint == "" {
		endpoint = os.Getenv("AWS_ENDPOINT_URL")
	}
	p := s3cond.New(t, endpoint)
	opts := c.Options()
	opts.BaseEndpoint = aws.String(p.URL)
	s := payload.New(s3.New(opts), bucket)
	ctx := t.Context()

	if created, _, err := s.Create(ctx, "k", []byte("one")); err != nil || !created {
		t.Fatalf("first Create: %v %v", created, err)
	}
	if created, existing, err := s.Create(ctx, "k", []byte("two")); err != nil || created || string(existing) != "one" {
		t.Fatalf("second Create: created %v, existing %q, %v; want the first", created, existing, err)
	}
	_, etag, err := s.ReadVersion(ctx, "k", 100)
	if err != nil || etag == "" {
		t.Fatalf("ReadVersion: %q %v", etag, err)
	}
	next, err := s.PutIfMatch(ctx, "k", []byte("three"), etag)
	if err != nil || next == "" || next == etag {
		t.Fatalf("PutIfMatch at the current ETag: %q %v", next, err)
	}
	if _, err := s.PutIfMatch(ctx, "k", []byte("four"), etag); !errors.Is(err, payload.ErrPrecondition) {
		t.Errorf("PutIfMatch at a stale ETag: %v; want ErrPrecondition", err)
	}
	if _, err := s.PutIfMatch(ctx, "missing", []byte("x"), etag); err == nil {
		t.Error("PutIfMatch of a missing object succeeded")
	}
	if b, _ := s.Read(ctx, "k"); string(b) != "three" {
		t.Errorf("the object is %q; want three", b)
	}
	if n := p.Count("PUT", bucket, "k"); n != 4 {
		t.Errorf("counted %d PUTs of k; want 4", n)
	}
}
