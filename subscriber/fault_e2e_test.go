package subscriber_test

// Fault tests, end to end and in process: the subscriber reaches SQS (and S3)
// through a fault-injecting proxy, or runs a model that misbehaves, and each
// test checks the pipeline's invariant with internal/testenv/accounting: every chunk
// ends with one de-duplicated result or in the DLQ with a reason, duplicates
// are bounded, nothing is left on the work queue beyond what lost receives
// strand, and the subscriber's ledger balances with nothing abandoned. Each
// test also checks that its fault really happened.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/accounting"
	"github.com/vramq/vramq/internal/testenv/faultproxy"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/promsum"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber"
)

// faultPipeline is a pipeline whose subscriber talks to SQS through a
// fault-injecting proxy, with the books of what was sent.
type faultPipeline struct {
	*pipeline
	proxy proxied
	books *accounting.Books
}

// endpoint is the SQS endpoint under test, "" when none is configured.
func endpoint() string {
	if e := os.Getenv("AWS_ENDPOINT_URL_SQS"); e != "" {
		return e
	}
	return os.Getenv("AWS_ENDPOINT_URL")
}

// proxied is a fault proxy in front of the endpoint under test.
type proxied struct {
	*faultproxy.Proxy
	cfg aws.Config // the project's AWS configuration, pointed at the proxy
	// receives the SDK retried through it; each may strand up to 10 messages
	receiveRetries *atomic.Int64
	// batch sends the SDK retried through it; each may have sent up to 10
	// messages already, when only the response was lost
	sendRetries *atomic.Int64
}

// startProxy starts a fault proxy in front of the endpoint under test,
// counting the SDK's retries through it as sqstest.CountingClient does.
func startProxy(t *testing.T, f faultproxy.Faults) proxied {
	t.Helper()
	target := endpoint()
	if target == "" {
		t.Skip("no SQS endpoint: set AWS_ENDPOINT_URL (make test starts the emulator and sets it)")
	}
	p, err := faultproxy.New(target, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	px := proxied{Proxy: p, receiveRetries: new(atomic.Int64), sendRetries: new(atomic.Int64)}
	log := slog.New(logFunc(func(r slog.Record) {
		switch {
		case strings.Contains(r.Message, "retrying request SQS/ReceiveMessage"):
			px.receiveRetries.Add(1)
		case strings.Contains(r.Message, "retrying request SQS/SendMessageBatch"):
			px.sendRetries.Add(1)
		}
	}))
	if px.cfg, err = p.Config(t.Context(), log); err != nil {
		t.Fatal(err)
	}
	return px
}

type logFunc func(slog.Record)

func (h logFunc) Enabled(context.Context, slog.Level) bool      { return true }
func (h logFunc) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h logFunc) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h logFunc) WithGroup(string) slog.Handler                 { return h }

// newFaultPipeline starts a subscriber behind a proxy injecting f. Leases are
// short (4s) so that what a lost response strands comes back within the
// test, and released messages come back after a second.
func newFaultPipeline(t *testing.T, maxReceive int, cfg subscriber.Config, wrap func(gpu.Model) gpu.Model,
	f faultproxy.Faults) *faultPipeline {
	t.Helper()
	px := startProxy(t, f)
	if cfg.Visibility == 0 {
		cfg.Visibility = 4 * time.Second
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = time.Second
	}
	p := newPipelineVia(t, maxReceive, cfg, wrap, px.SQS(px.cfg))
	return &faultPipeline{pipeline: p, proxy: px, books: accounting.New()}
}

// start sends works and expects a result or dead letter for each.
func (f *faultPipeline) start(works []job.Work) {
	f.books.Expect(works...)
	f.send(works)
}

// outcome is what collect found.
type outcome struct {
	accounting.Report
	Ledger subscriber.Ledger
	// result messages read after every chunk was accounted for: more
	// duplicates
	LateResults int
}

