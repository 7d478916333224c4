package subscriber_test

// End-to-end tests: the subscriber, the reference model on a simulated device,
// and the real SQS API of whatever AWS_ENDPOINT_URL points at. Each test makes
// its own queues.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/promsum"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

// budget is the working memory of the test device: room for one large
// message of the workload (about 16.3 MiB) and many small ones, not two
// large ones.
const budget = 30 << 20

type pipeline struct {
	t      *testing.T
	client *sqs.Client
	// receives the SDK retried; each may strand up to 10 messages in flight
	receiveRetries *atomic.Int64
	urls           localstack.URLs
	dev            *gpu.Sim
	model          backend.Backend
	sub            *subscriber.Subscriber
	reg            *prometheus.Registry
	stop           context.CancelFunc
	done           chan struct{} // closed when Run returns, with its error in runErr
	runErr         error
}

// slowModel makes every batch take at least d, as a bigger model on a real
// device would.
type slowModel struct {
	gpu.Model
	d func(items []job.Item) time.Duration
}

func (m slowModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	select {
	case <-time.After(m.d(items)):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return m.Model.Run(ctx, items)
}

func newPipeline(t *testing.T, maxReceive int, cfg subscriber.Config, wrap func(gpu.Model) gpu.Model) *pipeline {
	t.Helper()
	return newPipelineVia(t, maxReceive, cfg, wrap, nil)
}

// newPipelineVia is newPipeline with the subscriber's queues reached through
// via (a client of a fault-injecting proxy, say) when it is not nil; the
// pipeline's own calls (sending work, collecting, counting) go straight to
// the endpoint.
func newPipelineVia(t *testing.T, maxReceive int, cfg subscriber.Config, wrap func(gpu.Model) gpu.Model, via *sqs.Client) *pipeline {
	t.Helper()
	return newPipelineWith(t, maxReceive, cfg, via, func(dev *gpu.Sim) gpu.Model {
		emb, err := refembed.NewEmbedder(refembed.GenerateWeights(refembed.DefaultConfig()), refembed.DefaultConfig(), dev)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = emb.Close() })
		if wrap != nil {
			return wrap(emb)
		}
		return emb
	})
}

// newPipelineWith is newPipelineVia with the model that load makes on the
// pipeline's simulated device (of the reference model's weights plus the
// budget and the reserve).
func newPipelineWith(t *testing.T, maxReceive int, cfg subscriber.Config, via *sqs.Client, load func(*gpu.Sim) gpu.Model) *pipeline {
	t.Helper()
	return newPipelineOn(t, maxReceive, cfg, via, func(dev *gpu.Sim) backend.Backend { return backend.InProcess{Model: load(dev)} })
}

// newPipelineOn is newPipelineWith with the backend that load makes.
func newPipelineOn(t *testing.T, maxReceive int, cfg subscriber.Config, via *sqs.Client, load func(*gpu.Sim) backend.Backend) *pipeline {
	t.Helper()
	client, retries := sqstest.CountingClient(t)
	p := &pipeline{t: t, client: client, receiveRetries: retries, reg: prometheus.NewRegistry()}
	p.urls = sqstest.Queues(t, p.client, maxReceive)
	p.dev = gpu.NewSim(refembed.DefaultConfig().WeightBytes() + budget + 1<<20)
	p.model = load(p.dev)
	if via == nil {
		via = p.client
	}
	p.start(cfg, via)
	return p
}

