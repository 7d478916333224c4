package subscriber_test

// Issue 27's rate-limit benchmarks through the real subscriber: work
// messages of chat completions on the emulator's SQS queues, subscriber
// instances wired as cmd/subscriber wires -model-server (model/modelserver's
// Model and Device, VRAMReserve 1, every other setting its default), against
// internal/testenv/fakeoai with rate limits, its clock Speed times the real
// one. model/modelserver/bench_test.go measures the backend alone, with
// callers standing in for the subscriber; this one has the subscriber's
// receive, admission, batching, leases and result sends in the loop. Not a
// pass/fail test: it prints what it measured, and bench/modelserver.md
// ("Through the subscriber") records the figures and the command. It runs
// only when VRAMQ_BENCH_PIPELINE is set (1 for all, or a comma-separated
// list of rate-unconfigured, rate, shared-full, shared-headers, shared, cost).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/testenv/cputime"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/promsum"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

// The same server and work as model/modelserver's benchmark, so that the
// figures compare.
const (
	pbSpeed        = 10 // server seconds per real second
	pbTPM          = 60000
	pbRPM          = 600
	pbMaxTokens    = 128
	pbTokenLatency = 20 * time.Millisecond // one scheduler step per generated token, server time
	pbMinutes      = 11                    // minute 0 and ten full minutes after it
	// pbChunkItems is the publisher's default -chunk-items: one work
	// message per 32 requests.
	pbChunkItems = 32
	// pbChunks is more work than eleven server minutes can take (about
	// 390 requests a minute at 155 tokens each), so that the queue never
	// runs dry: the rest stays on it.
	pbChunks = 250
)

// pbServerMinutes is d minutes of the server's clock in real time.
func pbServerMinutes(d float64) time.Duration {
	return time.Duration(d * float64(time.Minute) / pbSpeed)
}

// chatLoad makes chat items as model/modelserver's benchmark does: a prompt
// of 10 to 30 words, a natural output of 16 to 96 tokens (fakeoai's
// [[len=N]]), max_tokens 128.
type chatLoad struct {
	rng *rand.Rand
	n   int
}

func newChatLoad(seed uint64) *chatLoad { return &chatLoad{rng: rand.New(rand.NewPCG(seed, 1))} }

