package publisher_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/vramq/vramq/internal/testenv/apigw"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
)

// sdk is the official OpenAI client for Go on the publisher s, with key.
func (s *server) sdk(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(s.url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// upload sends data as a batch file named name with c.
func upload(t *testing.T, c openai.Client, name string, data []byte) *openai.FileObject {
	t.Helper()
	f, err := c.Files.New(t.Context(), openai.FileNewParams{
		File: openai.File(bytes.NewReader(data), name, "application/jsonl"), Purpose: openai.FilePurposeBatch,
	})
	if err != nil {
		t.Fatalf("uploading %s: %v", name, apiError(err))
	}
	return f
}

// apiError shows an error of the SDK with its body, which its Error hides.
func apiError(err error) string {
	var e *openai.Error
	if errors.As(err, &e) {
		return fmt.Sprintf("%d %s", e.StatusCode, e.RawJSON())
	}
	return fmt.Sprint(err)
}

// wantAPIError checks that err is the API's answer status with code and
// param, in OpenAI's shape as the SDK reads it.
func wantAPIError(t *testing.T, what string, err error, status int, code, param string) {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Errorf("%s: %v; want an API error", what, err)
		return
	}
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	}
	if e.StatusCode != status || e.Code != code || e.Param != param || e.Type != typ || e.Message == "" ||
		(param != "" && !e.JSON.Param.Valid()) || !e.JSON.Type.Valid() {
		t.Errorf("%s: %s; want %d with code %q, param %q, type %q and a message", what, apiError(err), status, code, param, typ)
	}
}

