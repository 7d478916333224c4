package publisher_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime/multipart"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/vramq/vramq/internal/testenv/apigw"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/publishertest"
)

// upload sends data as a batch file named name with c.
func upload(t *testing.T, c *apiClient, name string, data []byte) *fileObject {
	t.Helper()
	f, err := c.newFile(t.Context(), fileParams{name: name, data: data})
	if err != nil {
		t.Fatalf("uploading %s: %v", name, apiError(err))
	}
	return f
}

// wantAPIError checks that err is the API's answer status with code and
// param, in OpenAI's shape: an error object with a message, a type, and
// a param (null when the answer names none).
func wantAPIError(t *testing.T, what string, err error, status int, code, param string) {
	t.Helper()
	var e *apiErr
	if !errors.As(err, &e) {
		t.Errorf("%s: %v; want an API error", what, err)
		return
	}
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	}
	if e.StatusCode != status || e.Code != code || e.Type == nil || *e.Type != typ || e.Message == "" ||
		(param != "" && (e.Param == nil || *e.Param != param)) || (param == "" && e.Param != nil && *e.Param != "") {
		t.Errorf("%s: %s; want %d with code %q, param %q, type %q and a message", what, apiError(err), status, code, param, typ)
	}
}

// batchLines is a batch file of n embeddings requests (publishertest.BatchLines).
var batchLines = publishertest.BatchLines