// collect waits until every chunk is accounted for, lets the subscriber
// finish what redeliveries bring, stops it, and checks the invariant:
// accounting's report, the ledger, and duplicates within what the faults can
// explain (one per receive beyond the first of each message, and ten per
// result batch whose response was dropped after it was sent).
func (f *faultPipeline) collect(limit time.Duration) outcome {
	t := f.t
	t.Helper()
	start := time.Now()
	if err := f.books.Collect(t.Context(), f.client, f.urls.Results, f.urls.DLQ, limit); err != nil {
		t.Fatal(err)
	}
	collected := time.Now()
	f.waitIdle(30 * time.Second)
	idle := time.Now()
	f.stop()
	<-f.done
	t.Logf("collect %v, idle %v, stop %v", collected.Sub(start).Round(time.Millisecond),
		idle.Sub(collected).Round(time.Millisecond), time.Since(idle).Round(time.Millisecond))
	if f.runErr != nil {
		t.Fatalf("Run: %v", f.runErr)
	}
	o := outcome{Ledger: f.sub.Ledger()}
	l := o.Ledger
	if l.Received != l.Deleted+l.Released+l.Lost+l.Abandoned || l.Abandoned != 0 {
		t.Errorf("ledger %+v: every message received must be deleted, released or lost, none abandoned", l)
	}
	// Collect stops once every chunk is in: read what came after, from both
	// queues at once (each read ends with a one-second empty poll).
	late := jobq.NewCollector()
	var dead []jobq.DeadLetter
	var g errgroup.Group
	g.Go(func() error {
		for {
			n, err := late.Poll(t.Context(), f.client, f.urls.Results, 1)
			if err != nil || n == 0 {
				return err
			}
		}
	})
	g.Go(func() (err error) {
		dead, err = jobq.DrainDLQ(t.Context(), f.client, f.urls.DLQ)
		return err
	})
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	o.LateResults = late.Messages
	if len(dead) != 0 {
		t.Errorf("%d dead letters after every chunk was accounted for, first %q: a chunk dead-lettered twice or after its result",
			len(dead), dead[0].Reason)
	}
	r, err := f.books.Check(t.Context(), f.client, f.urls.Work)
	if err != nil {
		t.Fatal(err)
	}
	dropped := f.proxy.InjectedFor("ReceiveMessage")[faultproxy.KindDropAfter]
	r.StrandedAllowance = 10 * int(f.receiveRetries.Load()+f.proxy.receiveRetries.Load()+dropped)
	o.Report = r
	t.Logf("%s; late results %d; ledger %+v; faults %v in %d requests", r, o.LateResults, l, f.proxy.Injected(), f.proxy.Requests())
	if err := r.Err(); err != nil {
		t.Error(err)
	}
	// A duplicate result comes from running a message again (a receive
	// beyond its first) or from the SDK sending a result batch again after
	// its response was lost (dropped by the proxy, or the emulator's quirk,
	// which shows as a retry; so do the proxy's other faults, which makes
	// this bound generous when they hit SendMessageBatch).
	dups := r.Duplicates + o.LateResults
	resent := max(f.proxy.InjectedFor("SendMessageBatch")[faultproxy.KindDropAfter], f.proxy.sendRetries.Load())
	bound := int(l.Received) - r.Chunks + 10*int(resent)
	if dups > max(bound, 0) {
		t.Errorf("%d duplicate results; the faults explain at most %d (%d receives for %d chunks, %d result batches sent again)",
			dups, bound, l.Received, r.Chunks, resent)
	}
	return o
}

