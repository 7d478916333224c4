package batches

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/internal/heaptest"
	"github.com/vramq/vramq/publisher/jobs"
)

// postMessageBatchBody posts body as a Message Batch create to p.
func postMessageBatchBody(p *stack, body io.Reader, idempotencyKey string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/messages/batches", body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	if idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", idempotencyKey)
	}
	w := httptest.NewRecorder()
	p.Handler().ServeHTTP(w, req)
	return w
}

// messageBatchBody is a create of n requests, params(i) each, written as it
// is read, never held; size is its length once read.
func messageBatchBody(n int, params func(i int) string) (body io.Reader, size *int64) {
	pr, pw := io.Pipe()
	size = new(int64)
	go func() {
		write := func(s string) error {
			*size += int64(len(s))
			_, err := io.WriteString(pw, s)
			return err
		}
		err := write(`{"requests":[`)
		for i := 0; err == nil && i < n; i++ {
			sep := ","
			if i == 0 {
				sep = ""
			}
			err = write(fmt.Sprintf(`%s{"custom_id":"doc-%05d","params":%s}`, sep, i, params(i)))
		}
		if err == nil {
			err = write(`]}`)
		}
		pw.CloseWithError(err)
	}()
	return pr, size
}

// paddedMessage is the params of a request of about size bytes.
func paddedMessage(size int) func(i int) string {
	return func(i int) string {
		return `{"model":"llama","max_tokens":64,"messages":[{"role":"user","content":"` +
			strings.Repeat("x", size-80) + `"}]}`
	}
}

// A Message Batch's create holds, of its requests, their custom ids and the
// sizes of their encodings, as an OpenAI batch's validation does
// (TestBatchCreateIsNotHeldInMemory): the requests go on, as they are read
// and checked, to a staged copy in the bucket, which is read back and sent a
// window of chunks at a time. For a 48 MiB body of 6,144 requests, streamed
// to the create (not held by the test, whose heap would give the collector
// room), the heap's peak above idle over the create stays under half the
// body: 13 to 15 MiB at GOGC 10 (a part of the staged upload, a window of
// chunks). Before, the create held every request, then its encoding and its
// chunk beside it: 155 MiB, 3.2 times the body, while the bound on what
// creates hold at once (takeBatchBytes) was charged the body's size. The
// test is not parallel, so no other test's heap is counted.
func TestMessageBatchCreateIsNotHeldInMemory(t *testing.T) {
	p, store := heapPublisher(t)
	defer debug.SetGCPercent(debug.SetGCPercent(10)) // as TestBatchCreateIsNotHeldInMemory, and why
	const requests, requestBytes = 6_144, 8 << 10
	body, size := messageBatchBody(requests, paddedMessage(requestBytes))
	var w *httptest.ResponseRecorder
	peak := heaptest.Peak(func() { w = postMessageBatchBody(p, body, "") })
	var mb messageBatch
	if err := json.Unmarshal(w.Body.Bytes(), &mb); err != nil || mb.ProcessingStatus != msgInProgress || mb.RequestCounts.Processing != requests {
		t.Fatalf("create: %d %s; want in_progress with %d requests processing", w.Code, w.Body, requests)
	}
	t.Logf("peak heap above idle: %.1f MiB for a %.0f MiB body", float64(peak)/(1<<20), float64(*size)/(1<<20))
	if peak > uint64(*size)/2 {
		t.Errorf("the heap peaked %.1f MiB above idle creating a Message Batch of a %.0f MiB body; want under half of it",
			float64(peak)/(1<<20), float64(*size)/(1<<20))
	}
	if keys := stagedKeys(t, store); len(keys) > 0 {
		t.Errorf("after the create the bucket still holds its staged requests: %q", keys)
	}
}

