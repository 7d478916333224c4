package sdkclients

// The publisher's Files and Batch APIs with the official OpenAI SDK for Go
// (v3.98.0) as the client, on the emulator: the SDK reads every answer.
// Moved from the publisher's package (issue 32, item 4).

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/publishertest"
)

// stack is a publisher with cfg, its sweeper running, on fresh queues and a
// bucket of the emulator's.
type stack struct {
	*publishertest.Served
	t      *testing.T
	client *sqs.Client
	urls   localstack.URLs
	store  *payload.Store
}

func newStack(t *testing.T, cfg publisher.Config) *stack {
	t.Helper()
	s := newBare(t)
	s.Served = publishertest.Serve(t, s.client, s.urls.Work, s.store, cfg)
	publishertest.Sweep(t, s.Pub)
	return s
}

// newBare is a stack's queues and bucket, with no publisher yet.
func newBare(t *testing.T) *stack {
	t.Helper()
	s := &stack{t: t, client: sqstest.Client(t)}
	s.urls = sqstest.Queues(t, s.client, 5)
	s3c := sqstest.S3(t)
	s.store = payload.New(s3c, sqstest.Bucket(t, s3c))
	return s
}

// run runs a subscriber of b on dev on the stack's queues until the
// test ends.
func (s *stack) run(b backend.Backend, dev gpu.Device) {
	s.t.Helper()
	publishertest.RunSubscriber(s.t, s.client, s.urls, s.store, b, dev, slog.New(slog.DiscardHandler))
}