// waitIdle waits until the work queue is empty and the subscriber holds
// nothing, or limit passes (then the report judges what is left): messages
// a lost response stranded come back after their visibility, and are
// processed again before the subscriber stops.
func (f *faultPipeline) waitIdle(limit time.Duration) {
	t := f.t
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		visible, inflight, err := jobq.Counts(t.Context(), f.client, f.urls.Work)
		if err != nil {
			t.Fatal(err)
		}
		held := promsum.Sum(t, f.reg, "vramq_subscriber_messages_held")
		if visible == 0 && inflight == 0 && held == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Logf("work queue not idle after %v: %d visible, %d in flight, %v held", limit, visible, inflight, held)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Every fault kind of the proxy, on every call the subscriber makes: nothing
// is lost, nothing is dead-lettered (every fault is one that passes), and
// duplicates stay within what the faults explain.
func TestE2EFaultKinds(t *testing.T) {
	const n = 20
	for _, tc := range []struct {
		kind string
		f    faultproxy.Faults
	}{
		{faultproxy.KindThrottle, faultproxy.Faults{Throttle: 0.25}},
		{faultproxy.KindServerError, faultproxy.Faults{ServerError: 0.25}},
		{faultproxy.KindSlow, faultproxy.Faults{Slow: 0.3, SlowDelay: 500 * time.Millisecond}},
		{faultproxy.KindDropBefore, faultproxy.Faults{DropBefore: 0.2}},
		{faultproxy.KindDropAfter, faultproxy.Faults{DropAfter: 0.2}},
		{faultproxy.KindPartialBatch, faultproxy.Faults{PartialBatch: 0.3}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			// Most of each case is waiting (backoffs, visibility timeouts):
			// side by side they take about as long as the slowest alone.
			t.Parallel()
			tc.f.Seed = 7
			// A message stranded or released a few times must not reach the
			// redrive policy: these faults all pass.
			p := newFaultPipeline(t, 10, subscriber.Config{}, nil, tc.f)
			p.start(workload.Mixed("faults-"+tc.kind, n).Works())
			o := p.collect(time.Minute)
			if o.Results != n || o.DeadLettered != 0 {
				t.Errorf("%d results and %d dead-lettered of %d: transient faults must not dead-letter", o.Results, o.DeadLettered, n)
			}
			if got := p.proxy.Injected()[tc.kind]; got == 0 {
				t.Errorf("no %s injected in %d requests: the test did not exercise the fault", tc.kind, p.proxy.Requests())
			}
		})
	}
}

// The endpoint goes away for a few seconds mid-run: the subscriber keeps
// running through it, backs off, and finishes the work after it.
func TestE2EOutage(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	const n = 40
	// Batches take a while, so that the outage finds work in progress.
	p := newFaultPipeline(t, 10, subscriber.Config{}, func(m gpu.Model) gpu.Model {
		return slowModel{m, func(items []job.Item) time.Duration { return time.Duration(len(items)) * 10 * time.Millisecond }}
	}, faultproxy.Faults{})
	works := workload.Mixed("outage", n).Works()
	p.start(works)
	sent := func() float64 { return promsum.Sum(t, p.reg, "vramq_subscriber_results_sent_total") }
	wait.For(t, 30*time.Second, "no result before the outage", func() bool { return sent() > 0 })
	p.proxy.Down(true)
	time.Sleep(3 * time.Second) // the outage itself, not a wait for a condition
	select {
	case <-p.done:
		t.Fatalf("Run returned during the outage: %v", p.runErr)
	default:
	}
	before := sent()
	p.proxy.Down(false)
	o := p.collect(2 * time.Minute)
	if o.Results != n {
		t.Errorf("%d results of %d", o.Results, n)
	}
	if before >= n {
		t.Error("every chunk was done before the outage ended: the test did not exercise recovery")
	}
	t.Logf("%v of %d results sent when the outage ended", before, n)
	if got := p.proxy.Injected()[faultproxy.KindDown]; got == 0 {
		t.Error("nothing was refused during the outage")
	}
}

