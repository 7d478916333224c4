package publisher_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/publishertest"
)

// Issue 28, batches: the publisher's Batch API through apiClient, with a
// real subscriber on the emulator's queues running the lines (the tests
// with the OpenAI SDK for Go as the client are harness/sdkclients's).

// fileLines downloads file id with c and parses its lines; none for "".
func fileLines(t *testing.T, c *apiClient, id string) []publishertest.OutputLine {
	t.Helper()
	if id == "" {
		return nil
	}
	data, err := c.fileContent(t.Context(), id)
	if err != nil {
		t.Fatalf("content of %s: %s", id, apiError(err))
	}
	return publishertest.OutputLines(t, id, data)
}

// waitBatch polls the batch with c until its status is one of want.
func waitBatch(t *testing.T, c *apiClient, id string, limit time.Duration, want ...string) *batch {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		b, err := c.getBatch(t.Context(), id)
		if err != nil {
			t.Fatalf("Get %s: %s", id, apiError(err))
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

// embeddingLines is a batch file for the reference model (publishertest.EmbeddingLines).
var embeddingLines = publishertest.EmbeddingLines

// newBatch creates a batch of fileID with c, which answers it validating
// as OpenAI does, and returns it as its validator leaves it: in_progress or
// failed. sweep, for a publisher without its sweeper running, is called
// once first, to validate it.
func newBatch(t *testing.T, c *apiClient, fileID, endpoint string, sweep ...func()) *batch {
	t.Helper()
	b, err := c.createBatch(t.Context(), batchParams{InputFileID: fileID, Endpoint: endpoint, Metadata: map[string]string{"run": "nightly"}})
	if err != nil {
		t.Fatalf("create: %s", apiError(err))
	}
	if b.Status != "validating" || b.InProgressAt != 0 || b.field("errors") != "null" {
		t.Fatalf("create answered %s; want it validating", b.RawJSON())
	}
	for _, f := range sweep {
		f()
	}
	return waitBatch(t, c, b.ID, time.Minute, "in_progress", "failed", "cancelling", "finalizing", "completed")
}

// sweep is a pass of s's sweeper, for newBatch.
func (s *server) sweep(t *testing.T) func() {
	return func() {
		t.Helper()
		if err := s.pub.Sweep(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// runServerSubscriber runs a real subscriber whose model is the
// model-server backend on srv, until the test ends.
func (e *env) runServerSubscriber(srv *fakeoai.Server) {
	e.t.Helper()
	e.runModel(publishertest.ServerModel(e.t, srv), nil)
}

// A file with bad lines makes a batch that failed at validating, each bad
// line named with its line number, code and parameter, and nothing is
// enqueued.
func TestBatchInvalidLines(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{Models: []string{"ref"}}, API: publisher.API{APIKeys: []string{"acme:key-a"}}})
	a := s.client("key-a")
	good := `{"custom_id":"ok-%d","method":"POST","url":"/v1/embeddings","body":{"model":"ref","input":"x"}}`
	lines := []string{
		fmt.Sprintf(good, 1),
		`{"custom_id":"x","method":"POST","url":"/v1/embeddings","body":{"model":"ref","input":"x"}`, // 2: not JSON
		fmt.Sprintf(good, 1), // 3: duplicate custom_id
		`{"custom_id":"g","method":"GET","url":"/v1/embeddings","body":{"model":"ref","input":"x"}}`,        // 4
		`{"custom_id":"u","method":"POST","url":"/v1/chat/completions","body":{"model":"ref","input":"x"}}`, // 5
		`{"custom_id":"b","method":"POST","url":"/v1/embeddings","body":"x"}`,                               // 6
		`{"custom_id":"m","method":"POST","url":"/v1/embeddings","body":{"model":"other","input":"x"}}`,     // 7: model not allowed
		`{"custom_id":"","method":"POST","url":"/v1/embeddings","body":{"model":"ref","input":"x"}}`,        // 8
		`{"custom_id":"i","method":"POST","url":"/v1/embeddings","body":{"model":"ref"}}`,                   // 9: no input
		fmt.Sprintf(good, 2),
	}
	f := upload(t, a, "bad.jsonl", []byte(strings.Join(lines, "\n")+"\n"))
	bt := newBatch(t, a, f.ID, "/v1/embeddings")
	if bt.Status != "failed" || bt.FailedAt == 0 || bt.InProgressAt != 0 {
		t.Fatalf("batch: %s", bt.RawJSON())
	}
	// Issue 34, item 14: the counts add up. Nothing ran, so each of the
	// file's 10 requests, good or bad, failed with the batch.
	if c := bt.RequestCounts; c.Total != int64(len(lines)) || c.Completed != 0 || c.Failed != c.Total {
		t.Errorf("request_counts of a batch that failed validation: %+v; want total %d, all of them failed", c, len(lines))
	}
	type want struct {
		line        int64
		code, param string
	}
	wants := []want{{2, "invalid_json_line", ""}, {3, "duplicate_custom_id", "custom_id"}, {4, "invalid_method", "method"},
		{5, "mismatched_url", "url"}, {6, "invalid_body", "body"}, {7, "model_not_allowed", "body"}, {8, "invalid_custom_id", "custom_id"},
		{9, "invalid_body", "body"}}
	var got []want
	for _, d := range bt.Errors.Data {
		if d.Message == "" {
			t.Errorf("line %d: no message", d.Line)
		}
		got = append(got, want{d.Line, d.Code, d.Param})
	}
	if !slices.Equal(got, wants) {
		t.Errorf("errors:\n got %v\nwant %v", got, wants)
	}
	if got, err := a.getBatch(t.Context(), bt.ID); err != nil || got.Status != "failed" || len(got.Errors.Data) != len(wants) {
		t.Errorf("Get: %v %s", err, got.RawJSON())
	}
	if q := e.queued(); q != 0 {
		t.Errorf("%d messages on the queue; want none", q)
	}
	// A create with a bad field is refused in OpenAI's shape.
	for what, p := range map[string]batchParams{
		"endpoint":          {InputFileID: f.ID, Endpoint: "/v1/images/generations", CompletionWindow: "24h"},
		"completion_window": {InputFileID: f.ID, Endpoint: "/v1/embeddings", CompletionWindow: "1h"},
		"input_file_id":     {InputFileID: "file-nope", Endpoint: "/v1/embeddings", CompletionWindow: "24h"},
	} {
		_, err := a.createBatch(t.Context(), p)
		status, code := 400, "invalid_parameter"
		if what == "input_file_id" {
			status, code = 404, "not_found"
		}
		wantAPIError(t, what, err, status, code, what)
	}
	if q := e.queued(); q != 0 {
		t.Errorf("%d messages on the queue; want none", q)
	}
}

// A batch cancelled before it runs: the lines not run are batch_cancelled
// in the error file, and a chunk that had finished (its result stored as a
// subscriber stores one) is in the output file. An expired batch (its
// record's window moved into the past, as 24 hours would) ends expired, its
// lines batch_expired.
func TestBatchCancelAndExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{ChunkItems: 2}})
	c := s.client("")

	f := upload(t, c, "cancel.jsonl", embeddingLines(6))
	bt := newBatch(t, c, f.ID, "/v1/embeddings")
	body := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"ref","usage":{"prompt_tokens":3,"total_tokens":3}}`
	res := `{"v":1,"job_id":"` + bt.ID + `","chunk":0,"model":"ref","outputs":[` +
		`{"id":"e-0","response":{"status_code":200,"body":` + body + `}},{"id":"e-1","response":{"status_code":200,"body":` + body + `}}],"attempt":1,"worker_ms":1}`
	if _, err := e.store.Put(t.Context(), job.ResultKey(bt.ID, 0), []byte(res)); err != nil {
		t.Fatal(err)
	}
	cb, err := c.cancelBatch(t.Context(), bt.ID)
	if err != nil || cb.Status != "cancelling" || cb.CancellingAt == 0 {
		t.Fatalf("cancel: %v %s", err, cb.RawJSON())
	}

	f2 := upload(t, c, "expire.jsonl", embeddingLines(4))
	bx := newBatch(t, c, f2.ID, "/v1/embeddings")
	key := job.BatchKey("", bx.ID)
	raw, err := e.store.Read(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	raw = bytes.Replace(raw, []byte(fmt.Sprintf(`"expires_at":%d`, bx.ExpiresAt)), []byte(fmt.Sprintf(`"expires_at":%d`, time.Now().Unix()-1)), 1)
	if _, err := e.store.Put(t.Context(), key, raw); err != nil {
		t.Fatal(err)
	}
	if got := waitBatch(t, c, bx.ID, 0, "finalizing"); got.FinalizingAt == 0 {
		t.Errorf("expiring: %s", got.RawJSON())
	}
	// The sweeper cancels its job (the read above wrote nothing), before
	// the subscriber can run it.
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}

	e.runSubscriber() // deletes the chunks of both unrun
	cancelled := waitBatch(t, c, bt.ID, time.Minute, "cancelled")
	if cancelled.CancelledAt == 0 || cancelled.RequestCounts.Completed != 2 || cancelled.RequestCounts.Failed != 4 {
		t.Errorf("cancelled: %s", cancelled.RawJSON())
	}
	out, errs := fileLines(t, c, cancelled.OutputFileID), fileLines(t, c, cancelled.ErrorFileID)
	if len(out) != 2 || out[0].CustomID != "e-0" || out[1].CustomID != "e-1" || len(errs) != 4 {
		t.Fatalf("cancelled: %d output and %d error lines", len(out), len(errs))
	}
	for i, l := range errs {
		if l.CustomID != fmt.Sprintf("e-%d", i+2) || l.Response != nil || l.Error == nil || l.Error.Code != "batch_cancelled" {
			t.Errorf("error line %d: %+v", i, l)
		}
	}
	if again, err := c.cancelBatch(t.Context(), bt.ID); err != nil || again.Status != "cancelled" {
		t.Errorf("cancelling again: %v", err)
	}

	expired := waitBatch(t, c, bx.ID, time.Minute, "expired")
	if expired.ExpiredAt == 0 || expired.RequestCounts.Failed != 4 || expired.field("output_file_id") != "null" {
		t.Errorf("expired: %s", expired.RawJSON())
	}
	for i, l := range fileLines(t, c, expired.ErrorFileID) {
		if l.Error == nil || l.Error.Code != "batch_expired" || l.CustomID != fmt.Sprintf("e-%d", i) {
			t.Errorf("expired line %d: %+v", i, l)
		}
	}
}

// A batch left validating by a publisher that died while sending its
// chunks: the first sweep after batchSendStale (10 minutes) fails it, saying
// why, and cancels its job, so that what was sent does not run. A read
// changes nothing.
func TestBatchLeftValidatingFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serveUnswept(publisher.Config{})
	c := s.client("")
	id := "batch_0193a1b2c3d4e5f60718293a4b5c6d7e"
	created := time.Now().Add(-11 * time.Minute).Unix()
	rec := fmt.Sprintf(`{"v":2,"id":%q,"owner":"","endpoint":"/v1/embeddings","input_file_id":"file-0193a1b2c3d4e5f60718293a4b5c6d7e",`+
		`"completion_window":"24h","lines":3,"status":"validating","validating_at":%d,"created_at":%d,"expires_at":%d}`, id, created, created, created+24*3600)
	for key, body := range map[string]string{job.BatchKey("", id): rec, job.OpenBatchKey("", id): ""} {
		if _, err := e.store.Put(t.Context(), key, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := c.getBatch(t.Context(), id); err != nil || b.Status != "validating" {
		t.Fatalf("Get before the sweep: %v %s", err, b.RawJSON())
	}
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	b, err := c.getBatch(t.Context(), id)
	if err != nil || b.Status != "failed" || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != "enqueue_interrupted" || b.FailedAt == 0 {
		t.Fatalf("Get: %v %s", err, b.RawJSON())
	}
	if _, err := e.store.Read(t.Context(), job.CancelKey(id)); err != nil {
		t.Errorf("the job's cancel record: %v", err)
	}
	// Fresh, it is left as it is.
	id2 := "batch_0193a1b2c3d4e5f60718293a4b5c6d7f"
	rec2 := strings.NewReplacer(id, id2, fmt.Sprint(created), fmt.Sprint(time.Now().Unix())).Replace(rec)
	for key, body := range map[string]string{job.BatchKey("", id2): rec2, job.OpenBatchKey("", id2): ""} {
		if _, err := e.store.Put(t.Context(), key, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if b, err := c.getBatch(t.Context(), id2); err != nil || b.Status != "validating" {
		t.Errorf("a fresh validating batch: %v %s", err, b.RawJSON())
	}
}