// sdk is the official OpenAI client for Go on the stack's publisher, with key.
func (s *stack) sdk(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(s.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// upload sends data as a batch file named name with c.
func sdkUpload(t *testing.T, c openai.Client, name string, data []byte) *openai.FileObject {
	t.Helper()
	f, err := c.Files.New(t.Context(), openai.FileNewParams{
		File: openai.File(bytes.NewReader(data), name, "application/jsonl"), Purpose: openai.FilePurposeBatch,
	})
	if err != nil {
		t.Fatalf("uploading %s: %v", name, sdkAPIError(err))
	}
	return f
}

// apiError shows an error of the SDK with its body, which its Error hides.
func sdkAPIError(err error) string {
	var e *openai.Error
	if errors.As(err, &e) {
		return fmt.Sprintf("%d %s", e.StatusCode, e.RawJSON())
	}
	return fmt.Sprint(err)
}

// wantAPIError checks that err is the API's answer status with code and
// param, in OpenAI's shape as the SDK reads it.
func sdkWantAPIError(t *testing.T, what string, err error, status int, code, param string) {
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
		t.Errorf("%s: %s; want %d with code %q, param %q, type %q and a message", what, sdkAPIError(err), status, code, param, typ)
	}
}

// Issue 28, files: the OpenAI SDK for Go uploads a batch file, retrieves
// it, reads its content, lists it among others (paged both ways), and
// deletes it; another tenant's key gets 404 on each of them and lists
// none of them, and a second key of the owner's tenant reads them as the
// first does.
func TestFilesWithTheOpenAISDK(t *testing.T) {
	t.Parallel()
	s := newStack(t, publisher.Config{API: publisher.API{APIKeys: []string{"acme:key-a", "acme:key-a2", "globex:key-b"}}})
	a, a2, b := s.sdk("key-a"), s.sdk("key-a2"), s.sdk("key-b")
	ctx := t.Context()

	data := publishertest.BatchLines(3, "r")
	before := time.Now().Unix()
	f := sdkUpload(t, a, "requests.jsonl", data)
	if !strings.HasPrefix(f.ID, "file-") || f.Object != "file" || f.Bytes != int64(len(data)) || f.Filename != "requests.jsonl" ||
		f.Purpose != openai.FileObjectPurposeBatch || f.JSON.Status.Raw() != `"processed"` ||
		f.CreatedAt < before || f.CreatedAt > time.Now().Unix() || f.ExpiresAt != f.CreatedAt+30*24*3600 {
		t.Errorf("uploaded: %s", f.RawJSON())
	}
	for _, c := range []openai.Client{a, a2} {
		got, err := c.Files.Get(ctx, f.ID)
		if err != nil {
			t.Fatalf("Get: %s", sdkAPIError(err))
		}
		if diff := cmp.Diff(f.RawJSON(), got.RawJSON()); diff != "" {
			t.Errorf("Get differs from the upload's answer (-upload +get):\n%s", diff)
		}
		res, err := c.Files.Content(ctx, f.ID)
		if err != nil {
			t.Fatalf("Content: %s", sdkAPIError(err))
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || !bytes.Equal(body, data) {
			t.Errorf("Content: %q (%v); want %q", body, err, data)
		}
	}

	// Another tenant: 404 on everything, in OpenAI's shape, and nothing listed.
	_, err := b.Files.Get(ctx, f.ID)
	sdkWantAPIError(t, "another tenant's Get", err, 404, "not_found", "id")
	_, err = b.Files.Content(ctx, f.ID)
	sdkWantAPIError(t, "another tenant's Content", err, 404, "not_found", "id")
	_, err = b.Files.Delete(ctx, f.ID)
	sdkWantAPIError(t, "another tenant's Delete", err, 404, "not_found", "id")
	if page, err := b.Files.List(ctx, openai.FileListParams{}); err != nil || len(page.Data) != 0 || page.HasMore {
		t.Errorf("another tenant's List: %v, %s", err, page.RawJSON())
	}
	if _, err := a.Files.Get(ctx, f.ID); err != nil {
		t.Errorf("the owner's Get after another tenant's Delete: %s", sdkAPIError(err))
	}
	other := sdkUpload(t, b, "globex.jsonl", publishertest.BatchLines(1, "g"))

	// Paging: four more of acme's, listed two at a time, newest first and
	// oldest first; the SDK's auto-pager follows has_more and after.
	ids := []string{f.ID}
	for i := range 4 {
		ids = append(ids, sdkUpload(t, a, fmt.Sprintf("more-%d.jsonl", i), publishertest.BatchLines(1, "m")).ID)
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
			t.Fatalf("listing, order %q: %s", order, sdkAPIError(err))
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
		t.Fatalf("Delete: %s, %v", sdkAPIError(err), del)
	}
	_, err = a.Files.Get(ctx, f.ID)
	sdkWantAPIError(t, "Get of a deleted file", err, 404, "not_found", "id")
	_, err = a.Files.Content(ctx, f.ID)
	sdkWantAPIError(t, "Content of a deleted file", err, 404, "not_found", "id")
	_, err = a.Files.Delete(ctx, f.ID)
	sdkWantAPIError(t, "Delete of a deleted file", err, 404, "not_found", "id")
	var left []string
	pager := a.Files.ListAutoPaging(ctx, openai.FileListParams{})
	for pager.Next() {
		left = append(left, pager.Current().ID)
	}
	if slices.Contains(left, f.ID) || len(left) != 4 || pager.Err() != nil {
		t.Errorf("listing after the delete: %q, %v", left, pager.Err())
	}
	keys, err := s.store.List(ctx, "files/")
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
		t.Errorf("globex's own file: %s", sdkAPIError(err))
	}
}

// sdkWaitBatch polls the batch with c until its status is one of want.
func sdkWaitBatch(t *testing.T, c openai.Client, id string, limit time.Duration, want ...openai.BatchStatus) *openai.Batch {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		b, err := c.Batches.Get(t.Context(), id)
		if err != nil {
			t.Fatalf("Get %s: %s", id, sdkAPIError(err))
		}
		if slices.Contains(want, b.Status) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s is %s after %v; want %v: %s", id, b.Status, limit, want, b.RawJSON())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sdkNewBatch creates a batch of fileID with c, which answers it validating
// as OpenAI does, and returns it as its validator leaves it: in_progress or
// failed.
func sdkNewBatch(t *testing.T, c openai.Client, fileID string, endpoint openai.BatchNewParamsEndpoint) *openai.Batch {
	t.Helper()
	b, err := c.Batches.New(t.Context(), openai.BatchNewParams{InputFileID: fileID, Endpoint: endpoint,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h, Metadata: map[string]string{"run": "nightly"}})
	if err != nil {
		t.Fatalf("Batches.New: %s", sdkAPIError(err))
	}
	if b.Status != openai.BatchStatusValidating || b.InProgressAt != 0 || b.JSON.Errors.Raw() != "null" {
		t.Fatalf("Batches.New answered %s; want it validating", b.RawJSON())
	}
	return sdkWaitBatch(t, c, b.ID, time.Minute, openai.BatchStatusInProgress, openai.BatchStatusFailed,
		openai.BatchStatusCancelling, openai.BatchStatusFinalizing, openai.BatchStatusCompleted)
}

// sdkFileLines downloads file id with c and parses its lines; none for "".
func sdkFileLines(t *testing.T, c openai.Client, id string) []publishertest.OutputLine {
	t.Helper()
	if id == "" {
		return nil
	}
	res, err := c.Files.Content(t.Context(), id)
	if err != nil {
		t.Fatalf("content of %s: %s", id, sdkAPIError(err))
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return publishertest.OutputLines(t, id, data)
}

// An embeddings batch runs on the in-process model: created, polled to
// completed, its output file holds one line per request in the file's
// order, each body OpenAI's embeddings response as the SDK's type reads it;
// no error file. The batch lists for its owner and for no one else, who
// gets 404 on it, on its cancel and on a batch of the owner's file.
func TestBatchEmbeddingsWithTheOpenAISDK(t *testing.T) {
	t.Parallel()
	s := newStack(t, publisher.Config{Jobs: publisher.Jobs{ChunkItems: 4}, API: publisher.API{APIKeys: []string{"acme:key-a", "globex:key-b"}}})
	a, b := s.sdk("key-a"), s.sdk("key-b")
	const n = 10
	f := sdkUpload(t, a, "embed.jsonl", publishertest.EmbeddingLines(n))
	before := time.Now().Unix()
	bt := sdkNewBatch(t, a, f.ID, openai.BatchNewParamsEndpointV1Embeddings)
	if !strings.HasPrefix(bt.ID, "batch_") || bt.Object != "batch" || bt.Endpoint != "/v1/embeddings" || bt.InputFileID != f.ID ||
		bt.CompletionWindow != "24h" || bt.Status != openai.BatchStatusInProgress || bt.RequestCounts.Total != n ||
		bt.CreatedAt < before || bt.ExpiresAt != bt.CreatedAt+24*3600 || bt.InProgressAt < bt.CreatedAt ||
		bt.Metadata["run"] != "nightly" || bt.JSON.OutputFileID.Raw() != "null" || bt.JSON.Errors.Raw() != "null" {
		t.Errorf("created: %s", bt.RawJSON())
	}
	for what, err := range map[string]error{
		"Get":    func() error { _, err := b.Batches.Get(t.Context(), bt.ID); return err }(),
		"Cancel": func() error { _, err := b.Batches.Cancel(t.Context(), bt.ID); return err }(),
	} {
		sdkWantAPIError(t, "another tenant's "+what, err, 404, "not_found", "id")
	}
	_, err := b.Batches.New(t.Context(), openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1Embeddings,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	sdkWantAPIError(t, "a batch of another tenant's file", err, 404, "not_found", "input_file_id")
	if page, err := b.Batches.List(t.Context(), openai.BatchListParams{}); err != nil || len(page.Data) != 0 {
		t.Errorf("another tenant lists %d batches (%v)", len(page.Data), err)
	}

	m, dev := publishertest.RefModel(t)
	s.run(backend.InProcess{Model: m}, dev)
	done := sdkWaitBatch(t, a, bt.ID, time.Minute, openai.BatchStatusCompleted)
	if done.RequestCounts.Completed != n || done.RequestCounts.Failed != 0 || done.CompletedAt < done.InProgressAt ||
		done.FinalizingAt == 0 || done.OutputFileID == "" || done.JSON.ErrorFileID.Raw() != "null" || done.Usage.InputTokens == 0 {
		t.Errorf("completed: %s", done.RawJSON())
	}
	out := sdkFileLines(t, a, done.OutputFileID)
	if len(out) != n {
		t.Fatalf("%d output lines; want %d", len(out), n)
	}
	for i, l := range out {
		if l.CustomID != fmt.Sprintf("e-%d", i) || !strings.HasPrefix(l.ID, "batch_req_") || l.Error != nil || l.Response == nil ||
			l.Response.StatusCode != 200 || l.Response.RequestID == "" {
			t.Fatalf("output line %d: %+v", i, l)
		}
		var emb openai.CreateEmbeddingResponse
		if err := json.Unmarshal(l.Response.Body, &emb); err != nil || len(emb.Data) != 1 || len(emb.Data[0].Embedding) == 0 ||
			emb.Model != "ref" || emb.Usage.PromptTokens == 0 {
			t.Errorf("output line %d's body: %s (%v)", i, l.Response.Body, err)
		}
	}
	of, err := a.Files.Get(t.Context(), done.OutputFileID)
	if err != nil || of.Purpose != "batch_output" || of.Filename != bt.ID+"_output.jsonl" {
		t.Errorf("output file: %v %s", err, of.RawJSON())
	}
	if _, err := b.Files.Get(t.Context(), done.OutputFileID); err == nil {
		t.Errorf("another tenant reads the output file")
	}
	// Each purpose's listing has its own file, told apart by id (issue 34,
	// item 5).
	for purpose, want := range map[string]string{"batch_output": done.OutputFileID, "batch": f.ID} {
		if page, err := a.Files.List(t.Context(), openai.FileListParams{Purpose: openai.String(purpose)}); err != nil ||
			len(page.Data) != 1 || page.Data[0].ID != want {
			t.Errorf("files of purpose %s: %v %s; want only %s", purpose, err, page.RawJSON(), want)
		}
	}
	page, err := a.Batches.List(t.Context(), openai.BatchListParams{})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != bt.ID || page.Data[0].Status != openai.BatchStatusCompleted {
		t.Errorf("list: %v %+v", err, page)
	}
	_, err = a.Batches.Cancel(t.Context(), bt.ID)
	sdkWantAPIError(t, "cancelling a completed batch", err, 409, "batch_not_cancellable", "")
}

// A chat-completions batch runs on a model server (the fake): the answers
// are in the output file, parsed by the SDK's ChatCompletion; the request
// the server refused (a prompt over its context) is in the error file with
// its 400 and body, and counted failed.
func TestBatchChatCompletionsWithTheOpenAISDK(t *testing.T) {
	t.Parallel()
	srv := fakeoai.New(fakeoai.Config{MaxModelLen: 64, ContextLengthStatus: 400})
	defer srv.Close()
	s := newStack(t, publisher.Config{Jobs: publisher.Jobs{ChunkItems: 3}, API: publisher.API{APIKeys: []string{"acme:key-a"}}})
	a := s.sdk("key-a")
	var in bytes.Buffer
	const n = 7
	for i := range n {
		content := fmt.Sprintf("question %d", i)
		if i == 4 {
			content = strings.Repeat("long ", 200) // over the fake's 64-token context
		}
		fmt.Fprintf(&in, `{"custom_id":"c-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"fake-model","messages":[{"role":"user","content":%q}],"max_tokens":8}}`+"\n", i, content)
	}
	f := sdkUpload(t, a, "chat.jsonl", in.Bytes())
	bt := sdkNewBatch(t, a, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	s.run(publishertest.ServerModel(t, srv), nil)
	done := sdkWaitBatch(t, a, bt.ID, time.Minute, openai.BatchStatusCompleted)
	if done.RequestCounts.Total != n || done.RequestCounts.Completed != n-1 || done.RequestCounts.Failed != 1 ||
		done.Usage.OutputTokens == 0 || done.Usage.TotalTokens != done.Usage.InputTokens+done.Usage.OutputTokens {
		t.Errorf("completed: %s", done.RawJSON())
	}
	out, errs := sdkFileLines(t, a, done.OutputFileID), sdkFileLines(t, a, done.ErrorFileID)
	if len(out) != n-1 || len(errs) != 1 {
		t.Fatalf("%d output and %d error lines", len(out), len(errs))
	}
	for i, l := range out {
		want := i
		if i >= 4 {
			want++
		}
		var cc openai.ChatCompletion
		if l.CustomID != fmt.Sprintf("c-%d", want) || l.Response == nil || l.Response.StatusCode != 200 ||
			json.Unmarshal(l.Response.Body, &cc) != nil || len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" {
			t.Errorf("output line %d: %+v", i, l)
		}
	}
	l := errs[0]
	var apiErr struct {
		Error struct{ Message string } `json:"error"`
	}
	if l.CustomID != "c-4" || l.Response == nil || l.Response.StatusCode != 400 || l.Error == nil || l.Error.Code != job.ItemRequestRefused ||
		json.Unmarshal(l.Response.Body, &apiErr) != nil || apiErr.Error.Message == "" {
		t.Errorf("error line: %+v", l)
	}
}

// Issue 35, item 1: a batch's end is announced as OpenAI announces it, a
// webhook event signed by the Standard Webhooks scheme: openai-go's
// Webhooks.Unwrap, given the secret, verifies each and reads it as its
// own event type, batch.failed for a batch whose file has a bad line and
// batch.completed for one whose job settled.
func TestBatchWebhooksVerifyWithTheOpenAISDK(t *testing.T) {
	t.Parallel()
	url, got := publishertest.WebhookReceiver(t)
	s := newStack(t, publisher.Config{Jobs: publisher.Jobs{ChunkItems: 1}, Batches: publisher.Batches{BatchWebhookURL: url, BatchWebhookSecret: publishertest.WebhookSecret}})
	c := s.sdk("")
	verifier := openai.NewClient(option.WithWebhookSecret(publishertest.WebhookSecret))

	bad := sdkNewBatch(t, c, sdkUpload(t, c, "bad.jsonl", []byte("{\n")).ID, openai.BatchNewParamsEndpointV1Embeddings)
	d := publishertest.NextDelivery(t, got)
	ev, err := verifier.Webhooks.Unwrap(d.Body, d.Header)
	if err != nil {
		t.Fatalf("Unwrap: %v (%s)", err, d.Body)
	}
	if f := ev.AsBatchFailed(); f.Type != "batch.failed" || f.Data.ID != bad.ID || f.Object != "event" || !strings.HasPrefix(f.ID, "evt_") ||
		f.CreatedAt == 0 || d.Header.Get("webhook-id") != f.ID {
		t.Errorf("batch.failed: %s (webhook-id %s)", d.Body, d.Header.Get("webhook-id"))
	}

	bt := sdkNewBatch(t, c, sdkUpload(t, c, "ok.jsonl", publishertest.EmbeddingLines(2)).ID, openai.BatchNewParamsEndpointV1Embeddings)
	publishertest.PutResults(t, s.store, bt.ID, 0, 2)
	d = publishertest.NextDelivery(t, got)
	if ev, err = verifier.Webhooks.Unwrap(d.Body, d.Header); err != nil {
		t.Fatalf("Unwrap: %v (%s)", err, d.Body)
	}
	if done := ev.AsBatchCompleted(); done.Type != "batch.completed" || done.Data.ID != bt.ID {
		t.Errorf("batch.completed: %s", d.Body)
	}
	if b, err := c.Batches.Get(t.Context(), bt.ID); err != nil || b.Status != openai.BatchStatusCompleted {
		t.Errorf("the batch announced completed: %v %s", sdkAPIError(err), b.RawJSON())
	}
	// Another secret's signature is refused: the SDK checks it.
	other := openai.NewClient(option.WithWebhookSecret("whsec_" + base64.StdEncoding.EncodeToString([]byte("another secret of thirty-two b.."))))
	if _, err := other.Webhooks.Unwrap(d.Body, d.Header); err == nil {
		t.Error("Unwrap with another secret took the event")
	}
}