func (l *chatLoad) item() job.Item {
	l.n++
	id := fmt.Sprintf("i%d", l.n)
	words, out := 10+l.rng.IntN(21), 16+l.rng.IntN(81)
	text := fmt.Sprintf("[[len=%d]] item %s%s", out, id, strings.Repeat(" word", words-3))
	return job.Item{ID: id, Body: json.RawMessage(fmt.Sprintf(
		`{"model":"fake-model","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, text, pbMaxTokens))}
}

// works is a job of chunks work messages of items each.
func (l *chatLoad) works(jobID string, chunks, items int) []job.Work {
	ws := make([]job.Work, chunks)
	for c := range ws {
		ws[c] = job.Work{V: job.Version, JobID: jobID, Chunk: c, Chunks: chunks, Endpoint: job.EndpointChatCompletions}
		for range items {
			ws[c].Items = append(ws[c].Items, l.item())
		}
	}
	return ws
}

// benchSub is one subscriber process's worth: its model-server backend and
// its own metrics.
type benchSub struct {
	sub    *subscriber.Subscriber
	reg    *prometheus.Registry
	stop   context.CancelFunc
	done   chan struct{}
	runErr error
}

// newBenchSub makes a subscriber on urls whose model is srv, as
// cmd/subscriber does with -model-server srv -model-server-models fake-model
// -model-server-max-output-tokens 128 -model-server-tpm tpm (0: none); start
// runs it.
func newBenchSub(t *testing.T, client *sqs.Client, urls localstack.URLs, srv *fakeoai.Server, tpm int) *benchSub {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		// What goes wrong (a backoff, a release) is worth seeing next to
		// the figures.
		quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	// The times that are about the server's pace (how long a batch may
	// wait for it, run on it, or wait to be admitted to it) are its
	// defaults in server time, divided by the speed as the server's own
	// are; those about SQS (visibility, hold, long poll) are not.
	d := subscriber.DefaultConfig()
	m, err := modelserver.Open(t.Context(), modelserver.Config{BaseURL: srv.URL(), Models: []string{"fake-model"},
		MaxOutputTokens: pbMaxTokens, MaxWait: modelserver.DefaultMaxWait / pbSpeed, TPM: tpm, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	b := &benchSub{reg: prometheus.NewRegistry(), done: make(chan struct{})}
	b.sub, err = subscriber.New(subscriber.Config{
		Queue: sqsqueue.New(client, urls.Work), Results: sqsqueue.New(client, urls.Results), DLQ: sqsqueue.New(client, urls.DLQ),
		Backend: m, Registerer: b.reg, Logger: quiet,
		VRAMReserve:      1, // checkModelServer's: the device's memory is tokens
		InferenceTimeout: d.InferenceTimeout / pbSpeed, AdmitTimeout: d.AdmitTimeout / pbSpeed,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *benchSub) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	b.stop = cancel
	go func() {
		defer close(b.done)
		b.runErr = b.sub.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-b.done })
}

// shutdown stops every subscriber at once, as a scale-in would.
func shutdownAll(t *testing.T, subs []*benchSub) {
	t.Helper()
	for _, b := range subs {
		b.stop()
	}
	for i, b := range subs {
		<-b.done
		if b.runErr != nil {
			t.Errorf("subscriber %d: Run: %v", i, b.runErr)
		}
	}
}

// pbLedger is the server's ledger over its complete minutes.
type pbLedger struct {
	tpm, frac, minFrac, ofMost, rpm, fracReq, min0 float64
	limited, answers, limitedAll, answersAll       int64
}

// readPBLedger sums minutes [1, n) of ms, minute 0 counted only in the
// "all" figures and in ofMost: the tokens of all n minutes over the most
// the server could admit in them, its bucket full at the start plus a
// minute's refill each (model/modelserver's benchmark, "What is counted").
func readPBLedger(ms []fakeoai.Minute, n int) pbLedger {
	var l pbLedger
	l.minFrac = math.Inf(1)
	var tok, req, all int64
	for i, m := range ms[:n] {
		all += m.Tokens
		l.limitedAll += m.RateLimited
		l.answersAll += m.Answers
		if i == 0 {
			l.min0 = float64(m.Tokens) / pbTPM
			continue
		}
		tok += m.Tokens
		req += m.Requests
		l.limited += m.RateLimited
		l.answers += m.Answers
		l.minFrac = min(l.minFrac, float64(m.Tokens)/pbTPM)
	}
	l.tpm = float64(tok) / float64(n-1)
	l.rpm = float64(req) / float64(n-1)
	l.frac, l.fracReq = l.tpm/pbTPM, l.rpm/pbRPM
	l.ofMost = float64(all) / float64(pbTPM*(n+1))
	return l
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// pbOutcome is what became of the work: counted from the results queue,
// the work queue and the DLQ after every subscriber has stopped.
type pbOutcome struct {
	sent, results, duplicates, left, inflight, dead int
	ok, itemErrors                                  int
	backedOff, released, receives                   float64
}

func settle(t *testing.T, client *sqs.Client, urls localstack.URLs, sent int, subs []*benchSub) pbOutcome {
	t.Helper()
	ctx := t.Context()
	o := pbOutcome{sent: sent}
	c := jobq.NewCollector()
	for empty := 0; empty < 2; {
		n, err := c.Poll(ctx, client, urls.Results, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			empty++
		} else {
			empty = 0
		}
	}
	o.results, o.duplicates = len(c.Results), c.Duplicates
	for _, r := range c.Results {
		for _, out := range r.Outputs {
			if out.Error == nil && out.Response != nil && out.Response.StatusCode/100 == 2 {
				o.ok++
			} else {
				o.itemErrors++
			}
		}
	}
	var err error
	if o.left, o.inflight, err = jobq.Counts(ctx, client, urls.Work); err != nil {
		t.Fatal(err)
	}
	dead, err := jobq.DrainDLQ(ctx, client, urls.DLQ)
	if err != nil {
		t.Fatal(err)
	}
	o.dead = len(dead)
	for _, b := range subs {
		o.backedOff += promsum.Sum(t, b.reg, "vramq_subscriber_messages_backed_off_total")
		o.released += promsum.Sum(t, b.reg, "vramq_subscriber_messages_released_total")
		o.receives += promsum.Labelled(t, b.reg, "vramq_subscriber_sqs_requests_total", "action", "ReceiveMessage")
	}
	return o
}

// lost is the work messages neither answered nor back on the queue.
func (o pbOutcome) lost() int { return o.sent - o.results - o.left - o.inflight }

func TestBenchPipelineModelServer(t *testing.T) {
	which := os.Getenv("VRAMQ_BENCH_PIPELINE")
	if which == "" {
		t.Skip("set VRAMQ_BENCH_PIPELINE=1 (or a comma-separated list of rate-unconfigured, rate, shared-full, shared-headers, shared, cost) to run the benchmarks of the subscriber against a model server (about seven minutes)")
	}
	if endpoint() == "" {
		t.Fatal("no SQS endpoint: set AWS_ENDPOINT_URL (eval \"$(localstack/emulator.sh env)\")")
	}
	part := func(name string) bool { return which == "1" || slices.Contains(strings.Split(which, ","), name) }
	// The server's limit in this process's time, for -model-server-tpm.
	const realTPM = pbTPM * pbSpeed
	if part("rate-unconfigured") {
		t.Run("rate-unconfigured", func(t *testing.T) { benchPipelineRate(t, 1, 0, pbChunkItems) })
	}
	if part("rate") {
		t.Run("rate", func(t *testing.T) { benchPipelineRate(t, 1, realTPM, pbChunkItems) })
	}
	if part("shared-full") {
		t.Run("shared-full", func(t *testing.T) { benchPipelineRate(t, 3, realTPM, pbChunkItems) })
	}
	if part("shared-headers") {
		// Nothing configured: the three share the limit through the
		// server's headers alone.
		t.Run("shared-headers", func(t *testing.T) { benchPipelineRate(t, 3, 0, pbChunkItems) })
	}
	if part("shared") {
		// A third of the limit each: a 32-item message costs more than a
		// third of what the limit passes in half of MaxWait, so half that.
		t.Run("shared", func(t *testing.T) { benchPipelineRate(t, 3, realTPM/3, pbChunkItems/2) })
	}
	if part("cost") {
		t.Run("cost", benchPipelineCost)
	}
}

// benchPipelineRate fills one work queue with more chat work than eleven
// server minutes take, starts the server and subs subscribers on that queue,
// each with -model-server-tpm tpm, and stops them after eleven server
// minutes: the server's ledger of those minutes, then what became of every
// message.
func benchPipelineRate(t *testing.T, subs, tpm, items int) {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 0)
	works := newChatLoad(uint64(subs)).works("pipe", pbChunks*pbChunkItems/items, items)
	if err := jobq.Send(t.Context(), client, urls.Work, works); err != nil {
		t.Fatal(err)
	}
	srv := fakeoai.New(fakeoai.Config{Speed: pbSpeed, TokenLatency: pbTokenLatency, MaxNumSeqs: 1024,
		Limits: fakeoai.RateLimits{TPM: pbTPM, RPM: pbRPM}})
	defer srv.Close()
	start := time.Now() // the server's minute 0 began at New
	var bs []*benchSub
	// All made before any starts: New reads the device, and a server
	// with requests waiting (vllm:num_requests_waiting) has no room.
	for range subs {
		bs = append(bs, newBenchSub(t, client, urls, srv, tpm))
	}
	for _, b := range bs {
		b.start(t)
	}
	time.Sleep(time.Until(start.Add(pbServerMinutes(pbMinutes + 0.05))))
	st := srv.Stats() // before shutdown: its grace would run into minute 11
	if len(st.Minutes) <= pbMinutes {
		t.Fatalf("the server's ledger has %d minutes; want %d complete", len(st.Minutes), pbMinutes)
	}
	shutdownAll(t, bs)
	after := srv.Stats()
	o := settle(t, client, urls, len(works), bs)
	// Answers the server gave that no result holds: those of batches
	// handed back, whose tokens are spent again when they run again.
	t.Logf("shutdown took %v; the server answered %d requests 200 in all, %d of them in no result",
		time.Since(start)-pbServerMinutes(pbMinutes+0.05), after.ByStatus[200], after.ByStatus[200]-int64(o.ok))
	l := readPBLedger(st.Minutes, pbMinutes)
	name := fmt.Sprintf("%d subscriber(s) on one queue, -model-server-tpm %d each", subs, tpm)
	t.Logf("limits %d TPM, %d RPM per server minute; speed %d; %d server minutes; %d work messages of %d chat items sent\n"+
		"| consumer | tokens/min (minutes 1–10) | of TPM | of the most admissible | requests/min | of RPM | minute 0 of TPM | 429s after minute 0 | 429s in all |\n"+
		"|---|---|---|---|---|---|---|---|---|\n"+
		"| %s | %.0f | %.3f (min %.3f) | %.3f | %.0f | %.3f | %.3f | %d of %d (%.2f%%) | %d of %d (%.2f%%) |\n"+
		"| messages | results | duplicate results | back on the queue | in flight after shutdown | dead-lettered | lost | items ok | item errors | messages backed off | messages released | receives |\n"+
		"|---|---|---|---|---|---|---|---|---|---|---|---|\n"+
		"| %d | %d | %d | %d | %d | %d | %d | %d | %d | %.0f | %.0f | %.0f |",
		pbTPM, pbRPM, pbSpeed, pbMinutes, len(works), items,
		name, l.tpm, l.frac, l.minFrac, l.ofMost, l.rpm, l.fracReq, l.min0,
		l.limited, l.answers, pct(l.limited, l.answers), l.limitedAll, l.answersAll, pct(l.limitedAll, l.answersAll),
		o.sent, o.results, o.duplicates, o.left, o.inflight, o.dead, o.lost(), o.ok, o.itemErrors, o.backedOff, o.released, o.receives)
	var per []string
	for i, m := range st.Minutes[:pbMinutes] {
		per = append(per, fmt.Sprintf("%d: %d tokens (%.3f), %d requests, %d 429s of %d", i, m.Tokens, float64(m.Tokens)/pbTPM,
			m.Requests, m.RateLimited, m.Answers))
	}
	t.Logf("per minute:\n%s\nserver answers by status: %v", strings.Join(per, "\n"), st.ByStatus)
	for i, b := range bs {
		t.Logf("subscriber %d: ledger %+v", i, b.sub.Ledger())
	}
}

// benchPipelineCost is the subscriber's own cost: the same chat items
// through the subscriber and sent directly, against a server with no
// limits and no generation time, in rounds that alternate which goes first.
//
// CPU: a round's items at once. Through the subscriber, the queue is
// filled before it starts and its clock stops when it has deleted the last
// message (its result sent); each round has a subscriber of its own,
// made before its clock starts. Directly, the same number of requests
// with the backend's concurrency (16). CPU is this process's (getrusage):
// the fake server's, the same both ways, is in it; the emulator's is not.
//
// Latency: one message of one item at a time, from its send to its
// result's receive, against one direct call at a time: what the queue adds
// to a request, the emulator's SQS calls and the subscriber's batch delay
// included.
func benchPipelineCost(t *testing.T) {
	srv := fakeoai.New(fakeoai.Config{MaxNumSeqs: 1024})
	defer srv.Close()
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 0)
	direct := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	load := newChatLoad(7)
	ctx := t.Context()
	const rounds, chunks, seq = 6, 32, 50 // 32 × 32 = 1,024 requests a round each way
	var cpuD, cpuS time.Duration
	var nD, nS int
	var latD, latS []time.Duration
	var receives float64
	collector := jobq.NewCollector()
	waitResults := func(want int) {
		for len(collector.Results) < want {
			if _, err := collector.Poll(ctx, client, urls.Results, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	for r := range rounds {
		var b *benchSub
		for _, viaSub := range []bool{r%2 == 0, r%2 != 0} {
			works := load.works(fmt.Sprintf("cost%d%v", r, viaSub), chunks, pbChunkItems)
			if !viaSub {
				var items []job.Item
				for _, w := range works {
					items = append(items, w.Items...)
				}
				c0 := cputime.Process()
				sendDirect(t, direct, srv.URL(), items, modelserver.DefaultMaxConcurrency)
				cpuD += cputime.Process() - c0
				nD += len(items)
				continue
			}
			if err := jobq.Send(ctx, client, urls.Work, works); err != nil {
				t.Fatal(err)
			}
			b = newBenchSub(t, client, urls, srv, 0)
			c0 := cputime.Process()
			b.start(t)
			for b.sub.Ledger().Deleted < chunks {
				time.Sleep(10 * time.Millisecond)
			}
			cpuS += cputime.Process() - c0
			nS += chunks * pbChunkItems
			waitResults(len(collector.Results) + chunks)
		}
		for i := range seq {
			viaSub := (i+r)%2 == 0
			w := load.works(fmt.Sprintf("lat%d-%d", r, i), 1, 1)
			t0 := time.Now()
			if viaSub {
				if err := jobq.Send(ctx, client, urls.Work, w); err != nil {
					t.Fatal(err)
				}
				waitResults(len(collector.Results) + 1)
				latS = append(latS, time.Since(t0))
			} else {
				sendDirect(t, direct, srv.URL(), w[0].Items, 1)
				latD = append(latD, time.Since(t0))
			}
		}
		receives += promsum.Labelled(t, b.reg, "vramq_subscriber_sqs_requests_total", "action", "ReceiveMessage")
		shutdownAll(t, []*benchSub{b})
	}
	for k, r := range collector.Results {
		for _, o := range r.Outputs {
			if o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 {
				t.Fatalf("%v item %s: %+v; want the server's answer", k, o.ID, o)
			}
		}
	}
	if d, err := jobq.DrainDLQ(ctx, client, urls.DLQ); err != nil || len(d) != 0 {
		t.Errorf("%d dead letters (%v)", len(d), err)
	}
	q := func(l []time.Duration, p float64) time.Duration {
		slices.Sort(l)
		return l[int(p*float64(len(l)-1))]
	}
	perD, perS := cpuD/time.Duration(nD), cpuS/time.Duration(nS)
	t.Logf("CPU: %d chat requests each way in %d rounds (%d work messages of %d a round through the subscriber; 16 at once directly); "+
		"latency: %d one-item messages and %d direct calls, one at a time; %d results, %.0f receives\n"+
		"| path | CPU per request | p50 latency | p90 | p99 |\n|---|---|---|---|---|\n"+
		"| direct (net/http) | %v | %v | %v | %v |\n| through the subscriber and SQS | %v | %v | %v | %v |\n| added | %v | %v | %v | %v |",
		nD, rounds, chunks, pbChunkItems, len(latS), len(latD), len(collector.Results), receives,
		perD, q(latD, .5), q(latD, .9), q(latD, .99), perS, q(latS, .5), q(latS, .9), q(latS, .99),
		perS-perD, q(latS, .5)-q(latD, .5), q(latS, .9)-q(latD, .9), q(latS, .99)-q(latD, .99))
}

// sendDirect posts each item's body to the server, conc at a time, and
// fails on any answer but 200.
func sendDirect(t *testing.T, c *http.Client, base string, items []job.Item, conc int) {
	t.Helper()
	next := make(chan job.Item)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for range conc {
		wg.Go(func() {
			for it := range next {
				resp, err := c.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(it.Body)))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}
		})
	}
	for _, it := range items {
		next <- it
	}
	close(next)
	wg.Wait()
	if failed != nil {
		t.Fatalf("direct call: %v", failed)
	}
}