// stagedKeys are the staged copies of creates' requests in store.
func stagedKeys(t *testing.T, store *payload.Store) []string {
	t.Helper()
	keys, err := store.List(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	var staged []string
	for _, k := range keys {
		if strings.HasSuffix(k, ".requests.json") {
			staged = append(staged, k)
		}
	}
	return staged
}

// A create's staged copy of its requests goes once the create is answered,
// sent or refused: one refused while its body is read (a bad request after
// good ones) never stores it; one sent, and its retry under the same
// Idempotency-Key, answered from the first's record once its body is read,
// delete it.
func TestMessageBatchCreateLeavesNoStagedRequests(t *testing.T) {
	c := sqstest.S3(t)
	store := payload.New(c, sqstest.Bucket(t, c))
	p := newStack(t, store, jobs.Config{}, nopQueue{})
	good := paddedMessage(1 << 10)
	badLast := func(i int) string {
		if i == 2 {
			return `{"model":"llama","max_tokens":64}`
		}
		return good(i)
	}
	for _, tc := range []struct {
		name   string
		params func(int) string
		key    string
		status int
	}{
		{"refused", badLast, "", http.StatusBadRequest},
		{"sent", good, "k1", http.StatusOK},
		{"retried", good, "k1", http.StatusOK},
	} {
		body, _ := messageBatchBody(3, tc.params)
		w := postMessageBatchBody(p, body, tc.key)
		if w.Code != tc.status {
			t.Fatalf("%s: %d %s; want %d", tc.name, w.Code, w.Body, tc.status)
		}
		if keys := stagedKeys(t, store); len(keys) > 0 {
			t.Errorf("%s: the bucket still holds the staged requests: %q", tc.name, keys)
		}
	}
}

// The requests sent are the create's, in its order, read back from the
// staged copy: each item's id is its custom_id and its body its params as
// the client wrote them (spaces, a newline, characters JSON may escape), so
// that the sizes measured on the first read cut the chunks the second read
// fills, and every message fits the queue's.
func TestMessageBatchCreateSendsItsRequestsAsSent(t *testing.T) {
	c := sqstest.S3(t)
	store := payload.New(c, sqstest.Bucket(t, c))
	var mu sync.Mutex
	var sent []jobs.Entry
	queue := queueFunc(func(_ context.Context, entries []jobs.Entry) ([]error, error) {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, entries...)
		return make([]error, len(entries)), nil
	})
	const maxMessage = 8 << 10
	p := newStack(t, store, jobs.Config{MaxMessageBytes: maxMessage}, queue)
	const requests = 40
	params := func(i int) string {
		return fmt.Sprintf("{ \"model\": \"llama\",\n  \"max_tokens\": 64, \"messages\": [{\"role\": \"user\", "+
			"\"content\": \"<%d> & \u2028 \\u00e9t\u00e9 %s\"}] }", i, strings.Repeat("y", i*50))
	}
	body, _ := messageBatchBody(requests, params)
	if w := postMessageBatchBody(p, body, ""); w.Code != http.StatusOK {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	// The sender sends a window's calls at once, in no set order.
	slices.SortFunc(sent, func(a, b jobs.Entry) int { return a.Chunk - b.Chunk })
	var items []job.Item
	for _, e := range sent {
		if len(e.Body) > maxMessage {
			t.Errorf("chunk %d is %d bytes, over the queue's %d", e.Chunk, len(e.Body), maxMessage)
		}
		w, err := job.DecodeWork([]byte(e.Body))
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, w.Items...)
	}
	if len(sent) < 2 || len(items) != requests {
		t.Fatalf("%d items in %d chunks; want %d in more than one", len(items), len(sent), requests)
	}
	for i, it := range items {
		var got, want any
		if err := json.Unmarshal(it.Body, &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(params(i)), &want); err != nil {
			t.Fatal(err)
		}
		if id := fmt.Sprintf("doc-%05d", i); it.ID != id || !reflect.DeepEqual(got, want) {
			t.Errorf("item %d is %s, %.80s; want %s, %.80s", i, it.ID, it.Body, id, params(i))
		}
	}
}
