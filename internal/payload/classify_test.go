package payload

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/vramq/vramq/subscriber/queue"
)

// classify over each kind of error S3 gives: an API error, a bare HTTP
// response, and an error with neither.
func TestClassify(t *testing.T) {
	status := func(code int) error {
		return &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: code}},
			Err:      errors.New("transport"),
		}
	}
	for _, tc := range []struct {
		err  error
		code string // "": returned as it is
	}{
		{fmt.Errorf("put: %w", &smithy.GenericAPIError{Code: "EntityTooLarge"}), "EntityTooLarge"},
		{&smithy.GenericAPIError{Code: "KeyTooLongError"}, "KeyTooLongError"},
		{&smithy.GenericAPIError{Code: "MalformedXML"}, "MalformedXML"},
		{&smithy.GenericAPIError{Code: "InvalidArgument"}, "InvalidArgument"},
		{status(http.StatusRequestEntityTooLarge), "Request Entity Too Large"},
		{&smithy.GenericAPIError{Code: "ThrottlingException"}, ""},
		{&smithy.GenericAPIError{Code: "AccessDenied"}, ""},
		{&smithy.GenericAPIError{Code: "InvalidMessageContents"}, ""}, // SQS's, not S3's
		{status(http.StatusServiceUnavailable), ""},
		{errors.New("timeout"), ""},
	} {
		got := classify(tc.err)
		var qe *queue.Error
		switch {
		case tc.code == "" && got != tc.err:
			t.Errorf("classify(%v) = %#v; want it as it is", tc.err, got)
		case tc.code != "" && (!errors.As(got, &qe) || qe.Kind != queue.ErrRefused || qe.Code != tc.code || !errors.Is(got, tc.err)):
			t.Errorf("classify(%v) = %#v; want a refusal, code %q, wrapping it", tc.err, got, tc.code)
		}
	}
}

// A put that S3 refuses for good returns a refusal the subscriber can read
// without reading S3's codes.
func TestPutRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>EntityTooLarge</Code><Message>too large</Message></Error>`)
	}))
	defer srv.Close()
	client := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("k", "s", ""),
	})
	s := New(client, "b")
	_, err := s.Put(t.Context(), "results/j/0.json", []byte("{}"))
	var qe *queue.Error
	if !errors.Is(err, queue.ErrRefused) || !errors.As(err, &qe) || qe.Code != "EntityTooLarge" {
		t.Errorf("Put: %v; want a refusal with code EntityTooLarge", err)
	}
	_, _, err = s.PutIfAbsent(t.Context(), "results/j/0.json", []byte("{}"))
	if !errors.Is(err, queue.ErrRefused) {
		t.Errorf("PutIfAbsent: %v; want a refusal", err)
	}
}
