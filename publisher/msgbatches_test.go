package publisher_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/publisher"
)

// Issue 35, Anthropic's Message Batches: a client speaking Anthropic's wire
// format over net/http (the SDK's test is in harness/, whose module may
// depend on it), a real subscriber on the emulator's queues, and the fake
// model server's /v1/messages.

// msgBatch is Anthropic's MessageBatch.
type msgBatch struct {
	ID               string `json:"id"`
	Type             string `json:"type"`
	ProcessingStatus string `json:"processing_status"`
	RequestCounts    struct {
		Processing, Succeeded, Errored, Canceled, Expired int
	} `json:"request_counts"`
	EndedAt           *string `json:"ended_at"`
	CreatedAt         string  `json:"created_at"`
	ExpiresAt         string  `json:"expires_at"`
	ArchivedAt        *string `json:"archived_at"`
	CancelInitiatedAt *string `json:"cancel_initiated_at"`
	ResultsURL        *string `json:"results_url"`
}

func (b *msgBatch) total() int {
	c := b.RequestCounts
	return c.Processing + c.Succeeded + c.Errored + c.Canceled + c.Expired
}

type msgResultLine struct {
	CustomID string `json:"custom_id"`
	Result   struct {
		Type    string `json:"type"`
		Message *struct {
			Type       string `json:"type"`
			Role       string `json:"role"`
			StopReason string `json:"stop_reason"`
			Content    []struct{ Type, Text string }
			Usage      struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		} `json:"message"`
		Error *struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		} `json:"error"`
	} `json:"result"`
}

// anthropicClient sends requests as Anthropic's SDKs do: x-api-key and
// anthropic-version.
type anthropicClient struct {
	s   *server
	key string
}

func (c anthropicClient) do(method, path string, body []byte) reply {
	c.s.t.Helper()
	h := map[string]string{"x-api-key": c.key, "anthropic-version": "2023-06-01"}
	if body != nil {
		h["Content-Type"] = "application/json"
	}
	return c.s.do(method, path, h, body)
}

func (c anthropicClient) batch(id string) msgBatch {
	c.s.t.Helper()
	r := c.do(http.MethodGet, "/v1/messages/batches/"+id, nil)
	if r.status != http.StatusOK {
		c.s.t.Fatalf("GET %s: %d %s", id, r.status, r.body)
	}
	var b msgBatch
	r.json(c.s.t, &b)
	return b
}