// start runs a subscriber with cfg on p's queues, reached through via, its
// model p.model on p.dev, until the test ends.
func (p *pipeline) start(cfg subscriber.Config, via *sqs.Client) {
	t := p.t
	t.Helper()
	cfg.Queue = sqsqueue.New(via, p.urls.Work)
	cfg.Results = sqsqueue.New(via, p.urls.Results)
	cfg.DLQ = sqsqueue.New(via, p.urls.DLQ)
	cfg.Backend, cfg.Device, cfg.Registerer = p.model, p.dev, p.reg
	cfg.VRAMReserve = 1 << 20
	if o, ok := p.model.(backend.MemoryOwner); ok && o.Memory() != nil {
		// A model server: its KV cache bounds it, in tokens, where a
		// reserve for a framework's allocations means nothing.
		cfg.Device, cfg.VRAMReserve = nil, 1
	}
	if cfg.WaitTime == 0 {
		cfg.WaitTime = time.Second // short polls keep shutdown quick in tests
	}
	if cfg.Visibility == 0 {
		cfg.Visibility = 10 * time.Second
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	var err error
	p.sub, err = subscriber.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.stop, p.done = cancel, make(chan struct{})
	go func() {
		defer close(p.done)
		p.runErr = p.sub.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
}

func (p *pipeline) send(works []job.Work) {
	p.t.Helper()
	if err := jobq.Send(p.t.Context(), p.client, p.urls.Work, works); err != nil {
		p.t.Fatal(err)
	}
}

// collect reads results until want distinct chunks have one, or fails.
func (p *pipeline) collect(want int, limit time.Duration) *jobq.Collector {
	p.t.Helper()
	c := jobq.NewCollector()
	deadline := time.Now().Add(limit)
	for len(c.Results) < want {
		if time.Now().After(deadline) {
			p.t.Fatalf("%d of %d results after %v", len(c.Results), want, limit)
		}
		if _, err := c.Poll(p.t.Context(), p.client, p.urls.Results, 1); err != nil {
			p.t.Fatal(err)
		}
	}
	return c
}

// shutdown stops the subscriber, checks it exited cleanly, and checks that
// no message of the work queue is left in flight.
func (p *pipeline) shutdown() (visible int) {
	p.t.Helper()
	p.stop()
	<-p.done
	if err := p.runErr; err != nil {
		p.t.Fatalf("Run: %v", err)
	}
	if l := p.sub.Ledger(); l.Received != l.Deleted+l.Released+l.Lost+l.Abandoned || l.Abandoned != 0 {
		p.t.Errorf("ledger: %+v; every message received must be deleted or released", l)
	}
	visible, inflight, err := jobq.Counts(p.t.Context(), p.client, p.urls.Work)
	if err != nil {
		p.t.Fatal(err)
	}
	if retried := p.receiveRetries.Load(); inflight > 10*int(retried) {
		p.t.Errorf("%d messages left in flight (invisible) after shutdown, with %d receive retries", inflight, retried)
	}
	return visible
}

func (p *pipeline) deadLetters() []jobq.DeadLetter {
	p.t.Helper()
	d, err := jobq.DrainDLQ(p.t.Context(), p.client, p.urls.DLQ)
	if err != nil {
		p.t.Fatal(err)
	}
	return d
}

// Every message of a mixed workload yields one result, under each strategy;
// vram runs it with no OOM, while count and none (which do not know sizes)
// run out of memory and recover by splitting, losing nothing.
func TestE2EMixedWorkload(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	const n = 40
	for _, tc := range []struct {
		name    string
		cfg     subscriber.Config
		wantOOM bool
	}{
		{"vram", subscriber.Config{Admission: subscriber.AdmitVRAM}, false},
		{"count", subscriber.Config{Admission: subscriber.AdmitCount, Count: 4}, true},
		{"none", subscriber.Config{Admission: subscriber.AdmitNone, MaxInflight: 10}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every other message large, so large ones arrive together.
			spec := workload.Mixed("mixed-"+tc.name, n)
			spec.LargeEvery = 2
			// The timed model: the reference model's memory, allocated on
			// the device for the length of a batch, and a GPU's time
			// (a large message works for about 100 ms) without the CPU
			// arithmetic, which under the race detector took most of a
			// minute per strategy. So what a strategy lets run at once
			// really overlaps on the device. The other end-to-end tests
			// run the reference model itself.
			p := newPipelineWith(t, 5, tc.cfg, nil, func(dev *gpu.Sim) gpu.Model {
				m, err := timed.New(refembed.DefaultConfig(), timed.Timing{Launch: 2 * time.Millisecond, Throughput: 160 << 20}, dev)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = m.Close() })
				return m
			})
			p.send(spec.Works())
			c := p.collect(n, 2*time.Minute)
			if left := p.shutdown(); left != 0 {
				t.Errorf("%d messages left on the work queue", left)
			}
			if len(c.Results) != n {
				t.Errorf("%d distinct results, want %d", len(c.Results), n)
			}
			t.Logf("%s: %d result messages, %d duplicates, %d OOMs on the device, peak admitted %s of %s",
				tc.name, c.Messages, c.Duplicates, p.dev.OOMs(), bytesize.Format(p.sub.PeakBytes()), bytesize.Format(p.sub.Budget()))
			for k, r := range c.Results {
				want := 8
				if spec.Large(k.Chunk) {
					want = 32
				}
				if len(r.Outputs) != want || len(r.Outputs[0].Embedding) != refembed.DefaultConfig().Out {
					t.Fatalf("chunk %d: %d outputs of %d dims", k.Chunk, len(r.Outputs), len(r.Outputs[0].Embedding))
				}
			}
			if d := p.deadLetters(); len(d) != 0 {
				t.Errorf("%d dead letters, first %q", len(d), d[0].Reason)
			}
			ooms := p.dev.OOMs()
			if tc.wantOOM && (ooms == 0 || promsum.Sum(t, p.reg, "vramq_subscriber_oom_retries_total") == 0) {
				t.Errorf("%s admission ran the workload with no OOM; the test does not exercise recovery", tc.name)
			}
			if !tc.wantOOM && ooms != 0 {
				t.Errorf("vram admission ran out of memory %d times", ooms)
			}
			if !tc.wantOOM && p.sub.PeakBytes() > p.sub.Budget() {
				t.Errorf("vram admission admitted %d bytes at once, budget %d", p.sub.PeakBytes(), p.sub.Budget())
			}
		})
	}
}

