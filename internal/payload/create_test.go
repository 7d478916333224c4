package payload_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/vramq/vramq/internal/payload"
)

// iamS3 answers as S3 does a role with s3:GetObject and s3:PutObject but no
// s3:ListBucket on the keys: a read of a missing key is 403, and a
// conditional write of a key that exists is 412. It records each request.
type iamS3 struct {
	mu   sync.Mutex
	objs map[string][]byte
	log  []string
}

func (f *iamS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, r.Method+" "+r.URL.Path)
	fail := func(status int, code string) {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>`+code+`</Code><Message>no</Message></Error>`)
	}
	switch r.Method {
	case http.MethodPut:
		b, _ := io.ReadAll(r.Body)
		if _, ok := f.objs[r.URL.Path]; ok && r.Header.Get("If-None-Match") == "*" {
			fail(http.StatusPreconditionFailed, "PreconditionFailed")
			return
		}
		f.objs[r.URL.Path] = b
		w.Header().Set("ETag", `"x"`)
	case http.MethodGet:
		b, ok := f.objs[r.URL.Path]
		if !ok {
			fail(http.StatusForbidden, "AccessDenied")
			return
		}
		_, _ = w.Write(b)
	default:
		fail(http.StatusMethodNotAllowed, "MethodNotAllowed")
	}
}

func (f *iamS3) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

// Issue 25, item 13: Create writes first and reads only after a 412, so it
// works where a missing key reads as 403; PutIfAbsent, which reads first,
// does not.
func TestCreateWritesFirst(t *testing.T) {
	f := &iamS3{objs: map[string][]byte{}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := s3.New(s3.Options{BaseEndpoint: aws.String(srv.URL), UsePathStyle: true, Region: "us-east-1",
		Credentials:                credentials.NewStaticCredentialsProvider("k", "s", ""),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired})
	s := payload.New(c, "b")

	created, _, err := s.Create(t.Context(), "done/j.json", []byte("first"))
	if err != nil || !created {
		t.Fatalf("first Create: created %v, %v", created, err)
	}
	if got := f.requests(); len(got) != 1 || got[0] != "PUT /b/done/j.json" {
		t.Errorf("first Create made requests %q; want one PUT", got)
	}
	created, existing, err := s.Create(t.Context(), "done/j.json", []byte("second"))
	if err != nil || created || string(existing) != "first" {
		t.Errorf("second Create: created %v, existing %q, %v; want the first body", created, existing, err)
	}
	if got := f.requests(); strings.Join(got[1:], ",") != "PUT /b/done/j.json,GET /b/done/j.json" {
		t.Errorf("second Create made requests %q; want a PUT, then a GET", got[1:])
	}
	// What Create spares: PutIfAbsent's read of the missing key is refused.
	if _, _, err := s.PutIfAbsent(t.Context(), "done/k.json", []byte("x")); err == nil || errors.Is(err, payload.ErrMissing) {
		t.Errorf("PutIfAbsent where a missing key reads as 403: %v; want the refusal", err)
	}
}