// wait polls batch id until done says so.
func (c anthropicClient) wait(id string, limit time.Duration, done func(msgBatch) bool) msgBatch {
	c.s.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		b := c.batch(id)
		if done(b) {
			return b
		}
		if time.Now().After(deadline) {
			c.s.t.Fatalf("batch %s after %v: %+v", id, limit, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func ended(b msgBatch) bool { return b.ProcessingStatus == "ended" }

// wantAnthropicError checks r is Anthropic's error of status and type.
func wantAnthropicError(t *testing.T, what string, r reply, status int, typ string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if r.status != status || json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != typ || e.Error.Message == "" {
		t.Errorf("%s: %d %s; want %d and an error of type %s", what, r.status, r.body, status, typ)
	}
}

func createBody(n int, params func(i int) string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"requests":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"custom_id":"r-%d","params":%s}`, i, params(i))
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

func question(i int) string {
	return fmt.Sprintf(`{"model":"fake-model","max_tokens":8,"system":"be brief","messages":[{"role":"user","content":"question %d"}]}`, i)
}

// Message batches end to end: created (every field as Anthropic's
// reference has it), refused whole when a request is bad, polled to ended
// with one request the server refused (errored, its error in Anthropic's
// shape) and the rest succeeded with Anthropic Messages from the server's
// /v1/messages; listed a page at a time both ways; a large batch canceled
// mid-run ends with every request succeeded, errored or canceled, and
// some of each of succeeded and canceled; another tenant gets 404 on every
// route of them; delete is refused while processing and removes an ended
// batch and its results.
func TestMessageBatchesEndToEnd(t *testing.T) {
	t.Parallel()
	// Without KV metrics the subscriber admits two rounds of the
	// concurrency at a time (modelserver.Model.Slots), so a cancel reaches
	// chunks not yet started.
	srv := fakeoai.New(fakeoai.Config{MaxModelLen: 64, ContextLengthStatus: 400, TokenLatency: 20 * time.Millisecond, NoMetrics: true,
		OutputTokens: func(string, int) int { return 6 }})
	defer srv.Close()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{ChunkItems: 2}, API: publisher.API{APIKeys: []string{"acme:key-a", "globex:key-b"}}})
	a, other := anthropicClient{s, "key-a"}, anthropicClient{s, "key-b"}

	// The headers, and a create with a bad request: refused whole.
	wantAnthropicError(t, "no anthropic-version", s.do(http.MethodGet, "/v1/messages/batches", map[string]string{"x-api-key": "key-a"}, nil),
		400, "invalid_request_error")
	wantAnthropicError(t, "no key", anthropicClient{s, ""}.do(http.MethodGet, "/v1/messages/batches", nil), 401, "authentication_error")
	wantAnthropicError(t, "a request without max_tokens", a.do(http.MethodPost, "/v1/messages/batches", createBody(2, func(i int) string {
		if i == 1 {
			return `{"model":"fake-model","messages":[{"role":"user","content":"hi"}]}`
		}
		return question(i)
	})), 400, "invalid_request_error")
	dup := a.do(http.MethodPost, "/v1/messages/batches", []byte(`{"requests":[{"custom_id":"x","params":`+question(0)+`},{"custom_id":"x","params":`+question(1)+`}]}`))
	wantAnthropicError(t, "a duplicate custom_id", dup, 400, "invalid_request_error")
	if !strings.Contains(string(dup.body), "requests.1.custom_id") {
		t.Errorf("the duplicate is not named: %s", dup.body)
	}
	// /v1/messages is no endpoint of OpenAI's Batch API.
	r := s.do(http.MethodPost, "/v1/batches", map[string]string{"Authorization": "Bearer key-a", "Content-Type": "application/json"},
		[]byte(`{"input_file_id":"file-0","endpoint":"/v1/messages","completion_window":"24h"}`))
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"param":"endpoint"`) {
		t.Errorf("an OpenAI batch of /v1/messages: %d %s", r.status, r.body)
	}
	if n := e.queued(); n != 0 {
		t.Fatalf("%d messages enqueued by refused creates", n)
	}

	create := func(body []byte) msgBatch {
		t.Helper()
		r := a.do(http.MethodPost, "/v1/messages/batches", body)
		if r.status != http.StatusOK {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		var b msgBatch
		r.json(t, &b)
		return b
	}
	before := time.Now().Add(-time.Second)
	first := create(createBody(5, func(i int) string {
		if i == 3 {
			return `{"model":"fake-model","max_tokens":8,"messages":[{"role":"user","content":"` + strings.Repeat("long ", 200) + `"}]}`
		}
		return question(i)
	}))
	created, err1 := time.Parse(time.RFC3339, first.CreatedAt)
	expires, err2 := time.Parse(time.RFC3339, first.ExpiresAt)
	if !strings.HasPrefix(first.ID, "msgbatch_") || first.Type != "message_batch" || first.ProcessingStatus != "in_progress" ||
		first.RequestCounts.Processing != 5 || first.total() != 5 || err1 != nil || err2 != nil || created.Before(before.Truncate(time.Second)) ||
		expires.Sub(created) != 24*time.Hour || first.EndedAt != nil || first.ResultsURL != nil || first.CancelInitiatedAt != nil || first.ArchivedAt != nil {
		t.Errorf("created: %+v", first)
	}
	second := create(createBody(1, question))
	const n = 600
	large := create(createBody(n, question))

	// Another tenant's 404s, on every route of a batch.
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, ""}, {http.MethodPost, "/cancel"}, {http.MethodDelete, ""}, {http.MethodGet, "/results"},
	} {
		wantAnthropicError(t, "another tenant's "+c.method+" "+c.path, other.do(c.method, "/v1/messages/batches/"+first.ID+c.path, nil),
			404, "not_found_error")
	}
	var otherPage struct{ Data []msgBatch }
	other.do(http.MethodGet, "/v1/messages/batches", nil).json(t, &otherPage)
	if len(otherPage.Data) != 0 {
		t.Errorf("another tenant lists %+v", otherPage.Data)
	}
	wantAnthropicError(t, "deleting a batch in progress", a.do(http.MethodDelete, "/v1/messages/batches/"+large.ID, nil), 400, "invalid_request_error")
	wantAnthropicError(t, "results of a batch in progress", a.do(http.MethodGet, "/v1/messages/batches/"+large.ID+"/results", nil), 400,
		"invalid_request_error")

	// List pages: newest first, on with after_id, back with before_id.
	type page struct {
		Data    []msgBatch
		HasMore bool    `json:"has_more"`
		FirstID *string `json:"first_id"`
		LastID  *string `json:"last_id"`
	}
	list := func(query string) page {
		t.Helper()
		var p page
		a.do(http.MethodGet, "/v1/messages/batches?"+query, nil).json(t, &p)
		return p
	}
	ids := func(p page) []string {
		var out []string
		for _, b := range p.Data {
			out = append(out, b.ID)
		}
		return out
	}
	p1 := list("limit=2")
	if got := ids(p1); len(got) != 2 || got[0] != large.ID || got[1] != second.ID || !p1.HasMore || *p1.FirstID != large.ID || *p1.LastID != second.ID {
		t.Errorf("first page %v, has_more %v", got, p1.HasMore)
	}
	p2 := list("limit=2&after_id=" + second.ID)
	if got := ids(p2); len(got) != 1 || got[0] != first.ID || p2.HasMore {
		t.Errorf("after %s: %v, has_more %v", second.ID, got, p2.HasMore)
	}
	p3 := list("limit=1&before_id=" + first.ID)
	if got := ids(p3); len(got) != 1 || got[0] != second.ID || !p3.HasMore {
		t.Errorf("before %s: %v, has_more %v", first.ID, got, p3.HasMore)
	}
	wantAnthropicError(t, "limit 1001", a.do(http.MethodGet, "/v1/messages/batches?limit=1001", nil), 400, "invalid_request_error")

	m, err := modelserver.Open(t.Context(), modelserver.Config{BaseURL: srv.URL(), Models: []string{"fake-model"},
		Messages: modelserver.MessagesNative, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	e.runModel(m, nil)

	// Cancel the large one once some of it has run.
	a.wait(large.ID, time.Minute, func(b msgBatch) bool { return b.RequestCounts.Succeeded > 0 })
	r = a.do(http.MethodPost, "/v1/messages/batches/"+large.ID+"/cancel", nil)
	var canceling msgBatch
	r.json(t, &canceling)
	if r.status != http.StatusOK || canceling.ProcessingStatus != "canceling" || canceling.CancelInitiatedAt == nil {
		t.Errorf("cancel: %d %s", r.status, r.body)
	}
	done := a.wait(large.ID, 2*time.Minute, ended)
	c := done.RequestCounts
	if c.Processing != 0 || c.Succeeded == 0 || c.Canceled == 0 || c.Expired != 0 || done.total() != n || done.CancelInitiatedAt == nil ||
		done.EndedAt == nil || done.ResultsURL == nil {
		t.Errorf("canceled: %+v", done)
	}
	results := func(b msgBatch) []msgResultLine {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, *b.ResultsURL, nil)
		req.Header.Set("x-api-key", "key-a")
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("results of %s: %v %v", b.ID, err, resp)
		}
		defer resp.Body.Close()
		var out []msgResultLine
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var l msgResultLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			out = append(out, l)
		}
		return out
	}
	byType := map[string]int{}
	for i, l := range results(done) {
		byType[l.Result.Type]++
		if l.CustomID != fmt.Sprintf("r-%d", i) {
			t.Errorf("line %d is %s", i, l.CustomID)
		}
	}
	if byType["succeeded"] != c.Succeeded || byType["errored"] != c.Errored || byType["canceled"] != c.Canceled {
		t.Errorf("results %v; counts %+v", byType, c)
	}
	t.Logf("canceled mid-run: %+v", c)

	got := a.wait(first.ID, time.Minute, ended)
	if got.RequestCounts.Succeeded != 4 || got.RequestCounts.Errored != 1 || got.total() != 5 || got.ResultsURL == nil || got.EndedAt == nil ||
		got.CancelInitiatedAt != nil {
		t.Errorf("ended: %+v", got)
	}
	lines := results(got)
	if len(lines) != 5 {
		t.Fatalf("%d result lines", len(lines))
	}
	for i, l := range lines {
		res := l.Result
		if l.CustomID != fmt.Sprintf("r-%d", i) {
			t.Errorf("line %d is %s", i, l.CustomID)
		}
		if i == 3 {
			if res.Type != "errored" || res.Error == nil || res.Error.Type != "error" || res.Error.Error.Type != "invalid_request_error" ||
				res.Error.Error.Message == "" {
				t.Errorf("the long request: %+v", res)
			}
			continue
		}
		if res.Type != "succeeded" || res.Message == nil || res.Message.Type != "message" || res.Message.Role != "assistant" ||
			len(res.Message.Content) != 1 || res.Message.Content[0].Text == "" || res.Message.Usage.OutputTokens == 0 {
			t.Errorf("line %d: %+v", i, res)
		}
	}

	// Delete: the batch and its results go.
	r = a.do(http.MethodDelete, "/v1/messages/batches/"+first.ID, nil)
	if r.status != http.StatusOK || string(bytes.TrimSpace(r.body)) != `{"id":"`+first.ID+`","type":"message_batch_deleted"}` {
		t.Errorf("delete: %d %s", r.status, r.body)
	}
	wantAnthropicError(t, "GET after delete", a.do(http.MethodGet, "/v1/messages/batches/"+first.ID, nil), 404, "not_found_error")
	wantAnthropicError(t, "results after delete", a.do(http.MethodGet, "/v1/messages/batches/"+first.ID+"/results", nil), 404, "not_found_error")
	a.wait(second.ID, time.Minute, ended)
}

