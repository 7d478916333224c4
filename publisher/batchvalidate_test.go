package publisher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
)

// gateQueue is a queue whose sends of the first job it is sent, from chunk
// from on, wait for open to be closed; reached is closed at the first that
// waits. Other jobs' sends go through.
type gateQueue struct {
	jobs.Queue
	from    int
	open    chan struct{}
	reached chan struct{}
	mu      sync.Mutex
	job     string
	once    sync.Once
}

func (q *gateQueue) SendBatch(ctx context.Context, entries []jobs.Entry) ([]error, error) {
	q.mu.Lock()
	if q.job == "" {
		q.job = entries[0].JobID
	}
	gated := entries[0].JobID == q.job
	q.mu.Unlock()
	for _, e := range entries {
		if gated && e.Chunk >= q.from {
			q.once.Do(func() { close(q.reached) })
			<-q.open
			break
		}
	}
	return q.Queue.SendBatch(ctx, entries)
}

// Issue 32, item 5: a validator that stops halfway through sending a batch
// (standing in for a publisher that died: its sends hang) loses nothing and
// makes nothing twice. Its claim is on the record; another publisher's
// sweep, once the claim is stale, cancels the job and fails the batch; and
// when the first validator wakes, its conditional write is refused: the
// batch stays failed, and its job cancelled.
func TestBatchValidatorStoppedMidSendFailsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	store, _ := condStore(t, e)
	gate := &gateQueue{from: 40, open: make(chan struct{}), reached: make(chan struct{})}
	first := e.serveUnswept(publisher.Config{Payloads: store, Queue: gate, Jobs: publisher.Jobs{ChunkItems: 1}})
	gate.Queue = jobs.NewSQSQueue(e.client, e.urls.Work)
	other := e.serveUnswept(publisher.Config{Payloads: store, Jobs: publisher.Jobs{ChunkItems: 1}})
	c := first.client("")
	bt, err := c.createBatch(t.Context(), batchParams{InputFileID: upload(t, c, "stopped.jsonl", embeddingLines(100)).ID,
		Endpoint: "/v1/embeddings", CompletionWindow: "24h"})
	if err != nil || bt.Status != "validating" {
		t.Fatalf("create: %v %s", apiError(err), bt.RawJSON())
	}
	swept := make(chan error, 1)
	go func() { swept <- first.pub.Sweep(context.Background()) }()
	<-gate.reached

	rec := record(t, e, bt.ID)
	if rec["status"] != "validating" || rec["validating_at"] == nil {
		t.Fatalf("mid-send the record is %v; want validating, claimed", rec)
	}
	// Another publisher's sweep while the claim is fresh leaves it.
	if err := other.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := record(t, e, bt.ID)["status"]; st != "validating" {
		t.Fatalf("a sweep during a fresh claim made the batch %v", st)
	}
	// The claim as a validator that died 11 minutes ago left it.
	rec["validating_at"] = time.Now().Add(-11 * time.Minute).Unix()
	raw, _ := json.Marshal(rec)
	if _, err := e.store.Put(t.Context(), job.BatchKey("", bt.ID), raw); err != nil {
		t.Fatal(err)
	}
	if err := other.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	close(gate.open)
	if err := <-swept; err != nil {
		t.Fatal(err)
	}

	b, err := c.getBatch(t.Context(), bt.ID)
	if err != nil || b.Status != "failed" || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != "enqueue_interrupted" {
		t.Fatalf("after both: %v %s; want failed, enqueue_interrupted", apiError(err), b.RawJSON())
	}
	if _, err := e.store.Read(t.Context(), job.CancelKey(bt.ID)); err != nil {
		t.Errorf("the job's cancel record: %v; want what was sent cancelled", err)
	}
}

