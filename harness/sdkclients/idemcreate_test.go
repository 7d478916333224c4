package sdkclients

// Moved from the publisher's package (issue 32, item 4): the retries are
// openai-go's.

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/publishertest"
)

// lossyFront serves h, except that the first request to the armed route is
// handled to the end and its connection then closed with no answer: the
// answer is lost on the way back, as when a proxy or the network fails after
// the server did the work. lost is what h answered; requests counts the
// armed route's requests.
type lossyFront struct {
	h http.Handler

	mu            sync.Mutex
	method, path  string
	armed         bool
	requests      int
	lost          *httptest.ResponseRecorder
	replayedAfter string // the Idempotent-Replayed header of the answer after the lost one
}

func (f *lossyFront) arm(method, path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.method, f.path, f.armed, f.requests, f.lost, f.replayedAfter = method, path, true, 0, nil, ""
}

func (f *lossyFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	match := r.Method == f.method && r.URL.Path == f.path
	drop := match && f.armed
	if match {
		f.requests++
	}
	f.armed = f.armed && !drop
	f.mu.Unlock()
	if !drop {
		f.h.ServeHTTP(w, r)
		if match {
			f.mu.Lock()
			f.replayedAfter = w.Header().Get("Idempotent-Replayed")
			f.mu.Unlock()
		}
		return
	}
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, r)
	f.mu.Lock()
	f.lost = rec
	f.mu.Unlock()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err) // an httptest.Server's connections can be hijacked
	}
	conn.Close()
}

// TestRetriedCreatesAreReplayed (issue 34, item 1): the OpenAI SDK for Go
// retries an upload and a batch create whose answers were lost, with the
// Idempotency-Key it was given (the SDK's retry, or net/http's own on a
// reused connection, which a request with that header allows); each retry
// is answered what the first request was, byte for byte, and creates
// nothing: one file, one batch, one job's chunks on the queue. The same key
// with another request is 422 idempotency_key_reused; another tenant's same
// key is its own.
func TestRetriedCreatesAreReplayed(t *testing.T) {
	t.Parallel()
	s := newStack(t, publisher.Config{API: publisher.API{APIKeys: []string{"acme:key-a", "globex:key-b"}}})
	front := &lossyFront{h: s.Pub.Handler()}
	srv := httptest.NewServer(front)
	t.Cleanup(srv.Close)
	sdk := func(key string) openai.Client {
		return openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(2))
	}
	a, b := sdk("key-a"), sdk("key-b")
	ctx := t.Context()
	key := func(k string) option.RequestOption { return option.WithHeader("Idempotency-Key", k) }
	checkReplay := func(what, got string) {
		t.Helper()
		front.mu.Lock()
		defer front.mu.Unlock()
		switch {
		case front.lost == nil || front.requests != 2:
			t.Errorf("%s: %d requests, lost %v; want the first lost and one retry", what, front.requests, front.lost != nil)
		case front.lost.Code != http.StatusOK || strings.TrimSpace(front.lost.Body.String()) != strings.TrimSpace(got):
			t.Errorf("%s: the retry was answered\n%s\nwhere the lost answer was %d\n%s", what, got, front.lost.Code, front.lost.Body)
		case front.replayedAfter != "true":
			t.Errorf("%s: the retry's Idempotent-Replayed is %q; want true", what, front.replayedAfter)
		}
	}

	data := publishertest.BatchLines(3, "r")
	newFile := func(c openai.Client, k string, data []byte) (*openai.FileObject, error) {
		return c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(data), "requests.jsonl", "application/jsonl"),
			Purpose: openai.FilePurposeBatch}, key(k))
	}
	front.arm(http.MethodPost, "/v1/files")
	f, err := newFile(a, "upload-1", data)
	if err != nil {
		t.Fatalf("Files.New: %s", sdkAPIError(err))
	}
	checkReplay("upload", f.RawJSON())
	if page, err := a.Files.List(ctx, openai.FileListParams{}); err != nil || len(page.Data) != 1 || page.Data[0].ID != f.ID {
		t.Errorf("files after a retried upload: %v %s; want only %s", err, page.RawJSON(), f.ID)
	}
	_, err = newFile(a, "upload-1", publishertest.BatchLines(4, "r"))
	sdkWantAPIError(t, "the upload's key with another file", err, 422, "idempotency_key_reused", "")
	if fb, err := newFile(b, "upload-1", data); err != nil || fb.ID == f.ID {
		t.Errorf("another tenant's upload with the same key: %v %s; want a file of its own", sdkAPIError(err), fb.RawJSON())
	}

	params := openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1Embeddings,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h}
	front.arm(http.MethodPost, "/v1/batches")
	bt, err := a.Batches.New(ctx, params, key("batch-1"))
	if err != nil {
		t.Fatalf("Batches.New: %s", sdkAPIError(err))
	}
	checkReplay("batch", bt.RawJSON())
	if page, err := a.Batches.List(ctx, openai.BatchListParams{}); err != nil || len(page.Data) != 1 || page.Data[0].ID != bt.ID {
		t.Errorf("batches after a retried create: %v %s; want only %s", err, page.RawJSON(), bt.ID)
	}
	if msgs := publishertest.Drain(t, s.client, s.urls.Work, map[string]bool{}, 1); len(msgs) != 1 || msgs[0].Work.JobID != bt.ID {
		t.Errorf("%d chunks on the queue; want the batch's one, once", len(msgs))
	}
	params.Metadata = map[string]string{"run": "another"}
	_, err = a.Batches.New(ctx, params, key("batch-1"))
	sdkWantAPIError(t, "the batch's key with another request", err, 422, "idempotency_key_reused", "")
	_, err = a.Batches.New(ctx, params, key("upload-1"))
	sdkWantAPIError(t, "the upload's key on a batch", err, 422, "idempotency_key_reused", "")
}