// rawUpload posts a form of the fields before (name, value), a file part
// unless file is nil, and the fields after; it returns the status and body.
func (s *server) rawUpload(t *testing.T, key string, before [][2]string, file []byte, after [][2]string) (int, string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	fields := func(fs [][2]string) {
		for _, f := range fs {
			if err := w.WriteField(f[0], f[1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	fields(before)
	if file != nil {
		fw, err := w.CreateFormFile("file", "f.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fw.Write(file); err != nil {
			t.Fatal(err)
		}
	}
	fields(after)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r := s.do("POST", "/v1/files", map[string]string{"Authorization": "Bearer " + key, "Content-Type": w.FormDataContentType()}, buf.Bytes())
	return r.status, string(r.body)
}

// Issue 28, files: each upload a Batch API client can get wrong is refused
// with a clear error in OpenAI's shape, and leaves nothing stored: no
// object, and no multipart upload in progress (an upload over a limit
// after some of its 5 MiB parts were sent).
func TestFileUploadRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{
		MaxFileBytes:     6 << 20,
		MaxFileLines:     40,
		MaxFileLineBytes: 1 << 20,
		API: publisher.API{
			APIKeys: []string{"acme:key-a"},
		},
	})
	a := s.client("key-a")
	ctx := t.Context()
	line := func(n int) []byte { return append(bytes.Repeat([]byte("x"), n), '\n') }
	file := func(data []byte) fileParams { return fileParams{name: "f.jsonl", data: data} }
	small := e.serve(publisher.Config{MaxFileBytes: 1000, API: publisher.API{APIKeys: []string{"acme:key-a"}}}).client("key-a")
	for _, tc := range []struct {
		name         string
		client       *apiClient
		params       fileParams
		status       int
		code, param  string
		messageAbout string
	}{
		{"wrong purpose", a, fileParams{name: "f.jsonl", data: batchLines(1, "p"), purpose: "fine-tune"},
			400, "invalid_parameter", "purpose", "batch"},
		{"over the line limit", a, file(batchLines(41, "l")), 400, "too_many_lines", "file", "40 lines"},
		{"over the size limit", small, file(slices.Concat(line(999), line(1))), 413, "file_too_large", "file", "1000 bytes"},
		{"a line over its size", a, file(slices.Concat(line(10), line(1<<20+1))), 400, "line_too_large", "file", "line 2"},
		{"over the size limit, after a part was sent", a, file(bytes.Repeat(line(200<<10-1), 31)), 413, "file_too_large", "file", "6291456 bytes"},
		{"over the line limit, after a part was sent", a, file(slices.Concat(bytes.Repeat(line(140<<10-1), 39), line(10), line(10))),
			400, "too_many_lines", "file", "40 lines"},
		{"expiry out of range", a, fileParams{name: "f.jsonl", data: batchLines(1, "e"), expiresAfter: 60}, 400, "invalid_parameter", "expires_after", "3600"},
	} {
		_, err := tc.client.newFile(ctx, tc.params)
		wantAPIError(t, tc.name, err, tc.status, tc.code, tc.param)
		var ae *apiErr
		if errors.As(err, &ae) && !strings.Contains(ae.Message, tc.messageAbout) {
			t.Errorf("%s: message %q does not say %q", tc.name, ae.Message, tc.messageAbout)
		}
	}
	// What the SDK cannot send.
	for _, tc := range []struct {
		name        string
		before      [][2]string
		file        []byte
		after       [][2]string
		status      int
		code, param string
	}{
		{"no file part", [][2]string{{"purpose", "batch"}}, nil, nil, 400, "missing_file", "file"},
		{"no purpose", nil, batchLines(1, "n"), nil, 400, "invalid_parameter", "purpose"},
		{"a wrong purpose after the file", nil, batchLines(1, "n"), [][2]string{{"purpose", "assistants"}}, 400, "invalid_parameter", "purpose"},
		{"two files", [][2]string{{"purpose", "batch"}, {"file", "x"}}, batchLines(1, "n"), nil, 400, "invalid_multipart", "file"},
	} {
		status, body := s.rawUpload(t, "key-a", tc.before, tc.file, tc.after)
		want := fmt.Sprintf(`"param":%q`, tc.param)
		if status != tc.status || !strings.Contains(body, `"code":"`+tc.code+`"`) || !strings.Contains(body, want) ||
			!strings.Contains(body, `"type":"invalid_request_error"`) {
			t.Errorf("%s: %d %s; want %d, code %s, %s", tc.name, status, body, tc.status, tc.code, want)
		}
	}
	r := s.do("POST", "/v1/files", map[string]string{"Authorization": "Bearer key-a", "Content-Type": "application/json"}, []byte(`{"purpose":"batch"}`))
	if r.status != 415 || !strings.Contains(string(r.body), `"type":"invalid_request_error","param":null,"code":"unsupported_media_type"`) {
		t.Errorf("a JSON body: %d %s", r.status, r.body)
	}
	r = s.do("PATCH", "/v1/files/file-0", map[string]string{"Authorization": "Bearer key-a"}, nil)
	if r.status != 405 || r.header.Get("Allow") != "GET, HEAD, DELETE" || !strings.Contains(string(r.body), `"type":"invalid_request_error","param":null,"code":"method_not_allowed"`) {
		t.Errorf("a wrong method: %d %s", r.status, r.body)
	}
	r = s.do("GET", "/v1/files/file-0/other", map[string]string{"Authorization": "Bearer key-a"}, nil)
	if r.status != 404 || !strings.Contains(string(r.body), `"type":"invalid_request_error","param":null,"code":"not_found"`) {
		t.Errorf("an unknown path under /v1/files/: %d %s", r.status, r.body)
	}
	r = s.do("POST", "/v1/files", map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, nil)
	if r.status != 401 || !strings.Contains(string(r.body), `"type":"invalid_request_error","param":null,"code":"unauthorized"`) {
		t.Errorf("no key: %d %s", r.status, r.body)
	}

	if keys, err := e.store.List(ctx, ""); err != nil || len(keys) != 0 {
		t.Errorf("after the refusals the bucket holds %q (%v); want nothing", keys, err)
	}
	c := sqstest.S3(t)
	bucket := e.store.Bucket()
	dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.DeleteBucket(dctx, &s3.DeleteBucketInput{Bucket: &bucket}); err != nil {
		t.Errorf("the bucket cannot be deleted after the refusals (a multipart upload left in progress?): %v", err)
	}
}

// A file's expiry: expires_after sets it, and a file past it is gone for
// every route (the bucket's lifecycle rule removes it later).
func TestFileExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{API: publisher.API{APIKeys: []string{"acme:key-a"}}})
	a := s.client("key-a")
	ctx := t.Context()
	f, err := a.newFile(ctx, fileParams{name: "x.jsonl", data: batchLines(1, "x"), expiresAfter: 3600})
	if err != nil {
		t.Fatalf("upload: %s", apiError(err))
	}
	if f.ExpiresAt != f.CreatedAt+3600 {
		t.Errorf("expires_after 3600: created_at %d, expires_at %d", f.CreatedAt, f.ExpiresAt)
	}

	// A record that has expired, as the bucket would hold it an hour on.
	old := upload(t, a, "old.jsonl", batchLines(1, "o"))
	key := job.FileRecordKey("acme", old.ID)
	raw, err := e.store.Read(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	rec["expires_at"] = time.Now().Unix() - 1
	if raw, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Put(ctx, key, raw); err != nil {
		t.Fatal(err)
	}
	_, err = a.getFile(ctx, old.ID)
	wantAPIError(t, "Get of an expired file", err, 404, "not_found", "id")
	_, err = a.fileContent(ctx, old.ID)
	wantAPIError(t, "Content of an expired file", err, 404, "not_found", "id")
	page, err := a.listFiles(ctx, "")
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != f.ID {
		t.Errorf("listing with an expired file: %v, %s", err, page.RawJSON())
	}
}

// Under Lambda the same handler takes an upload from an API Gateway event
// (base64, as API Gateway sends a multipart body) and answers its content
// base64-encoded, as a binary body must be.
func TestFilesAndBatchesUnderLambda(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{API: publisher.API{APIKeys: []string{"acme:key-a"}}})
	h := api.LambdaHandler(s.pub.Handler())
	data := batchLines(2, "l")
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	fw, err := w.CreateFormFile("file", "l.jsonl")
	if err == nil {
		_, err = fw.Write(data)
	}
	if err == nil {
		err = w.WriteField("purpose", "batch")
	}
	if err == nil {
		err = w.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	auth := map[string]string{"authorization": "Bearer key-a"}
	up := base64Event(apigw.Event("POST", "/v1/files", map[string]string{"authorization": "Bearer key-a", "content-type": w.FormDataContentType()},
		base64.StdEncoding.EncodeToString(buf.Bytes())))
	out, err := h(t.Context(), up)
	if err != nil || out.StatusCode != 200 {
		t.Fatalf("upload: %d %s (%v)", out.StatusCode, out.Body, err)
	}
	var f fileObject
	if err := json.Unmarshal([]byte(out.Body), &f); err != nil || f.Bytes != int64(len(data)) {
		t.Fatalf("upload answered %s (%v)", out.Body, err)
	}
	out, err = h(t.Context(), apigw.Event("GET", "/v1/files/"+f.ID+"/content", auth, ""))
	if err != nil || out.StatusCode != 200 || !out.IsBase64Encoded {
		t.Fatalf("content: %d, base64 %v, %s (%v)", out.StatusCode, out.IsBase64Encoded, out.Body, err)
	}
	if got, err := base64.StdEncoding.DecodeString(out.Body); err != nil || !bytes.Equal(got, data) {
		t.Errorf("content: %q (%v); want %q", got, err, data)
	}
	// A batch of it, read, listed and cancelled through the same handler.
	out, err = h(t.Context(), apigw.Event("POST", "/v1/batches", map[string]string{"authorization": "Bearer key-a", "content-type": "application/json"},
		`{"input_file_id":"`+f.ID+`","endpoint":"/v1/embeddings","completion_window":"24h"}`))
	var b batch
	if err != nil || out.StatusCode != 200 || json.Unmarshal([]byte(out.Body), &b) != nil || b.Status != "validating" {
		t.Fatalf("batch: %d %s (%v)", out.StatusCode, out.Body, err)
	}
	// Validated after the answer: under Lambda by the schedule's sweep, here
	// by the test server's sweeper.
	if v := waitBatch(t, s.client("key-a"), b.ID, time.Minute, "in_progress"); v.RequestCounts.Total != 2 {
		t.Fatalf("batch validated: %s", v.RawJSON())
	}
	for _, ev := range []struct{ method, path, want string }{
		{"GET", "/v1/batches/" + b.ID, `"status":"in_progress"`},
		{"GET", "/v1/batches?limit=1", `"id":"` + b.ID + `"`},
		{"POST", "/v1/batches/" + b.ID + "/cancel", `"status":"cancelling"`},
	} {
		out, err = h(t.Context(), apigw.Event(ev.method, ev.path, auth, ""))
		if err != nil || out.StatusCode != 200 || !strings.Contains(out.Body, ev.want) {
			t.Errorf("%s %s: %d %s (%v)", ev.method, ev.path, out.StatusCode, out.Body, err)
		}
	}
	out, err = h(t.Context(), apigw.Event("GET", "/v1/files/"+f.ID, map[string]string{"authorization": "Bearer nope"}, ""))
	if err != nil || out.StatusCode != 401 || !strings.Contains(out.Body, `"type":"invalid_request_error"`) {
		t.Errorf("a wrong key: %d %s (%v)", out.StatusCode, out.Body, err)
	}
}