func TestE2EHeartbeatKeepsSlowMessage(t *testing.T) {
	t.Parallel() // mostly waiting; see TestE2EFaultKinds
	p := newPipeline(t, 5, subscriber.Config{Visibility: 3 * time.Second}, func(m gpu.Model) gpu.Model {
		return slowModel{m, func([]job.Item) time.Duration { return 8 * time.Second }}
	})
	p.send(workload.Mixed("slow", 1).Works())
	c := p.collect(1, time.Minute)
	// A redelivery would show as a second result or a later attempt; give
	// it the time to happen.
	time.Sleep(4 * time.Second)
	if _, err := c.Poll(t.Context(), p.client, p.urls.Results, 1); err != nil {
		t.Fatal(err)
	}
	p.shutdown()
	r := c.Results[job.Key{JobID: "slow", Chunk: 0}]
	if r.Attempt != 1 || c.Duplicates != 0 {
		t.Errorf("attempt %d, %d duplicates: the 8 s job was redelivered past its 3 s visibility", r.Attempt, c.Duplicates)
	}
	if n := promsum.Sum(t, p.reg, "vramq_subscriber_visibility_extensions_total"); n < 2 {
		t.Errorf("%v visibility extensions for an 8 s job with a 3 s timeout", n)
	}
}

// A malformed message goes to the DLQ with its reason. A chunk estimated
// over the whole budget whose items each fit is not too large (issue 25,
// item 10): it runs in parts and is answered whole.
func TestE2EPoisonGoesToDLQWithReason(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	p := newPipeline(t, 5, subscriber.Config{}, nil)
	huge := workload.Spec{JobID: "huge", Messages: 1, SmallItems: 64, SmallWords: 600, Seed: 2}.Works() // ~33 MiB
	if cost := p.model.Cost("", huge[0].Items); cost <= p.sub.MaxBudget() {
		t.Fatalf("the huge chunk is estimated at %d bytes, within the budget %d", cost, p.sub.MaxBudget())
	}
	ok := workload.Mixed("ok", 1).Works()
	p.send(append(huge, ok...))
	_, err := p.client.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: &p.urls.Work,
		MessageBody: strPtr(`{"v":1,"job_id":"x","items":[{"id":""}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	c := p.collect(2, time.Minute)
	dead := p.waitDeadLetters(1)
	p.shutdown()
	if r := c.Results[job.Key{JobID: "huge"}]; len(r.Outputs) != len(huge[0].Items) || r.ItemsFailed != 0 {
		t.Errorf("the huge chunk's result has %d outputs, %d failed; want %d, 0", len(r.Outputs), r.ItemsFailed, len(huge[0].Items))
	} else {
		for i, o := range r.Outputs {
			if o.ID != huge[0].Items[i].ID || len(o.Embedding) == 0 {
				t.Errorf("output %d: %s with %d floats, want %s's embedding", i, o.ID, len(o.Embedding), huge[0].Items[i].ID)
			}
		}
	}
	if len(dead) != 1 || !strings.HasPrefix(dead[0].Reason, "malformed: ") || dead[0].Attrs[job.AttrSource] == "" {
		t.Errorf("dead letters %+v; want one malformed, with its source", dead)
	}
}

// A message that cannot be admitted in time is released for another consumer
// and processed when it is received again.
// Backpressure on SQS: a message not admitted in time is handed back as a
// fresh copy (SendMessageBatch, then DeleteMessageBatch of the original), so
// it runs later at attempt 1, with the queue's redrive none the nearer.
func TestE2EBackpressureHandsBack(t *testing.T) {
	t.Parallel() // mostly waiting
	cfg := subscriber.Config{AdmitTimeout: 2 * time.Second, MaxBatch: 1, RetryDelay: time.Second}
	p := newPipeline(t, 5, cfg, func(m gpu.Model) gpu.Model {
		return slowModel{m, func(items []job.Item) time.Duration {
			if strings.HasPrefix(items[0].ID, "hog") {
				return 6 * time.Second
			}
			return 0
		}}
	})
	large := workload.Spec{Messages: 2, LargeEvery: 1, LargeItems: 32, LargeWords: 600, Seed: 3}
	hog := large
	hog.JobID = "hog"
	hogWork := hog.Works()[:1]
	hogWork[0].Items[0].ID = "hog"
	p.send(hogWork)
	time.Sleep(500 * time.Millisecond)
	waiter := large
	waiter.JobID = "waiter"
	p.send(waiter.Works()[:1])
	c := p.collect(2, time.Minute)
	p.shutdown()
	if n := promsum.Labelled(t, p.reg, "vramq_subscriber_messages_handed_back_total", "reason", "backpressure"); n < 1 {
		t.Errorf("%v hand-backs; the waiter should have been handed back by backpressure", n)
	}
	if r, ok := c.Results[job.Key{JobID: "waiter"}]; !ok || r.Attempt != 1 {
		t.Errorf("waiter: result %v at attempt %d; want it run from its fresh copy, at attempt 1", ok, r.Attempt)
	}
	if d := p.deadLetters(); len(d) != 0 {
		t.Errorf("%d dead letters", len(d))
	}
}

func strPtr(s string) *string { return &s }

// newStore makes a payload bucket for this test on the endpoint under test.
func newStore(t *testing.T) *payload.Store {
	t.Helper()
	c := sqstest.S3(t)
	return payload.New(c, sqstest.Bucket(t, c))
}

// putItem stores it as the publisher claim-checks an item, and returns the
// item that stands for it in the work message.
func putItem(t *testing.T, store *payload.Store, key string, it job.Item) job.Item {
	t.Helper()
	b, err := json.Marshal(it)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := store.Put(t.Context(), key, b)
	if err != nil {
		t.Fatal(err)
	}
	return job.Item{ID: it.ID, Ref: &ref}
}

// waitDeadLetters drains the DLQ until it has given n messages or a limit
// passes.
func (p *pipeline) waitDeadLetters(n int) []jobq.DeadLetter {
	p.t.Helper()
	var dead []jobq.DeadLetter
	for deadline := time.Now().Add(30 * time.Second); len(dead) < n && time.Now().Before(deadline); {
		dead = append(dead, p.deadLetters()...)
	}
	return dead
}

// A claim-checked item is fetched from S3, verified and gives the output of
// the same item sent inline; a changed or missing object goes to the DLQ
// with a failed marker for its chunk; every result is also in the bucket.
func TestE2EClaimCheck(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	store := newStore(t)
	p := newPipeline(t, 5, subscriber.Config{Payloads: store}, nil)
	text := strings.Repeat("the quick brown fox jumps over the lazy dog ", 40)
	item := job.Item{ID: "doc", Text: text}
	corrupt := putItem(t, store, job.ItemKey("corrupt", "doc"), item)
	// Same size, one byte changed: only the hash can tell.
	changed := job.Item{ID: "doc", Text: strings.Replace(text, "quick", "quack", 1)}
	if b, _ := json.Marshal(changed); int64(len(b)) != corrupt.Ref.Size {
		t.Fatal("the changed item must keep the size")
	} else if _, err := store.Put(t.Context(), corrupt.Ref.Key, b); err != nil {
		t.Fatal(err)
	}
	// Stored under another item's key: the one the reference must name
	// holds nothing.
	missing := putItem(t, store, job.ItemKey("missing", "other"), item)
	missing.Ref.Key = job.ItemKey("missing", "doc")
	p.send([]job.Work{
		{V: 1, JobID: "inline", Items: []job.Item{item}},
		{V: 1, JobID: "claimed", Items: []job.Item{putItem(t, store, job.ItemKey("claimed", "doc"), item)}},
		{V: 1, JobID: "corrupt", Items: []job.Item{corrupt}},
		{V: 1, JobID: "missing", Items: []job.Item{missing}},
	})
	c := p.collect(2, time.Minute)
	dead := p.waitDeadLetters(2)
	p.shutdown()

	inline, claimed := c.Results[job.Key{JobID: "inline"}], c.Results[job.Key{JobID: "claimed"}]
	if len(claimed.Outputs) != 1 || len(claimed.Outputs[0].Embedding) != refembed.DefaultConfig().Out {
		t.Fatalf("claim-checked result: %+v", claimed)
	}
	if diff := cmp.Diff(inline.Outputs, claimed.Outputs); diff != "" {
		t.Errorf("claim-checked output differs from the inline one (-inline +claimed):\n%s", diff)
	}
	for k, r := range c.Results {
		b, err := store.Read(t.Context(), job.ResultKey(k.JobID, k.Chunk))
		if err != nil {
			t.Fatalf("%v: result not in the bucket: %v", k, err)
		}
		var stored job.Result
		if err := json.Unmarshal(b, &stored); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(stored, r); diff != "" {
			t.Errorf("%v: the stored result differs from the message (-stored +message):\n%s", k, diff)
		}
	}

	reasons := map[string]string{}
	for _, d := range dead {
		reasons[d.Attrs[job.AttrJobID]] = d.Reason
	}
	// The same reason for both: whether an object is there, and its hash,
	// are not for the sender to learn (issue 14, item 1).
	for _, jobID := range []string{"corrupt", "missing"} {
		r := reasons[jobID]
		if want := `claim_check: item "doc": no object in the payload bucket matches the reference`; r != want {
			t.Errorf("%s: DLQ reason %q; want %q", jobID, r, want)
		}
		b, err := store.Read(t.Context(), job.FailedKey(jobID, 0))
		if err != nil {
			t.Errorf("%s: no failed marker: %v", jobID, err)
			continue
		}
		var m struct {
			V         int    `json:"v"`
			JobID     string `json:"job_id"`
			Chunk     int    `json:"chunk"`
			Reason    string `json:"reason"`
			MessageID string `json:"message_id"`
			At        string `json:"at"`
		}
		if err := json.Unmarshal(b, &m); err != nil || m.V != 1 || m.JobID != jobID || m.Reason != r || m.MessageID == "" || m.At == "" {
			t.Errorf("%s: failed marker %s (%v); want the DLQ reason %q", jobID, b, err, r)
		}
	}
	if len(dead) != 2 {
		t.Errorf("%d dead letters, want 2", len(dead))
	}
	if n := promsum.Sum(t, p.reg, "vramq_subscriber_results_stored_total"); n != 2 {
		t.Errorf("%v results stored, want 2", n)
	}
}

// A result too large for a message arrives as a reference to the whole
// result in S3.
func TestE2ELargeResultByRef(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	store := newStore(t)
	p := newPipeline(t, 5, subscriber.Config{Payloads: store, MaxMessageBytes: 4 << 10}, nil)
	w := job.Work{V: 1, JobID: "wide"}
	for i := range 12 {
		w.Items = append(w.Items, job.Item{ID: fmt.Sprint("doc-", i), Text: fmt.Sprintf("document number %d of the wide job", i)})
	}
	p.send([]job.Work{w})
	c := p.collect(1, time.Minute)
	p.shutdown()
	r := c.Results[job.Key{JobID: "wide"}]
	if r.Ref == nil || r.Outputs != nil {
		t.Fatalf("result %+v; want a reference and no outputs", r)
	}
	b, err := store.Get(t.Context(), *r.Ref)
	if err != nil {
		t.Fatalf("fetching the result: %v", err)
	}
	var full job.Result
	if err := json.Unmarshal(b, &full); err != nil {
		t.Fatal(err)
	}
	if len(full.Outputs) != 12 || len(full.Outputs[11].Embedding) != refembed.DefaultConfig().Out || full.Key() != r.Key() || full.Ref != nil {
		t.Errorf("stored result: %d outputs, key %v", len(full.Outputs), full.Key())
	}
	if len(b) <= 4<<10 {
		t.Errorf("the stored result is %d bytes; the test needs one above the message limit", len(b))
	}
}

// Without a bucket, a message that references one is poison with a reason.
func TestE2EClaimCheckWithoutBucket(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	p := newPipeline(t, 5, subscriber.Config{}, nil)
	ref := job.PayloadRef{Bucket: "elsewhere", Key: job.ItemKey("j", "i0"), Size: 10, SHA256: strings.Repeat("ab", 32)}
	p.send([]job.Work{{V: 1, JobID: "j", Items: []job.Item{{ID: "doc", Ref: &ref}}}})
	dead := p.waitDeadLetters(1)
	p.shutdown()
	if len(dead) != 1 || !strings.HasPrefix(dead[0].Reason, "claim_check: ") ||
		!strings.Contains(dead[0].Reason, "no payload bucket is configured") {
		t.Errorf("dead letters %+v; want one claim_check saying no bucket is configured", dead)
	}
}