// Inference that hangs on some messages times out, and the messages are
// released with a backoff; after maxReceiveCount receives the queue's redrive
// policy moves them to the DLQ (the subscriber gives no reason of its own:
// accounting records the redrive's). Every other message finishes.
func TestE2EHangingInference(t *testing.T) {
	t.Parallel() // mostly waiting out timeouts and backoffs
	const n = 12
	hangs := map[string]bool{"3": true, "7": true} // chunks, by the prefix of their item ids
	hung := func(items []job.Item) bool {
		for _, it := range items {
			if c, _, _ := strings.Cut(it.ID, "-"); hangs[c] {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		name     string
		maxBatch int
	}{
		{"alone", 1},
		// A batch that times out is released whole, and its messages,
		// having the same receive count, come back after the same backoff.
		// Batched together again, the hanging message would take its
		// batch-mates to the DLQ with it; as suspects they run one per
		// batch, and only the hanging ones are redriven.
		{"batched", 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFaultPipeline(t, 2, subscriber.Config{MaxBatch: tc.maxBatch, InferenceTimeout: 2 * time.Second},
				func(m gpu.Model) gpu.Model { return hangModel{m, hung} }, faultproxy.Faults{})
			// Small messages only: a message that does not hang must finish
			// well within the timeout even under the race detector on a busy
			// machine.
			spec := workload.Mixed("hang", n)
			spec.LargeEvery = 0
			p.start(spec.Works())
			o := p.collect(time.Minute)
			if o.Results != n-len(hangs) || o.DeadLettered != len(hangs) || o.Reasons[accounting.RedriveReason] != len(hangs) {
				t.Errorf("%d results, %d dead-lettered (%v); want %d results and the %d hanging chunks redriven",
					o.Results, o.DeadLettered, o.Reasons, n-len(hangs), len(hangs))
			}
			// Each hanging message timed out on each of its maxReceiveCount receives.
			if got := promsum.Labelled(t, p.reg, "vramq_subscriber_messages_released_total", "delay", "backoff"); got < float64(2*len(hangs)) {
				t.Errorf("%v messages released with a backoff; want at least %d (two timeouts for each hanging one)", got, 2*len(hangs))
			}
		})
	}
}

// hangModel blocks until its context ends for the batches hang picks, as a
// wedged kernel or driver would.
type hangModel struct {
	gpu.Model
	hang func(items []job.Item) bool
}

func (m hangModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	if m.hang(items) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return m.Model.Run(ctx, items)
}

// oomModel runs out of memory on half of its batches, at random.
type oomModel struct {
	gpu.Model
	mu   sync.Mutex
	rng  *rand.Rand
	ooms atomic.Int64
}

func (m *oomModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	m.mu.Lock()
	oom := m.rng.IntN(2) == 0
	m.mu.Unlock()
	if oom {
		m.ooms.Add(1)
		return nil, fmt.Errorf("injected: %w", gpu.ErrOutOfMemory)
	}
	return m.Model.Run(ctx, items)
}

// A storm of OOMs: batches split, messages run alone, and one that still
// runs out of memory with the device to itself is dead-lettered with the
// reason. Nothing crashes and nothing is lost.
func TestE2EOOMStorm(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	const n = 40
	var model *oomModel
	p := newFaultPipeline(t, 5, subscriber.Config{}, func(m gpu.Model) gpu.Model {
		model = &oomModel{Model: m, rng: rand.New(rand.NewPCG(1, 2))}
		return model
	}, faultproxy.Faults{})
	p.start(workload.Mixed("oom", n).Works())
	o := p.collect(time.Minute)
	if o.Results+o.DeadLettered != n {
		t.Errorf("%d results and %d dead-lettered of %d", o.Results, o.DeadLettered, n)
	}
	for reason := range o.Reasons {
		if reason != "out_of_memory" {
			t.Errorf("dead-lettered for %q; only out_of_memory is expected", reason)
		}
	}
	if got := promsum.Sum(t, p.reg, "vramq_subscriber_oom_retries_total"); got == 0 || model.ooms.Load() == 0 {
		t.Errorf("%v OOM retries, %d injected: the test did not exercise the storm", got, model.ooms.Load())
	}
	t.Logf("%d OOMs injected, %d chunks dead-lettered out of memory", model.ooms.Load(), o.DeadLettered)
}

// Heartbeats held up longer than the visibility timeout: the messages come
// back to the queue while their first attempt still runs, so leases are lost
// and the messages run again. Each finishes, duplicates are counted and stay
// within one per redelivery.
func TestE2EExpiredHeartbeat(t *testing.T) {
	t.Parallel() // mostly waiting
	const n = 4
	p := newFaultPipeline(t, 10, subscriber.Config{Visibility: 3 * time.Second}, func(m gpu.Model) gpu.Model {
		return slowModel{m, func([]job.Item) time.Duration { return 4 * time.Second }}
	}, faultproxy.Faults{Slow: 1, SlowDelay: 4 * time.Second, Actions: []string{"ChangeMessageVisibilityBatch"}})
	p.start(workload.Mixed("expire", n).Works())
	wait.For(t, time.Minute, "no heartbeat sent", func() bool { return p.proxy.Injected()[faultproxy.KindSlow] > 0 })
	// The heartbeats already sent stay held up; the next ones go through,
	// so the redelivered messages keep their leases.
	if err := p.proxy.Set(faultproxy.Faults{}); err != nil {
		t.Fatal(err)
	}
	lost := func() float64 {
		return promsum.Sum(t, p.reg, "vramq_subscriber_leases_lost_total") + float64(p.sub.Ledger().Lost)
	}
	wait.For(t, time.Minute, "no lease lost with heartbeats held up past the visibility timeout", func() bool { return lost() > 0 })
	o := p.collect(2 * time.Minute)
	if o.Results != n {
		t.Errorf("%d results of %d", o.Results, n)
	}
	if o.Ledger.Received <= n {
		t.Errorf("%d receives for %d messages: want the messages redelivered", o.Ledger.Received, n)
	}
	t.Logf("leases lost: %v (metric) %d (ledger); duplicates %d + %d late",
		promsum.Sum(t, p.reg, "vramq_subscriber_leases_lost_total"), o.Ledger.Lost, o.Duplicates, o.LateResults)
}

// Claim-checked items under S3 throttling and 500s: the ones whose object is
// fine run (transient S3 errors are retried, never dead-lettered), and only
// the missing and the corrupted objects go to the DLQ with the claim_check
// reason. TestE2EClaimCheck checks the reasons and markers in detail.
func TestE2EClaimCheckUnderS3Faults(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	const n = 12
	store := newStore(t)
	// S3 faults only: the subscriber's SQS calls go straight to the endpoint.
	px := startProxy(t, faultproxy.Faults{Throttle: 0.15, ServerError: 0.15, Actions: []string{faultproxy.ActionS3}, Seed: 5})
	via := payload.New(px.S3(px.cfg), store.Bucket())
	cfg := subscriber.Config{Payloads: via, Visibility: 4 * time.Second, RetryDelay: time.Second}
	p := &faultPipeline{pipeline: newPipeline(t, 10, cfg, nil),
		proxy: px, books: accounting.New()}

	works := workload.Mixed("claims", n).Works()
	claimed := func(chunk int) job.Item {
		return putItem(t, store, job.ItemKey("claims", works[chunk].Items[0].ID), works[chunk].Items[0])
	}
	for _, c := range []int{1, 2, 6} {
		works[c].Items[0] = claimed(c)
	}
	corrupt := claimed(3)
	changed := works[3].Items[0]
	changed.Text = strings.Replace(changed.Text, changed.Text[:2], "xx", 1) // same size, another hash
	b, _ := json.Marshal(changed)
	if _, err := store.Put(t.Context(), corrupt.Ref.Key, b); err != nil {
		t.Fatal(err)
	}
	works[3].Items[0] = corrupt
	missing := claimed(4)
	missing.Ref.Key += ".gone"
	works[4].Items[0] = missing

	p.start(works)
	o := p.collect(time.Minute)
	if o.Results != n-2 || o.DeadLettered != 2 || o.Reasons["claim_check"] != 2 {
		t.Errorf("%d results, %d dead-lettered (%v); want the corrupt and the missing one as claim_check, the rest done",
			o.Results, o.DeadLettered, o.Reasons)
	}
	s3 := px.InjectedFor(faultproxy.ActionS3)
	if s3[faultproxy.KindThrottle]+s3[faultproxy.KindServerError] == 0 {
		t.Errorf("no S3 fault injected (%v): the test did not exercise them", s3)
	}
	if got := promsum.Labelled(t, p.reg, "vramq_subscriber_claim_checks_total", "outcome", "ok"); got < 3 {
		t.Errorf("%v claim checks passed; want the 3 good ones", got)
	}
}
