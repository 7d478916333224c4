package publisher_test

// The test environment of the end-to-end tests: real queues and a real
// bucket on whatever AWS_ENDPOINT_URL points at (the emulator in make test),
// a publisher on them behind an httptest server.

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
	"github.com/vramq/vramq/publisher/publishertest"
)

type env struct {
	t      *testing.T
	client *sqs.Client
	urls   localstack.URLs
	store  *payload.Store  // nil without a bucket
	seen   map[string]bool // message ids drain has returned
}

// newEnv makes queues and, with bucket, a payload bucket for this test.
func newEnv(t *testing.T, bucket bool) *env {
	t.Helper()
	e := &env{t: t, client: sqstest.Client(t), seen: map[string]bool{}}
	e.urls = sqstest.Queues(t, e.client, 5)
	if bucket {
		s3c := sqstest.S3(t)
		e.store = payload.New(s3c, sqstest.Bucket(t, s3c))
	}
	return e
}

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// server is a publisher on the env's work queue, served over HTTP.
type server struct {
	*env
	pub *publisher.Publisher
	reg *prometheus.Registry
	url string
}

// serve starts a publisher with cfg (Queue, Payloads and Logger filled in
// where unset, Registerer always) and the queue's real limits, with its
// batch sweeper running as in server mode (every second, here).
func (e *env) serve(cfg publisher.Config) *server {
	e.t.Helper()
	s := e.serveUnswept(cfg)
	publishertest.Sweep(e.t, s.pub)
	return s
}

// serveUnswept is serve without the sweeper: a test advances batches itself
// (Sweep).
func (e *env) serveUnswept(cfg publisher.Config) *server {
	e.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	p := publishertest.Serve(e.t, e.client, e.urls.Work, e.store, cfg)
	return &server{env: e, pub: p.Pub, reg: p.Reg, url: p.URL}
}

// reply is an HTTP response, read.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("status %d, body %q: %v", r.status, r.body, err)
	}
}

// do sends one request; header values of "" are left out.
func (s *server) do(method, path string, header map[string]string, body []byte) reply {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.t.Context(), method, s.url+path, bytes.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	for k, v := range header {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

// post sends a job with the JSON content type and the extra headers.
func (s *server) post(body []byte, header map[string]string) reply {
	h := map[string]string{"Content-Type": "application/json"}
	for k, v := range header {
		h[k] = v
	}
	return s.do("POST", "/v1/jobs", h, body)
}

type accepted struct {
	JobID        string `json:"job_id"`
	Chunks       int    `json:"chunks"`
	Items        int    `json:"items"`
	ClaimChecked int    `json:"claim_checked"`
	StatusURL    string `json:"status_url"`
}

func (s *server) mustPost(body []byte, header map[string]string) accepted {
	s.t.Helper()
	r := s.post(body, header)
	if r.status != http.StatusAccepted {
		s.t.Fatalf("POST: %d %s", r.status, r.body)
	}
	var a accepted
	r.json(s.t, &a)
	return a
}

// received is a work message taken off the queue.
type received struct {
	work  *job.Work
	attrs map[string]string
}

// drain is publishertest.Drain of the env's work queue, its messages told
// apart across calls.
func (e *env) drain(want int) []received {
	e.t.Helper()
	var out []received
	for _, m := range publishertest.Drain(e.t, e.client, e.urls.Work, e.seen, want) {
		out = append(out, received{m.Work, m.Attrs})
	}
	return out
}

// queued is the queue's count of messages, visible and in flight.
func (e *env) queued() int {
	e.t.Helper()
	out, err := e.client.GetQueueAttributes(e.t.Context(), &sqs.GetQueueAttributesInput{QueueUrl: &e.urls.Work, AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		e.t.Fatal(err)
	}
	a, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	b, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return a + b
}

// checkWhole checks that msgs are exactly the chunks of job a, each once,
// with its attributes, and returns them in chunk order.
func checkWhole(t *testing.T, a accepted, msgs []received) []*job.Work {
	t.Helper()
	byChunk := make([]*job.Work, a.Chunks)
	items := 0
	for _, m := range msgs {
		w := m.work
		if w.JobID != a.JobID {
			t.Errorf("message of job %q on the queue, want only %q", w.JobID, a.JobID)
			continue
		}
		if w.Chunks != a.Chunks || w.Chunk < 0 || w.Chunk >= a.Chunks {
			t.Errorf("chunk %d of %d, job has %d", w.Chunk, w.Chunks, a.Chunks)
			continue
		}
		if byChunk[w.Chunk] != nil {
			t.Errorf("chunk %d on the queue twice", w.Chunk)
		}
		byChunk[w.Chunk] = w
		items += len(w.Items)
		if m.attrs[job.AttrJobID] != a.JobID || m.attrs[job.AttrChunk] != strconv.Itoa(w.Chunk) {
			t.Errorf("chunk %d has attributes %v", w.Chunk, m.attrs)
		}
	}
	for c, w := range byChunk {
		if w == nil {
			t.Errorf("chunk %d missing from the queue", c)
		}
	}
	if items != a.Items {
		t.Errorf("%d items on the queue, job has %d", items, a.Items)
	}
	return byChunk
}

// jobBody builds a request body from items and options.
func jobBody(t *testing.T, items []jobs.RequestItem, chunkItems int) []byte {
	t.Helper()
	req := jobs.JobRequest{Items: items}
	if chunkItems > 0 {
		req.Options = &jobs.JobOptions{ChunkItems: chunkItems}
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
