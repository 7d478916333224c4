package subscriber_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/promsum"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/subscriber"
)

// End-to-end tests of the model-server dispositions the subscriber acts on
// (run.go, pause.go): the whole subscriber on the emulator's queues, its model a
// model/modelserver backend on an internal/testenv/fakeoai server.

// newServerPipeline is a pipeline whose model is a model-server backend on
// srv, with maxWait as the longest the backend waits inside Run.
func newServerPipeline(t *testing.T, maxReceive int, cfg subscriber.Config, srv *fakeoai.Server, maxWait time.Duration) *pipeline {
	t.Helper()
	if endpoint() == "" {
		t.Skip("no SQS endpoint: set AWS_ENDPOINT_URL (make test starts the emulator and sets it)")
	}
	return newPipelineOn(t, maxReceive, cfg, nil, func(*gpu.Sim) backend.Backend {
		m, err := modelserver.Open(t.Context(), modelserver.Config{BaseURL: srv.URL(), Models: []string{"fake-model"},
			MaxWait: maxWait, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	})
}

func chatWork(jobID string, chunk, chunks int, texts ...string) job.Work {
	w := job.Work{V: job.Version, JobID: jobID, Chunk: chunk, Chunks: chunks, Endpoint: job.EndpointChatCompletions}
	for i, text := range texts {
		w.Items = append(w.Items, job.Item{ID: fmt.Sprintf("%s-%d-%d", jobID, chunk, i), Body: json.RawMessage(fmt.Sprintf(
			`{"model":"fake-model","messages":[{"role":"user","content":%q}],"max_tokens":8}`, text))})
	}
	return w
}

// receives is how many ReceiveMessage calls the subscriber has made.
func (p *pipeline) receives() float64 {
	return promsum.Labelled(p.t, p.reg, "vramq_subscriber_sqs_requests_total", "action", "ReceiveMessage")
}

// A 429 (TGI's "Model is overloaded") whose Retry-After is past the backend's
// wait holds the batch's messages, their leases extended, until then, and the
// subscriber receives nothing meanwhile: the messages run again and complete,
// none dead-lettered by the queue's redrive (a third receive would).
func TestE2EModelServerBackoffWaitsInTheQueue(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	const retryAfter = 10 * time.Second
	srv := fakeoai.New(fakeoai.Config{Faults: []fakeoai.Fault{
		{Kind: fakeoai.FaultStatus, Status: 429, RetryAfter: retryAfter, Times: 1}}})
	defer srv.Close()
	p := newServerPipeline(t, 2, subscriber.Config{}, srv, time.Second)
	works := []job.Work{chatWork("a", 0, 2, "hello", "there"), chatWork("a", 1, 2, "again")}
	p.send(works)

	wait.For(t, 30*time.Second, "backoff", func() bool {
		return promsum.Labelled(t, p.reg, "vramq_subscriber_messages_backed_off_total", "reason", "overloaded") > 0
	})
	until := time.UnixMilli(int64(promsum.Sum(t, p.reg, "vramq_subscriber_receive_paused_until_seconds") * 1e3))
	if d := time.Until(until); d < retryAfter/2 || d > retryAfter+time.Second {
		t.Fatalf("receiving paused until %v from now; want about the Retry-After, %v", d, retryAfter)
	}
	// A receive in flight when the backoff came (a 1 s long poll) may
	// still answer; none may start after it until the pause ends.
	time.Sleep(2 * time.Second)
	before := p.receives()
	time.Sleep(time.Until(until) - time.Second)
	if after := p.receives(); after != before {
		t.Errorf("%v receives while paused; want none", after-before)
	}

	c := p.collect(len(works), time.Minute)
	for k, r := range c.Results {
		for _, o := range r.Outputs {
			if o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 {
				t.Errorf("%v item %s: %+v; want the server's answer", k, o.ID, o)
			}
		}
	}
	if d := p.deadLetters(); len(d) != 0 {
		t.Errorf("%d dead letters: %+v", len(d), d)
	}
	if st := srv.Stats(); st.Faults[fakeoai.FaultStatus] != 1 {
		t.Errorf("faults injected: %v; want the one 429", st.Faults)
	}
	p.shutdown()
}

// A server that asks to wait (a 429 whose Retry-After is past the backend's
// wait), then answers insufficient_quota, then is healthy again, with the
// queue's redrive at two receives: the subscriber holds its messages through
// both (none visible, nothing received meanwhile), reports the spent quota
// while it lasts, and resumes by itself once a probe gets through: every
// chunk completes once, none is dead-lettered. (TestWaitsNeverCostAReceive
// runs the same for 6 + 6 hours in virtual time.)
func TestE2EModelServerWaitsThenQuotaThenResumes(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	srv := fakeoai.New(fakeoai.Config{Faults: []fakeoai.Fault{
		{Kind: fakeoai.FaultStatus, Status: 429, RetryAfter: 2 * time.Second}}})
	defer srv.Close()
	p := newServerPipeline(t, 2, subscriber.Config{OperatorProbe: time.Second}, srv, time.Second)
	works := []job.Work{chatWork("q", 0, 3, "one"), chatWork("q", 1, 3, "two"), chatWork("q", 2, 3, "three")}
	p.send(works)

	wait.For(t, 30*time.Second, "backoff", func() bool {
		return promsum.Sum(t, p.reg, "vramq_subscriber_messages_backed_off_total") > 0
	})
	time.Sleep(5 * time.Second) // two Retry-Afters: asked again, told to wait again

	if err := srv.SetFaults(); err != nil {
		t.Fatal(err)
	}
	srv.SetQuotaExhausted(true)
	wait.For(t, time.Minute, "the spent quota reported", func() bool { return p.sub.Healthy() != nil })
	if err := p.sub.Healthy(); !strings.Contains(err.Error(), "insufficient_quota") {
		t.Errorf("Healthy: %v; want the reason, insufficient_quota", err)
	}
	if got := promsum.Sum(t, p.reg, "vramq_subscriber_needs_operator"); got != 1 {
		t.Errorf("needs_operator %v; want 1", got)
	}
	// Held, not handed back: a receive would count towards the redrive.
	visible, inflight, err := jobq.Counts(t.Context(), p.client, p.urls.Work)
	if err != nil || visible != 0 || inflight != len(works) {
		t.Errorf("work queue: %d visible, %d in flight (%v); want all %d held", visible, inflight, err, len(works))
	}
	before := p.receives()
	time.Sleep(3 * time.Second) // three of the 1 s long polls it would make
	if after := p.receives(); after != before {
		t.Errorf("%v receives while the quota is spent; want none", after-before)
	}

	srv.SetQuotaExhausted(false)
	c := p.collect(len(works), 2*time.Minute)
	for k, r := range c.Results {
		for _, o := range r.Outputs {
			if o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 {
				t.Errorf("%v item %s: %+v; want the server's answer", k, o.ID, o)
			}
		}
		if r.Attempt != 1 {
			t.Errorf("%v: attempt %d; want 1, every wait held on the first receive", k, r.Attempt)
		}
	}
	if c.Duplicates != 0 {
		t.Errorf("%d duplicate results", c.Duplicates)
	}
	if err := p.sub.Healthy(); err != nil {
		t.Errorf("Healthy after the quota came back: %v", err)
	}
	if got := promsum.Sum(t, p.reg, "vramq_subscriber_needs_operator"); got != 0 {
		t.Errorf("needs_operator %v after a probe got through; want 0", got)
	}
	p.shutdown()
	if d := p.deadLetters(); len(d) != 0 {
		t.Errorf("%d dead letters: %+v", len(d), d)
	}
}

// A queue of an endpoint job of chat completions, one of embeddings and a
// text job, sent together to gather into batches: each message reaches the
// model with its own endpoint (a batch never mixes them), so each is
// answered as its endpoint defines; the text job's item, on a subscriber
// with no in-process model, is refused as an item of its result.
func TestE2EModelServerMixedQueue(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	srv := fakeoai.New(fakeoai.Config{})
	defer srv.Close()
	p := newServerPipeline(t, 2, subscriber.Config{MaxBatchDelay: 500 * time.Millisecond}, srv, time.Second)
	emb := job.Work{V: job.Version, JobID: "emb", Chunk: 0, Chunks: 1, Endpoint: job.EndpointEmbeddings,
		Items: []job.Item{{ID: "e0", Body: json.RawMessage(`{"model":"fake-model","input":"a passage"}`)}}}
	text := job.Work{V: job.Version, JobID: "text", Chunk: 0, Chunks: 1, Items: []job.Item{{ID: "t0", Text: "plain text"}}}
	works := []job.Work{chatWork("chat", 0, 1, "hello", "there"), emb, text}
	p.send(works)
	c := p.collect(len(works), time.Minute)
	for k, r := range c.Results {
		for _, o := range r.Outputs {
			switch k.JobID {
			case "chat":
				if o.Error != nil || o.Response == nil || !strings.Contains(string(o.Response.Body), `"object":"chat.completion"`) {
					t.Errorf("chat item %s: %+v; want a chat.completion", o.ID, o)
				}
			case "emb":
				if o.Error != nil || o.Response == nil || !strings.Contains(string(o.Response.Body), `"object":"list"`) {
					t.Errorf("embeddings item %s: %+v; want an embeddings list", o.ID, o)
				}
			default:
				if o.Error == nil || o.Error.Code != job.ItemInvalidInput {
					t.Errorf("text item %s: %+v; want invalid_input (no request body)", o.ID, o)
				}
			}
		}
	}
	if d := p.deadLetters(); len(d) != 0 {
		t.Errorf("%d dead letters: %+v", len(d), d)
	}
	p.shutdown()
}

// An in-process model serves a job of /v1/embeddings requests: each item's
// inputs are embedded as a text job's items would be, and its output is the
// body OpenAI's embeddings endpoint returns (the SDK's own type parses it),
// base64 when asked; token-id inputs are the item's error. Chat requests
// stay unsupported_endpoint. Nothing is dead-lettered.
func TestE2EInProcessModelServesEmbeddings(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	if endpoint() == "" {
		t.Skip("no SQS endpoint: set AWS_ENDPOINT_URL (make test starts the emulator and sets it)")
	}
	p := newPipeline(t, 2, subscriber.Config{MaxBatchDelay: 500 * time.Millisecond}, nil)
	texts := []string{"plain text", "a second sentence of words", "third"}
	text := job.Work{V: job.Version, JobID: "text", Chunk: 0, Chunks: 1}
	textOf := map[string]string{} // item ID -> its text
	for i, s := range texts {
		id := fmt.Sprintf("t%d", i)
		textOf[id] = s
		text.Items = append(text.Items, job.Item{ID: id, Text: s})
	}
	emb := job.Work{V: job.Version, JobID: "emb", Chunk: 0, Chunks: 1, Endpoint: job.EndpointEmbeddings, Items: []job.Item{
		{ID: "one", Body: json.RawMessage(`{"model":"m-one","input":"plain text"}`)},
		{ID: "many", Body: json.RawMessage(`{"model":"m-many","input":["plain text","a second sentence of words","third"],"encoding_format":"float"}`)},
		{ID: "b64", Body: json.RawMessage(`{"model":"m-b64","input":["third"],"encoding_format":"base64"}`)},
		{ID: "ids", Body: json.RawMessage(`{"model":"m-ids","input":[[1,2,3]]}`)},
	}}
	works := []job.Work{chatWork("chat", 0, 1, "hello", "there"), text, emb}
	p.send(works)
	c := p.collect(len(works), time.Minute)
	want := map[string][]float32{} // text -> its embedding as a text job's item
	outs := map[string]job.Output{}
	for k, r := range c.Results {
		for _, o := range r.Outputs {
			switch k.JobID {
			case "chat":
				if o.Error == nil || o.Error.Code != job.ItemUnsupportedEndpoint {
					t.Errorf("chat item %s: %+v; want unsupported_endpoint", o.ID, o)
				}
			case "text":
				if o.Error != nil || len(o.Embedding) == 0 {
					t.Fatalf("text item %s: %+v; want its embedding", o.ID, o)
				}
				want[textOf[o.ID]] = o.Embedding
			case "emb":
				outs[o.ID] = o
			}
		}
	}
	if len(outs) != len(emb.Items) {
		t.Fatalf("embeddings job: %d outputs; want %d", len(outs), len(emb.Items))
	}
	if o := outs["ids"]; o.Error == nil || o.Error.Code != job.ItemInvalidInput || o.Response != nil {
		t.Errorf("token-id input: %+v; want an invalid_input item error", o)
	}
	for _, tc := range []struct {
		id, model string
		inputs    []string
	}{{"one", "m-one", texts[:1]}, {"many", "m-many", texts}, {"b64", "m-b64", texts[2:]}} {
		o := outs[tc.id]
		if o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 {
			t.Errorf("item %s: %+v; want a 200 response", tc.id, o)
			continue
		}
		var got []float32
		if tc.id == "b64" {
			var raw struct {
				Data []struct {
					Embedding string `json:"embedding"`
				} `json:"data"`
			}
			if err := json.Unmarshal(o.Response.Body, &raw); err != nil || len(raw.Data) != 1 {
				t.Errorf("item b64: body %s: %v", o.Response.Body, err)
				continue
			}
			b, err := base64.StdEncoding.DecodeString(raw.Data[0].Embedding)
			if err != nil || len(b)%4 != 0 {
				t.Errorf("item b64: embedding %q is not base64 float32s: %v", raw.Data[0].Embedding, err)
				continue
			}
			for i := 0; i < len(b); i += 4 {
				got = append(got, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
			}
			if d := cmp.Diff(want[tc.inputs[0]], got); d != "" {
				t.Errorf("item b64: embedding differs from the text job's (-want +got):\n%s", d)
			}
			continue
		}
		// The fields of OpenAI's embeddings response the test reads:
		// https://platform.openai.com/docs/api-reference/embeddings/object
		var resp struct {
			Object string `json:"object"`
			Model  string `json:"model"`
			Data   []struct {
				Object    string    `json:"object"`
				Index     int64     `json:"index"`
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
			Usage struct {
				PromptTokens int64 `json:"prompt_tokens"`
				TotalTokens  int64 `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(o.Response.Body, &resp); err != nil {
			t.Errorf("item %s: body %s: %v", tc.id, o.Response.Body, err)
			continue
		}
		if resp.Object != "list" || resp.Model != tc.model || len(resp.Data) != len(tc.inputs) {
			t.Errorf("item %s: body %s; want a list of %d for model %s", tc.id, o.Response.Body, len(tc.inputs), tc.model)
			continue
		}
		tokens := 0
		for k, d := range resp.Data {
			tokens += len(strings.Fields(tc.inputs[k])) // the reference model's token is a word
			if d.Object != "embedding" || d.Index != int64(k) {
				t.Errorf("item %s data %d: object %q index %d", tc.id, k, d.Object, d.Index)
			}
			got := make([]float32, len(d.Embedding))
			for i, f := range d.Embedding {
				got[i] = float32(f)
			}
			if dd := cmp.Diff(want[tc.inputs[k]], got); dd != "" {
				t.Errorf("item %s data %d: embedding differs from the text job's (-want +got):\n%s", tc.id, k, dd)
			}
		}
		if resp.Usage.PromptTokens != int64(tokens) || resp.Usage.TotalTokens != int64(tokens) {
			t.Errorf("item %s: usage %+v; want %d prompt and total tokens", tc.id, resp.Usage, tokens)
		}
	}
	if d := p.deadLetters(); len(d) != 0 {
		t.Errorf("%d dead letters: %+v", len(d), d)
	}
	p.shutdown()
}

// A batch that meets a backoff partway keeps what it finished: the chunks
// whose requests were answered before the 429 get their results then, and
// only the others wait, holding their leases, until the server's time. No
// request answered 200 is sent again. One request at a time makes the count
// exact: three answered, the fourth refused with a wait past the backend's,
// five waiting and sent once each after it.
func TestE2EModelServerBackoffKeepsFinishedChunks(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	const retryAfter = 6 * time.Second
	fake := fakeoai.New(fakeoai.Config{Faults: []fakeoai.Fault{
		{Kind: fakeoai.FaultStatus, Status: 429, RetryAfter: retryAfter, Skip: 3, Times: 1}}})
	defer fake.Close()
	rec := fakeoai.NewRecorder(t, fake)
	if endpoint() == "" {
		t.Skip("no SQS endpoint: set AWS_ENDPOINT_URL (make test starts the emulator and sets it)")
	}
	// A batch delay long enough for the eight messages to gather into one
	// batch.
	p := newPipelineOn(t, 3, subscriber.Config{MaxBatchDelay: 2 * time.Second}, nil, func(*gpu.Sim) backend.Backend {
		m, err := modelserver.Open(t.Context(), modelserver.Config{BaseURL: rec.URL(), Models: []string{"fake-model"},
			MaxWait: time.Second, MaxConcurrency: 1, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	})
	const chunks = 8
	var works []job.Work
	for i := range chunks {
		works = append(works, chatWork("k", i, chunks, fmt.Sprintf("item %d", i)))
	}
	p.send(works)
	c := p.collect(chunks, time.Minute)

	for k, r := range c.Results {
		for _, o := range r.Outputs {
			if o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 {
				t.Errorf("%v item %s: %+v; want the server's answer", k, o.ID, o)
			}
		}
	}
	if c.Duplicates != 0 {
		t.Errorf("%d duplicate results", c.Duplicates)
	}
	answers := rec.Answers()
	refused := 0
	for i := range chunks {
		text := fmt.Sprintf("item %d", i)
		oks := 0
		for _, st := range answers[text] {
			switch st {
			case 200:
				oks++
			case 429:
				refused++
			}
		}
		if oks != 1 {
			t.Errorf("%q answered 200 %d times (answers %v); want once", text, oks, answers[text])
		}
	}
	if refused != 1 {
		t.Errorf("%d requests refused 429; want the one fault", refused)
	}
	if st := fake.Stats(); st.Requests != chunks+1 {
		t.Errorf("%d requests reached the server; want %d, one per item and the one refused", st.Requests, chunks+1)
	}
	// The batch held all eight: three finished, five handed back.
	if got := promsum.Sum(t, p.reg, "vramq_subscriber_messages_backed_off_total"); got != chunks-3 {
		t.Errorf("%v messages handed back until the server's time; want %d", got, chunks-3)
	}
	if d := p.deadLetters(); len(d) != 0 {
		t.Errorf("%d dead letters: %+v", len(d), d)
	}
	p.shutdown()
}

// partialModel runs its first batch, then says that a backoff came after
// only the items done marks finished (fault.PartialError); later batches run.
type partialModel struct {
	gpu.Model
	once  sync.Once
	done  func(n int) []bool
	until time.Time
}

func (m *partialModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	outs, err := m.Model.Run(ctx, items)
	if err != nil {
		return nil, err
	}
	var perr error
	m.once.Do(func() {
		perr = &fault.PartialError[job.Output]{Err: &fault.BackoffError{Until: m.until, Reason: "429 test"}, Outputs: outs, Done: m.done(len(items))}
	})
	if perr != nil {
		return nil, perr
	}
	return outs, nil
}

// A message's result is written whole: of a batch of two chunks of two
// items that a backoff cut after three items finished, the first chunk's
// result is sent from that batch, and the second, one item short, waits,
// holding its lease and its answered item, and its other item runs after the
// backoff: both on their first receive, each with both outputs.
func TestE2EBackoffKeepsWholeChunksOnly(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	until := time.Now().Add(3 * time.Second)
	pm := &partialModel{until: until, done: func(n int) []bool {
		d := make([]bool, n)
		for i := range min(n, 3) {
			d[i] = true
		}
		return d
	}}
	p := newPipeline(t, 3, subscriber.Config{MaxBatchDelay: 2 * time.Second}, func(m gpu.Model) gpu.Model {
		pm.Model = m
		return pm
	})
	works := []job.Work{
		{V: job.Version, JobID: "w", Chunk: 0, Chunks: 2, Items: []job.Item{{ID: "a", Text: "one"}, {ID: "b", Text: "two"}}},
		{V: job.Version, JobID: "w", Chunk: 1, Chunks: 2, Items: []job.Item{{ID: "c", Text: "three"}, {ID: "d", Text: "four"}}},
	}
	p.send(works)
	c := p.collect(len(works), time.Minute)
	for chunk, want := range []int{1, 1} {
		r := c.Results[job.Key{JobID: "w", Chunk: chunk}]
		if r.Attempt != want || len(r.Outputs) != 2 || r.ItemsFailed != 0 {
			t.Errorf("chunk %d: attempt %d, %d outputs, %d failed; want attempt %d, 2 outputs, none failed",
				chunk, r.Attempt, len(r.Outputs), r.ItemsFailed, want)
		}
	}
	if got := promsum.Sum(t, p.reg, "vramq_subscriber_messages_backed_off_total"); got != 1 {
		t.Errorf("%v messages waiting for the backoff's end; want 1", got)
	}
	if c.Duplicates != 0 {
		t.Errorf("%d duplicate results", c.Duplicates)
	}
	if d := p.deadLetters(); len(d) != 0 {
		t.Errorf("%d dead letters: %+v", len(d), d)
	}
	p.shutdown()
}
