package publisher_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"mime/multipart"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/batches"
)

// batchJSON is the batch object as these net/http tests read it.
type batchJSON struct {
	ID, Status   string
	OutputFileID *string `json:"output_file_id"`
	ErrorFileID  *string `json:"error_file_id"`
	Errors       *struct {
		Data []struct {
			Code, Param string
			Line        int
		}
	}
	RequestCounts struct{ Total, Completed, Failed int } `json:"request_counts"`
	Usage         *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
}

// resultLine is a line of a batch's output or error file.
type resultLine struct {
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		Body       json.RawMessage `json:"body"`
	}
	Error *struct{ Code, Message string }
}

// uploadBatchFile uploads content as a file of purpose batch and returns
// its id.
func (s *server) uploadBatchFile(t *testing.T, content []byte) string {
	t.Helper()
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	_ = w.WriteField("purpose", "batch")
	fw, _ := w.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write(content)
	_ = w.Close()
	r := s.do("POST", "/v1/files", map[string]string{"Content-Type": w.FormDataContentType()}, body.Bytes())
	var f struct{ ID string }
	r.json(t, &f)
	if r.status != 200 || f.ID == "" {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	return f.ID
}

// createBatch creates a batch of file for endpoint and waits until it is
// past validating.
func (s *server) createBatch(t *testing.T, file, endpoint string) batchJSON {
	t.Helper()
	r := s.do("POST", "/v1/batches", map[string]string{"Content-Type": "application/json"},
		[]byte(fmt.Sprintf(`{"input_file_id":%q,"endpoint":%q,"completion_window":"24h"}`, file, endpoint)))
	var b batchJSON
	if r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r.json(t, &b)
	return s.waitBatchJSON(t, b.ID, func(b batchJSON) bool { return b.Status != "validating" })
}

// waitBatchJSON polls batch id until done says it is, for up to a minute.
func (s *server) waitBatchJSON(t *testing.T, id string, done func(batchJSON) bool) batchJSON {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var b batchJSON
		r := s.do("GET", "/v1/batches/"+id, nil, nil)
		r.json(t, &b)
		if done(b) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s: %s", id, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fileResults reads a batch's output or error file.
func (s *server) fileResults(t *testing.T, id string) []resultLine {
	t.Helper()
	r := s.do("GET", "/v1/files/"+id+"/content", nil, nil)
	if r.status != 200 {
		t.Fatalf("file %s: %d %s", id, r.status, r.body)
	}
	var out []resultLine
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	for sc.Scan() {
		var l resultLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		out = append(out, l)
	}
	return out
}

// A deployment that lists /v1/responses and /v1/moderations as served runs
// batches of both through a real subscriber and the fake model server: the
// output lines hold the server's Response and moderation, in OpenAI's
// shapes, and the usage adds up the responses' tokens. One that does not
// list them refuses them at validation, each line named, and a job for one
// with 422.
func TestBatchResponsesAndModerationsWhereServed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	srv := fakeoai.New(fakeoai.Config{OutputTokens: func(string, int) int { return 5 }})
	t.Cleanup(srv.Close)
	e.runServerSubscriber(srv)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{ChunkItems: 2, ServedEndpoints: []string{job.EndpointChatCompletions, job.EndpointResponses, job.EndpointModerations}}})

	bodies := map[string]string{
		job.EndpointResponses:   `{"model":"fake-model","input":"hello %d","max_output_tokens":20}`,
		job.EndpointModerations: `{"model":"fake-model","input":["a calm day %d","an attack"]}`,
	}
	for endpoint, field := range map[string]string{job.EndpointResponses: "output", job.EndpointModerations: "results"} {
		var in bytes.Buffer
		const n = 5
		for i := range n {
			fmt.Fprintf(&in, `{"custom_id":"r-%d","method":"POST","url":%q,"body":%s}`+"\n", i, endpoint, fmt.Sprintf(bodies[endpoint], i))
		}
		b := s.createBatch(t, s.uploadBatchFile(t, in.Bytes()), endpoint)
		if b.Status == "failed" {
			t.Fatalf("%s: failed at validation: %+v", endpoint, b.Errors)
		}
		b = s.waitBatchJSON(t, b.ID, func(b batchJSON) bool { return b.Status == "completed" })
		if b.RequestCounts.Completed != n || b.OutputFileID == nil || b.ErrorFileID != nil {
			t.Fatalf("%s: %+v", endpoint, b)
		}
		out := s.fileResults(t, *b.OutputFileID)
		if len(out) != n {
			t.Fatalf("%s: %d output lines", endpoint, len(out))
		}
		for i, l := range out {
			var body map[string]json.RawMessage
			if l.CustomID != fmt.Sprintf("r-%d", i) || l.Response == nil || l.Response.StatusCode != 200 ||
				json.Unmarshal(l.Response.Body, &body) != nil || body[field] == nil {
				t.Errorf("%s, line %d: %+v", endpoint, i, l)
			}
		}
		if endpoint == job.EndpointResponses && (b.Usage == nil || b.Usage.OutputTokens != 5*n || b.Usage.InputTokens == 0) {
			t.Errorf("%s: usage %+v; want the 5 output tokens of each of %d answers", endpoint, b.Usage, n)
		}
	}

	// The default deployment serves neither.
	d := e.serve(publisher.Config{})
	line := `{"custom_id":"r-0","method":"POST","url":"/v1/responses","body":{"model":"fake-model","input":"x"}}` + "\n"
	b := d.createBatch(t, d.uploadBatchFile(t, []byte(line)), job.EndpointResponses)
	if b.Status != "failed" || b.Errors == nil || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != batches.CodeEndpointNotServed ||
		b.Errors.Data[0].Line != 1 || b.Errors.Data[0].Param != "url" {
		t.Errorf("a responses batch where it is not served: %+v", b)
	}
	r := d.post([]byte(`{"endpoint":"/v1/moderations","items":[{"id":"a","body":{"model":"fake-model","input":"x"}}]}`), nil)
	if r.status != 422 {
		t.Errorf("a moderations job where it is not served: %d %s", r.status, r.body)
	}
}

// A line whose request timed out on every try (here the server's 504, with
// no retries) is in the error file with OpenAI's code request_timeout, and
// counted failed; the batch completes.
func TestBatchRequestTimeoutInTheErrorFile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	srv := fakeoai.New(fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultStatus, Status: 504}}})
	t.Cleanup(srv.Close)
	m, err := modelserver.Open(t.Context(), modelserver.Config{BaseURL: srv.URL(), Models: []string{"fake-model"}, MaxRetries: -1,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	e.runModel(m, nil)
	s := e.serve(publisher.Config{})
	line := `{"custom_id":"slow","method":"POST","url":"/v1/chat/completions","body":{"model":"fake-model","max_tokens":8,` +
		`"messages":[{"role":"user","content":"hi"}]}}` + "\n"
	b := s.createBatch(t, s.uploadBatchFile(t, []byte(line)), job.EndpointChatCompletions)
	b = s.waitBatchJSON(t, b.ID, func(b batchJSON) bool { return b.Status == "completed" })
	if b.RequestCounts.Failed != 1 || b.OutputFileID != nil || b.ErrorFileID == nil {
		t.Fatalf("batch %+v; want completed, its one line failed", b)
	}
	out := s.fileResults(t, *b.ErrorFileID)
	if len(out) != 1 || out[0].CustomID != "slow" || out[0].Error == nil || out[0].Error.Code != job.ItemRequestTimeout {
		t.Errorf("error file %+v; want the line with request_timeout", out)
	}
}
