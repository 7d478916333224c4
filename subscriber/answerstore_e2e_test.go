package subscriber_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/promsum"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/subscriber"
)

// End-to-end tests of the answer store (answers.go): a subscriber that
// stops with some of a chunk's items answered hands the chunk back, and the
// next subscriber, another process with its own backend, asks the model
// server only for the items that had no answer. The fake's Recorder counts
// the answers each item got.

// serverModel opens a model-server backend on url: each subscriber process
// has its own.
func serverModel(t *testing.T, url string, cfg modelserver.Config) *modelserver.Model {
	t.Helper()
	cfg.BaseURL, cfg.Models, cfg.Logger = url, []string{"fake-model"}, slog.New(slog.DiscardHandler)
	m, err := modelserver.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// successor starts another subscriber on p's queues, as a process that takes
// over after p's stopped (a restart, a scale-out), with model and cfg.
func (p *pipeline) successor(cfg subscriber.Config, model backend.Backend) *pipeline {
	p.t.Helper()
	q := &pipeline{t: p.t, client: p.client, receiveRetries: p.receiveRetries, urls: p.urls, dev: p.dev, model: model,
		reg: prometheus.NewRegistry()}
	q.start(cfg, p.client)
	return q
}

// answerServer is a fake model server with cfg, its Recorder, and a payload
// bucket on the endpoint under test, for the answer store's tests.
func answerServer(t *testing.T, cfg fakeoai.Config) (*fakeoai.Server, *fakeoai.Recorder, *payload.Store) {
	t.Helper()
	fake := fakeoai.New(cfg)
	t.Cleanup(fake.Close)
	rec := fakeoai.NewRecorder(t, fake)
	if endpoint() == "" {
		t.Skip("no SQS endpoint: set AWS_ENDPOINT_URL (make test starts the emulator and sets it)")
	}
	return fake, rec, newStore(t)
}

// stopped stops p's subscriber, as a SIGTERM does, and waits for it.
func (p *pipeline) stopped() {
	p.t.Helper()
	p.stop()
	<-p.done
	if p.runErr != nil {
		p.t.Fatalf("Run: %v", p.runErr)
	}
}

// longChat is a chunk of chat items whose i-th asks for lens[i] output
// tokens of the fake ([[len=N]]).
func longChat(jobID string, lens ...int) job.Work {
	w := job.Work{V: job.Version, JobID: jobID, Chunks: 1, Endpoint: job.EndpointChatCompletions}
	for i, n := range lens {
		w.Items = append(w.Items, job.Item{ID: fmt.Sprintf("%s-%d", jobID, i), Body: json.RawMessage(fmt.Sprintf(
			`{"model":"fake-model","messages":[{"role":"user","content":"item %d [[len=%d]]"}],"max_tokens":%d}`, i, n, n+8))})
	}
	return w
}

// answeredOnce checks that each of w's items got exactly one answer 200 at
// the fake, and that the result holds every item's answer.
func answeredOnce(t *testing.T, rec *fakeoai.Recorder, w job.Work, r job.Result) {
	t.Helper()
	answers := rec.Answers()
	twice := 0
	for i := range w.Items {
		var lens struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		if err := json.Unmarshal(w.Items[i].Body, &lens); err != nil {
			t.Fatal(err)
		}
		text := lens.Messages[0].Content
		oks := 0
		for _, st := range answers[text] {
			if st == 200 {
				oks++
			}
		}
		if oks > 1 {
			twice++
		}
		if oks != 1 {
			t.Errorf("%q answered 200 %d times (answers %v); want once", text, oks, answers[text])
		}
	}
	if twice > 0 {
		t.Errorf("%d of %d items answered twice", twice, len(w.Items))
	}
	if len(r.Outputs) != len(w.Items) {
		t.Fatalf("result of %d outputs for %d items", len(r.Outputs), len(w.Items))
	}
	for i, o := range r.Outputs {
		if o.ID != w.Items[i].ID || o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 {
			t.Errorf("output %d: %+v; want item %s's answer", i, o, w.Items[i].ID)
		}
	}
}

// An overload late in a batch (TGI's 429 "Model is overloaded", no wait
// named, after four of eight requests were answered) holds the chunk in the
// subscriber, waiting for the server; a SIGTERM then hands it back, and the
// subscriber that takes it over asks only for the four items without an
// answer: no item is answered twice.
func TestE2EOverloadLateInBatchAsksNoAnswerTwice(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	const answered = 4
	fake, rec, store := answerServer(t, fakeoai.Config{Faults: []fakeoai.Fault{
		{Kind: fakeoai.FaultStatus, Status: 429, Skip: answered}}}) // every request after the fourth, until cleared
	// One request at a time makes the count exact; a wait of 0.5 s makes
	// the overload's own (a second or more) a backoff of the batch.
	msCfg := modelserver.Config{MaxWait: 500 * time.Millisecond, MaxConcurrency: 1}
	p := newPipelineOn(t, 5, subscriber.Config{Payloads: store}, nil, func(*gpu.Sim) backend.Backend {
		return serverModel(t, rec.URL(), msCfg)
	})
	w := longChat("ovl", 1, 1, 1, 1, 1, 1, 1, 1)
	p.send([]job.Work{w})
	wait.For(t, 30*time.Second, "the backoff", func() bool {
		return promsum.Sum(t, p.reg, "vramq_subscriber_messages_backed_off_total") > 0
	})
	if got := promsum.Sum(t, p.reg, "vramq_subscriber_answers_stored_total"); got != answered {
		t.Errorf("%v answers stored before the backoff; want %d", got, answered)
	}
	p.stopped()
	fake.SetFaults()

	q := p.successor(subscriber.Config{Payloads: store}, serverModel(t, rec.URL(), msCfg))
	c := q.collect(1, time.Minute)
	answeredOnce(t, rec, w, c.Results[job.Key{JobID: "ovl", Chunk: 0}])
	if got := promsum.Sum(t, q.reg, "vramq_subscriber_answers_recalled_total"); got != answered {
		t.Errorf("%v answers read back by the successor; want %d", got, answered)
	}
	q.shutdown()
	if keys, err := store.List(t.Context(), "answers/"); err != nil || len(keys) != 0 {
		t.Errorf("answers left in the bucket after the result went out: %v (%v)", keys, err)
	}
}

// A SIGTERM while a batch runs: some of its items are answered, two are
// still generating when the shutdown's grace ends and the batch is cut off.
// The chunk goes back to the queue, and the subscriber that takes it asks
// only for the items without an answer.
func TestE2ESigtermMidBatchAsksNoAnswerTwice(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	_, rec, store := answerServer(t, fakeoai.Config{TokenLatency: 10 * time.Millisecond})
	// Two requests at a time, each 1 s (100 steps of 10 ms): whenever the
	// SIGTERM comes, two are generating, and a grace of 0.3 s cuts them off.
	msCfg := modelserver.Config{MaxWait: 30 * time.Second, MaxConcurrency: 2}
	cfg := subscriber.Config{Payloads: store, ShutdownGrace: 300 * time.Millisecond}
	p := newPipelineOn(t, 5, cfg, nil, func(*gpu.Sim) backend.Backend { return serverModel(t, rec.URL(), msCfg) })
	w := longChat("sig", 100, 100, 100, 100, 100, 100, 100, 100)
	p.send([]job.Work{w})
	wait.For(t, 30*time.Second, "two answers", func() bool {
		return promsum.Sum(t, p.reg, "vramq_subscriber_answers_stored_total") >= 2
	})
	p.stopped()
	if got := promsum.Labelled(t, p.reg, "vramq_subscriber_messages_handed_back_total", "reason", "shutdown"); got != 1 {
		t.Fatalf("%v messages handed back at shutdown; want the one cut off", got)
	}
	stored := promsum.Sum(t, p.reg, "vramq_subscriber_answers_stored_total")
	if stored >= float64(len(w.Items)) {
		t.Fatalf("all %v items answered before the shutdown: nothing was cut off", stored)
	}

	q := p.successor(cfg, serverModel(t, rec.URL(), msCfg))
	c := q.collect(1, time.Minute)
	answeredOnce(t, rec, w, c.Results[job.Key{JobID: "sig", Chunk: 0}])
	if got := promsum.Sum(t, q.reg, "vramq_subscriber_answers_recalled_total"); got != stored {
		t.Errorf("%v answers read back by the successor; want the %v stored", got, stored)
	}
	q.shutdown()
}

// A model server's message over an eighth of the budget runs in parts; a
// backoff in its third part (after four answers) holds it in the
// subscriber, and when it runs again from its first part, the parts
// answered before are not asked again, nor the items of the third that
// were: every item answered once.
func TestE2EBackoffInPartsAsksNoAnswerTwice(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	const answered = 4
	_, rec, _ := answerServer(t, fakeoai.Config{Faults: []fakeoai.Fault{
		{Kind: fakeoai.FaultStatus, Status: 429, RetryAfter: 2 * time.Second, Skip: answered, Times: 1}}})
	msCfg := modelserver.Config{MaxWait: 500 * time.Millisecond, MaxConcurrency: 1}
	w := longChat("parts", 1, 1, 1, 1, 1, 1, 1, 1)
	// A budget of twice the message: parts of an eighth of it are two items.
	limit := 2 * serverModel(t, rec.URL(), msCfg).Cost("", w.Items)
	p := newPipelineOn(t, 5, subscriber.Config{VRAMLimit: limit}, nil, func(*gpu.Sim) backend.Backend {
		return serverModel(t, rec.URL(), msCfg)
	})
	p.send([]job.Work{w})
	c := p.collect(1, time.Minute)
	answeredOnce(t, rec, w, c.Results[job.Key{JobID: "parts", Chunk: 0}])
	if got := promsum.Sum(t, p.reg, "vramq_subscriber_messages_backed_off_total"); got != 1 {
		t.Errorf("%v messages backed off; want the one", got)
	}
	p.shutdown()
}
