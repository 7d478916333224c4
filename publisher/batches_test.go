package publisher_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/publisher"
)

// Issue 28, batches: the official OpenAI SDK for Go as the client of the
// publisher's Batch API, with a real subscriber on the emulator's queues
// running the lines.

// outputLine is a line of a batch's output or error file, as OpenAI's API
// reference gives "the request output object" (the SDK has no type for it).
type outputLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// fileLines downloads file id with c and parses its lines; none for "".
func fileLines(t *testing.T, c openai.Client, id string) []outputLine {
	t.Helper()
	if id == "" {
		return nil
	}
	res, err := c.Files.Content(t.Context(), id)
	if err != nil {
		t.Fatalf("content of %s: %s", id, apiError(err))
	}
	defer res.Body.Close()
	var out []outputLine
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l outputLine
		// Strict: every key is one the reference names, and both response
		// and error are there (null when empty).
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("line %q of %s: %v", sc.Text(), id, err)
		}
		if !bytes.Contains(sc.Bytes(), []byte(`"response":`)) || !bytes.Contains(sc.Bytes(), []byte(`"error":`)) {
			t.Errorf("line %q of %s lacks response or error", sc.Text(), id)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitBatch polls the batch with c until its status is one of want.
func waitBatch(t *testing.T, c openai.Client, id string, limit time.Duration, want ...openai.BatchStatus) *openai.Batch {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		b, err := c.Batches.Get(t.Context(), id)
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

func embeddingLines(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"e-%d","method":"POST","url":"/v1/embeddings","body":{"model":"ref","input":"the %d th text to embed"}}`+"\n", i, i)
	}
	return b.Bytes()
}

// newBatch creates a batch of fileID with c, which answers it validating
// as OpenAI does, and returns it as its validator leaves it: in_progress or
// failed. sweep, for a publisher without its sweeper running, is called
// once first, to validate it.
func newBatch(t *testing.T, c openai.Client, fileID string, endpoint openai.BatchNewParamsEndpoint, sweep ...func()) *openai.Batch {
	t.Helper()
	b, err := c.Batches.New(t.Context(), openai.BatchNewParams{InputFileID: fileID, Endpoint: endpoint,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h, Metadata: map[string]string{"run": "nightly"}})
	if err != nil {
		t.Fatalf("Batches.New: %s", apiError(err))
	}
	if b.Status != openai.BatchStatusValidating || b.InProgressAt != 0 || b.JSON.Errors.Raw() != "null" {
		t.Fatalf("Batches.New answered %s; want it validating", b.RawJSON())
	}
	for _, f := range sweep {
		f()
	}
	return waitBatch(t, c, b.ID, time.Minute, openai.BatchStatusInProgress, openai.BatchStatusFailed,
		openai.BatchStatusCancelling, openai.BatchStatusFinalizing, openai.BatchStatusCompleted)
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

// An embeddings batch runs on the in-process model: created, polled to
// completed, its output file holds one line per request in the file's
// order, each body OpenAI's embeddings response as the SDK's type reads it;
// no error file. The batch lists for its owner and for no one else, who
// gets 404 on it, on its cancel and on a batch of the owner's file.
func TestBatchEmbeddingsWithTheOpenAISDK(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{APIKeys: []string{"acme:key-a", "globex:key-b"}, ChunkItems: 4})
	a, b := s.sdk("key-a"), s.sdk("key-b")
	const n = 10
	f := upload(t, a, "embed.jsonl", embeddingLines(n))
	before := time.Now().Unix()
	bt := newBatch(t, a, f.ID, openai.BatchNewParamsEndpointV1Embeddings)
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
		wantAPIError(t, "another tenant's "+what, err, 404, "not_found", "id")
	}
	_, err := b.Batches.New(t.Context(), openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1Embeddings,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	wantAPIError(t, "a batch of another tenant's file", err, 404, "not_found", "input_file_id")
	if page, err := b.Batches.List(t.Context(), openai.BatchListParams{}); err != nil || len(page.Data) != 0 {
		t.Errorf("another tenant lists %d batches (%v)", len(page.Data), err)
	}

	e.runSubscriber()
	done := waitBatch(t, a, bt.ID, time.Minute, openai.BatchStatusCompleted)
	if done.RequestCounts.Completed != n || done.RequestCounts.Failed != 0 || done.CompletedAt < done.InProgressAt ||
		done.FinalizingAt == 0 || done.OutputFileID == "" || done.JSON.ErrorFileID.Raw() != "null" || done.Usage.InputTokens == 0 {
		t.Errorf("completed: %s", done.RawJSON())
	}
	out := fileLines(t, a, done.OutputFileID)
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
	wantAPIError(t, "cancelling a completed batch", err, 409, "batch_not_cancellable", "")
}

// runServerSubscriber runs a real subscriber whose model is the
// model-server backend on srv, until the test ends.
func (e *env) runServerSubscriber(srv *fakeoai.Server) {
	e.t.Helper()
	m, _, err := modelserver.Open(e.t.Context(), modelserver.Config{BaseURL: srv.URL(), Models: []string{"fake-model"},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = m.Close() })
	e.runModel(m, gpu.NewSim(1<<30))
}

// A chat-completions batch runs on a model server (the fake): the answers
// are in the output file, parsed by the SDK's ChatCompletion; the request
// the server refused (a prompt over its context) is in the error file with
// its 400 and body, and counted failed.
func TestBatchChatCompletionsWithTheOpenAISDK(t *testing.T) {
	t.Parallel()
	srv := fakeoai.New(fakeoai.Config{MaxModelLen: 64, ContextLengthStatus: 400})
	defer srv.Close()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{APIKeys: []string{"acme:key-a"}, ChunkItems: 3})
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
	f := upload(t, a, "chat.jsonl", in.Bytes())
	bt := newBatch(t, a, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	e.runServerSubscriber(srv)
	done := waitBatch(t, a, bt.ID, time.Minute, openai.BatchStatusCompleted)
	if done.RequestCounts.Total != n || done.RequestCounts.Completed != n-1 || done.RequestCounts.Failed != 1 ||
		done.Usage.OutputTokens == 0 || done.Usage.TotalTokens != done.Usage.InputTokens+done.Usage.OutputTokens {
		t.Errorf("completed: %s", done.RawJSON())
	}
	out, errs := fileLines(t, a, done.OutputFileID), fileLines(t, a, done.ErrorFileID)
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

// A file with bad lines makes a batch that failed at validating, each bad
// line named with its line number, code and parameter, and nothing is
// enqueued.
func TestBatchInvalidLines(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{APIKeys: []string{"acme:key-a"}, Models: []string{"ref"}})
	a := s.sdk("key-a")
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
	bt := newBatch(t, a, f.ID, openai.BatchNewParamsEndpointV1Embeddings)
	if bt.Status != openai.BatchStatusFailed || bt.FailedAt == 0 || bt.InProgressAt != 0 {
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
	if got, err := a.Batches.Get(t.Context(), bt.ID); err != nil || got.Status != openai.BatchStatusFailed || len(got.Errors.Data) != len(wants) {
		t.Errorf("Get: %v %s", err, got.RawJSON())
	}
	if q := e.queued(); q != 0 {
		t.Errorf("%d messages on the queue; want none", q)
	}
	// A request the SDK sends wrong is refused in OpenAI's shape.
	for what, p := range map[string]openai.BatchNewParams{
		"endpoint":          {InputFileID: f.ID, Endpoint: "/v1/images/generations", CompletionWindow: "24h"},
		"completion_window": {InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1Embeddings, CompletionWindow: "1h"},
		"input_file_id":     {InputFileID: "file-nope", Endpoint: openai.BatchNewParamsEndpointV1Embeddings, CompletionWindow: "24h"},
	} {
		_, err := a.Batches.New(t.Context(), p)
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
	s := e.serve(publisher.Config{ChunkItems: 2})
	c := s.sdk("")

	f := upload(t, c, "cancel.jsonl", embeddingLines(6))
	bt := newBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1Embeddings)
	body := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"ref","usage":{"prompt_tokens":3,"total_tokens":3}}`
	res := `{"v":1,"job_id":"` + bt.ID + `","chunk":0,"model":"ref","outputs":[` +
		`{"id":"e-0","response":{"status_code":200,"body":` + body + `}},{"id":"e-1","response":{"status_code":200,"body":` + body + `}}],"attempt":1,"worker_ms":1}`
	if _, err := e.store.Put(t.Context(), job.ResultKey(bt.ID, 0), []byte(res)); err != nil {
		t.Fatal(err)
	}
	cb, err := c.Batches.Cancel(t.Context(), bt.ID)
	if err != nil || cb.Status != openai.BatchStatusCancelling || cb.CancellingAt == 0 {
		t.Fatalf("cancel: %v %s", err, cb.RawJSON())
	}

	f2 := upload(t, c, "expire.jsonl", embeddingLines(4))
	bx := newBatch(t, c, f2.ID, openai.BatchNewParamsEndpointV1Embeddings)
	key := job.BatchKey("", bx.ID)
	raw, err := e.store.Read(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	raw = bytes.Replace(raw, []byte(fmt.Sprintf(`"expires_at":%d`, bx.ExpiresAt)), []byte(fmt.Sprintf(`"expires_at":%d`, time.Now().Unix()-1)), 1)
	if _, err := e.store.Put(t.Context(), key, raw); err != nil {
		t.Fatal(err)
	}
	if got := waitBatch(t, c, bx.ID, 0, openai.BatchStatusFinalizing); got.FinalizingAt == 0 {
		t.Errorf("expiring: %s", got.RawJSON())
	}
	// The sweeper cancels its job (the read above wrote nothing), before
	// the subscriber can run it.
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}

	e.runSubscriber() // deletes the chunks of both unrun
	cancelled := waitBatch(t, c, bt.ID, time.Minute, openai.BatchStatusCancelled)
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
	if again, err := c.Batches.Cancel(t.Context(), bt.ID); err != nil || again.Status != openai.BatchStatusCancelled {
		t.Errorf("cancelling again: %v", err)
	}

	expired := waitBatch(t, c, bx.ID, time.Minute, openai.BatchStatusExpired)
	if expired.ExpiredAt == 0 || expired.RequestCounts.Failed != 4 || expired.JSON.OutputFileID.Raw() != "null" {
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
	c := s.sdk("")
	id := "batch_0193a1b2c3d4e5f60718293a4b5c6d7e"
	created := time.Now().Add(-11 * time.Minute).Unix()
	rec := fmt.Sprintf(`{"v":2,"id":%q,"owner":"","endpoint":"/v1/embeddings","input_file_id":"file-0193a1b2c3d4e5f60718293a4b5c6d7e",`+
		`"completion_window":"24h","lines":3,"status":"validating","validating_at":%d,"created_at":%d,"expires_at":%d}`, id, created, created, created+24*3600)
	for key, body := range map[string]string{job.BatchKey("", id): rec, job.OpenBatchKey("", id): ""} {
		if _, err := e.store.Put(t.Context(), key, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := c.Batches.Get(t.Context(), id); err != nil || b.Status != openai.BatchStatusValidating {
		t.Fatalf("Get before the sweep: %v %s", err, b.RawJSON())
	}
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	b, err := c.Batches.Get(t.Context(), id)
	if err != nil || b.Status != openai.BatchStatusFailed || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != "enqueue_interrupted" || b.FailedAt == 0 {
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
	if b, err := c.Batches.Get(t.Context(), id2); err != nil || b.Status != openai.BatchStatusValidating {
		t.Errorf("a fresh validating batch: %v %s", err, b.RawJSON())
	}
}