// Issue 35, item 1: a batch may name any endpoint of OpenAI's Batch API.
// One the subscribers do not run (/v1/responses, /v1/moderations) is taken
// at create and refused at validation, every line named; one they run
// validates, and the batch reports its model, as OpenAI's Batch does.
func TestBatchEndpointsOfOpenAI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	c := s.client("")
	for _, ep := range []string{"/v1/responses", "/v1/moderations"} {
		in := requestLines(3, string(ep), `{"model":"ref","input":"x"}`)
		bt := newBatch(t, c, upload(t, c, "other.jsonl", in).ID, ep)
		if bt.Status != "failed" || len(bt.Errors.Data) != 3 {
			t.Fatalf("a batch for %s: %s; want failed, its 3 lines named", ep, bt.RawJSON())
		}
		for i, d := range bt.Errors.Data {
			if d.Code != "endpoint_not_served" || d.Line != int64(i+1) || d.Param != "url" {
				t.Errorf("%s, error %d: %+v", ep, i, d)
			}
		}
	}
	bt := newBatch(t, c, upload(t, c, "embed.jsonl", embeddingLines(2)).ID, "/v1/embeddings")
	if bt.Status != "in_progress" || bt.Model != "ref" {
		t.Errorf("an embeddings batch: %s; want in_progress, model ref", bt.RawJSON())
	}
	if q := e.queued(); q != 1 {
		t.Errorf("%d messages on the queue; want the embeddings batch's one", q)
	}
}

// OpenAI takes at most 50,000 embedding inputs in a batch, across its
// requests: 25 lines of 2,000 inputs validate, 26 fail the batch.
func TestBatchEmbeddingInputsBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	c := s.client("")
	inputs := `["x"` + strings.Repeat(`,"x"`, 1999) + `]`
	body := `{"model":"ref","input":` + inputs + `}`
	if bt := newBatch(t, c, upload(t, c, "at.jsonl", requestLines(25, "/v1/embeddings", body)).ID, "/v1/embeddings"); bt.Status != "in_progress" {
		t.Errorf("50,000 inputs: %s; want in_progress", bt.RawJSON())
	}
	bt := newBatch(t, c, upload(t, c, "over.jsonl", requestLines(26, "/v1/embeddings", body)).ID, "/v1/embeddings")
	if bt.Status != "failed" || len(bt.Errors.Data) != 1 || bt.Errors.Data[0].Code != "too_many_embedding_inputs" {
		t.Errorf("52,000 inputs: %s; want failed, too_many_embedding_inputs", bt.RawJSON())
	}
}

// requestLines is a batch input file of n requests for url, each with body.
func requestLines(n int, url, body string) []byte {
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"r-%d","method":"POST","url":%q,"body":%s}`+"\n", i, url, body)
	}
	return []byte(in.String())
}

// A batch being validated holds no other back: while one batch's validation
// waits on the queue (its sends held), another batch created after it is
// validated and in_progress; then the first is too. Before, the sweeper
// advanced nudged batches one at a time, in the loop that also ran its
// passes, so the second waited for the first's whole file.
func TestBatchValidationHoldsNoOtherBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	gate := &gateQueue{from: 0, open: make(chan struct{}), reached: make(chan struct{}),
		Queue: jobs.NewSQSQueue(e.client, e.urls.Work)}
	s := e.serve(publisher.Config{Queue: gate})
	// Before the sweeper is stopped, so that a failing test ends.
	var release sync.Once
	open := func() { release.Do(func() { close(gate.open) }) }
	t.Cleanup(open)
	c := s.client("")
	first, err := c.createBatch(t.Context(), batchParams{InputFileID: upload(t, c, "held.jsonl", embeddingLines(3)).ID,
		Endpoint: "/v1/embeddings", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(apiError(err))
	}
	<-gate.reached
	if b := newBatch(t, c, upload(t, c, "next.jsonl", embeddingLines(3)).ID, "/v1/embeddings"); b.Status != "in_progress" {
		t.Errorf("the second batch: %s; want in_progress", b.RawJSON())
	}
	if b, err := c.getBatch(t.Context(), first.ID); err != nil || b.Status != "validating" {
		t.Errorf("the held batch: %v %s; want still validating", err, b.RawJSON())
	}
	open()
	waitBatch(t, c, first.ID, time.Minute, "in_progress")
}