// A create whose body stalls is cut off at the pace every body must keep,
// 408 in Anthropic's shape, and gives back its client's place: the same
// client's next create is taken. The server's own timer ends the stall
// (BodyGrace); nothing here is timed.
func TestMessageBatchCreateThatStallsIsCutOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{API: publisher.API{APIKeys: []string{"acme:key-a"}, BodyGrace: 500 * time.Millisecond}})
	c, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	part := `{"requests":[{"custom_id":"a","params":`
	if _, err := fmt.Fprintf(c, "POST /v1/messages/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-api-key: key-a\r\n"+
		"anthropic-version: 2023-06-01\r\nContent-Length: 100000\r\n\r\n%s", part); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantAnthropicError(t, "a stalled create", reply{resp.StatusCode, resp.Header, body}, http.StatusRequestTimeout, "invalid_request_error")
	r := anthropicClient{s, "key-a"}.do(http.MethodPost, "/v1/messages/batches", createBody(1, question))
	if r.status != http.StatusOK {
		t.Errorf("the next create: %d %s", r.status, r.body)
	}
}

// A batch whose window ends before its requests run (its record's
// expires_at moved into the past, as 24 hours would) ends with every
// request expired, each result of type expired, and no cancel initiated.
func TestMessageBatchExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{ChunkItems: 2}})
	a := anthropicClient{s, ""}
	r := a.do(http.MethodPost, "/v1/messages/batches", createBody(3, question))
	var mb msgBatch
	r.json(t, &mb)
	key := job.BatchKey("", mb.ID)
	raw, err := e.store.Read(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		ExpiresAt int64 `json:"expires_at"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	raw = bytes.Replace(raw, []byte(fmt.Sprintf(`"expires_at":%d`, rec.ExpiresAt)), []byte(fmt.Sprintf(`"expires_at":%d`, time.Now().Unix()-1)), 1)
	if _, err := e.store.Put(t.Context(), key, raw); err != nil {
		t.Fatal(err)
	}
	// The sweeper cancels its job at the window's end, before any
	// subscriber runs it; the subscriber then deletes its chunks unrun.
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.runSubscriber()
	done := a.wait(mb.ID, time.Minute, ended)
	if c := done.RequestCounts; c.Expired != 3 || c.Succeeded+c.Errored+c.Canceled+c.Processing != 0 || done.CancelInitiatedAt != nil {
		t.Errorf("expired: %+v", done)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, *done.ResultsURL, nil)
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	n := 0
	for ; sc.Scan(); n++ {
		var l msgResultLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.Result.Type != "expired" || l.CustomID != fmt.Sprintf("r-%d", n) {
			t.Errorf("result %d: %s", n, sc.Bytes())
		}
	}
	if n != 3 {
		t.Errorf("%d results", n)
	}
}