func batchLines(n int, tag string) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"%s-%d","method":"POST","url":"/v1/embeddings","body":{"model":"m","input":"x"}}`+"\n", tag, i)
	}
	return b.Bytes()
}

// Issue 28, files: the OpenAI SDK for Go uploads a batch file, retrieves
// it, reads its content, lists it among others (paged both ways), and
// deletes it; another tenant's key gets 404 on each of them and lists
// none of them, and a second key of the owner's tenant reads them as the
// first does.
func TestFilesWithTheOpenAISDK(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{APIKeys: []string{"acme:key-a", "acme:key-a2", "globex:key-b"}})
	a, a2, b := s.sdk("key-a"), s.sdk("key-a2"), s.sdk("key-b")
	ctx := t.Context()

	data := batchLines(3, "r")
	before := time.Now().Unix()
	f := upload(t, a, "requests.jsonl", data)
	if !strings.HasPrefix(f.ID, "file-") || f.Object != "file" || f.Bytes != int64(len(data)) || f.Filename != "requests.jsonl" ||
		f.Purpose != openai.FileObjectPurposeBatch || f.JSON.Status.Raw() != `"processed"` ||
		f.CreatedAt < before || f.CreatedAt > time.Now().Unix() || f.ExpiresAt != f.CreatedAt+30*24*3600 {
		t.Errorf("uploaded: %s", f.RawJSON())
	}
	for _, c := range []openai.Client{a, a2} {
		got, err := c.Files.Get(ctx, f.ID)
		if err != nil {
			t.Fatalf("Get: %s", apiError(err))
		}
		if diff := cmp.Diff(f.RawJSON(), got.RawJSON()); diff != "" {
			t.Errorf("Get differs from the upload's answer (-upload +get):\n%s", diff)
		}
		res, err := c.Files.Content(ctx, f.ID)
		if err != nil {
			t.Fatalf("Content: %s", apiError(err))
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || !bytes.Equal(body, data) {
			t.Errorf("Content: %q (%v); want %q", body, err, data)
		}
	}

	// Another tenant: 404 on everything, in OpenAI's shape, and nothing listed.
	_, err := b.Files.Get(ctx, f.ID)
	wantAPIError(t, "another tenant's Get", err, 404, "not_found", "id")
	_, err = b.Files.Content(ctx, f.ID)
	wantAPIError(t, "another tenant's Content", err, 404, "not_found", "id")
	_, err = b.Files.Delete(ctx, f.ID)
	wantAPIError(t, "another tenant's Delete", err, 404, "not_found", "id")
	if page, err := b.Files.List(ctx, openai.FileListParams{}); err != nil || len(page.Data) != 0 || page.HasMore {
		t.Errorf("another tenant's List: %v, %s", err, page.RawJSON())
	}
	if _, err := a.Files.Get(ctx, f.ID); err != nil {
		t.Errorf("the owner's Get after another tenant's Delete: %s", apiError(err))
	}
	other := upload(t, b, "globex.jsonl", batchLines(1, "g"))

	// Paging: four more of acme's, listed two at a time, newest first and
	// oldest first; the SDK's auto-pager follows has_more and after.
	ids := []string{f.ID}
	for i := range 4 {
		ids = append(ids, upload(t, a, fmt.Sprintf("more-%d.jsonl", i), batchLines(1, "m")).ID)
	}
	slices.Sort(ids)
	first, err := a.Files.List(ctx, openai.FileListParams{Limit: openai.Int(2)})
	if err != nil || len(first.Data) != 2 || !first.HasMore {
		t.Fatalf("List, limit 2: %v, %s", err, first.RawJSON())
	}
	for _, order := range []openai.FileListParamsOrder{openai.FileListParamsOrderDesc, openai.FileListParamsOrderAsc, ""} {
		var got []string
		var created []int64
		pager := a.Files.ListAutoPaging(ctx, openai.FileListParams{Limit: openai.Int(2), Order: order, Purpose: openai.String("batch")})
		for pager.Next() {
			got = append(got, pager.Current().ID)
			created = append(created, pager.Current().CreatedAt)
		}
		if err := pager.Err(); err != nil {
			t.Fatalf("listing, order %q: %s", order, apiError(err))
		}
		want := slices.Clone(ids)
		if order != openai.FileListParamsOrderAsc {
			slices.Reverse(want)
			slices.Reverse(created)
		}
		if !cmp.Equal(got, want) || !slices.IsSorted(created) {
			t.Errorf("listing, order %q: %q created %v; want %q", order, got, created, want)
		}
	}
	if page, err := a.Files.List(ctx, openai.FileListParams{Purpose: openai.String("fine-tune")}); err != nil || len(page.Data) != 0 {
		t.Errorf("listing purpose fine-tune: %v, %s", err, page.RawJSON())
	}

	// Delete: gone for every route, and from the bucket.
	del, err := a2.Files.Delete(ctx, f.ID)
	if err != nil || !del.Deleted || del.ID != f.ID || del.Object != "file" {
		t.Fatalf("Delete: %s, %v", apiError(err), del)
	}
	_, err = a.Files.Get(ctx, f.ID)
	wantAPIError(t, "Get of a deleted file", err, 404, "not_found", "id")
	_, err = a.Files.Content(ctx, f.ID)
	wantAPIError(t, "Content of a deleted file", err, 404, "not_found", "id")
	_, err = a.Files.Delete(ctx, f.ID)
	wantAPIError(t, "Delete of a deleted file", err, 404, "not_found", "id")
	var left []string
	pager := a.Files.ListAutoPaging(ctx, openai.FileListParams{})
	for pager.Next() {
		left = append(left, pager.Current().ID)
	}
	if slices.Contains(left, f.ID) || len(left) != 4 || pager.Err() != nil {
		t.Errorf("listing after the delete: %q, %v", left, pager.Err())
	}
	keys, err := e.store.List(ctx, "files/")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.Contains(k, f.ID) {
			t.Errorf("the deleted file's %s is still in the bucket", k)
		}
	}
	if len(keys) != 2*5 {
		t.Errorf("the bucket holds %d objects under files/; want the content and record of 5 files: %q", len(keys), keys)
	}
	if _, err := b.Files.Get(ctx, other.ID); err != nil {
		t.Errorf("globex's own file: %s", apiError(err))
	}
}

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
	s := e.serve(publisher.Config{APIKeys: []string{"acme:key-a"},
		MaxFileBytes: 6 << 20, MaxFileLines: 40, MaxFileLineBytes: 1 << 20})
	a := s.sdk("key-a")
	ctx := t.Context()
	line := func(n int) []byte { return append(bytes.Repeat([]byte("x"), n), '\n') }
	file := func(data []byte) openai.FileNewParams {
		return openai.FileNewParams{File: openai.File(bytes.NewReader(data), "f.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch}
	}
	small := e.serve(publisher.Config{APIKeys: []string{"acme:key-a"}, MaxFileBytes: 1000}).sdk("key-a")
	for _, tc := range []struct {
		name         string
		client       openai.Client
		params       openai.FileNewParams
		status       int
		code, param  string
		messageAbout string
	}{
		{"wrong purpose", a, openai.FileNewParams{File: openai.File(bytes.NewReader(batchLines(1, "p")), "f.jsonl", "application/jsonl"), Purpose: openai.FilePurposeFineTune},
			400, "invalid_parameter", "purpose", "batch"},
		{"over the line limit", a, file(batchLines(41, "l")), 400, "too_many_lines", "file", "40 lines"},
		{"over the size limit", small, file(slices.Concat(line(999), line(1))), 413, "file_too_large", "file", "1000 bytes"},
		{"a line over its size", a, file(slices.Concat(line(10), line(1<<20+1))), 400, "line_too_large", "file", "line 2"},
		{"over the size limit, after a part was sent", a, file(bytes.Repeat(line(200<<10-1), 31)), 413, "file_too_large", "file", "6291456 bytes"},
		{"over the line limit, after a part was sent", a, file(slices.Concat(bytes.Repeat(line(140<<10-1), 39), line(10), line(10))),
			400, "too_many_lines", "file", "40 lines"},
		{"expiry out of range", a, openai.FileNewParams{File: openai.File(bytes.NewReader(batchLines(1, "e")), "f.jsonl", "application/jsonl"),
			Purpose: openai.FilePurposeBatch, ExpiresAfter: openai.FileNewParamsExpiresAfter{Seconds: 60}}, 400, "invalid_parameter", "expires_after", "3600"},
	} {
		_, err := tc.client.Files.New(ctx, tc.params)
		wantAPIError(t, tc.name, err, tc.status, tc.code, tc.param)
		var ae *openai.Error
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
	s := e.serve(publisher.Config{APIKeys: []string{"acme:key-a"}})
	a := s.sdk("key-a")
	ctx := t.Context()
	f, err := a.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(batchLines(1, "x")), "x.jsonl", "application/jsonl"),
		Purpose: openai.FilePurposeBatch, ExpiresAfter: openai.FileNewParamsExpiresAfter{Seconds: 3600}})
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
	_, err = a.Files.Get(ctx, old.ID)
	wantAPIError(t, "Get of an expired file", err, 404, "not_found", "id")
	_, err = a.Files.Content(ctx, old.ID)
	wantAPIError(t, "Content of an expired file", err, 404, "not_found", "id")
	page, err := a.Files.List(ctx, openai.FileListParams{})
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
	s := e.serve(publisher.Config{APIKeys: []string{"acme:key-a"}})
	h := publisher.LambdaHandler(s.pub.Handler())
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
	var f openai.FileObject
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
	var b openai.Batch
	if err != nil || out.StatusCode != 200 || json.Unmarshal([]byte(out.Body), &b) != nil || b.Status != openai.BatchStatusValidating {
		t.Fatalf("batch: %d %s (%v)", out.StatusCode, out.Body, err)
	}
	// Validated after the answer: under Lambda by the schedule's sweep, here
	// by the test server's sweeper.
	if v := waitBatch(t, s.sdk("key-a"), b.ID, time.Minute, openai.BatchStatusInProgress); v.RequestCounts.Total != 2 {
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
