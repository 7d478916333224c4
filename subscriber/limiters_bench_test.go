package subscriber_test

// Issue 33's measurement in real time: one real subscriber (the
// model-server backend, the emulator's SQS queues) against
// internal/testenv/fakeoai with each limiter kind it offers, its clock the
// real one, limits either configured (-model-server-tpm/-rpm) or learned
// from the server's headers. Not a pass/fail test: it prints what it
// measured, and bench/modelserver.md ("Against each limiter kind, in real
// time") records the figures and the command. It runs only when
// VRAMQ_BENCH_LIMITERS is set: 1 for every kind, or a comma-separated list
// of bucket, sliding-window, fixed-window, azure; VRAMQ_BENCH_LIMITERS_MINUTES
// is the complete minutes measured after minute 0 (default 4). Every kind
// and mode runs at once, each with a server, queues and subscriber of its
// own, when go test's -parallel allows (its default is GOMAXPROCS: pass
// -parallel 8).

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

const (
	lbTPM = 60000
	lbRPM = 600
	// lbTokenLatency is one generated token, real time: a 264-token answer
	// (the mean here) takes 1.3 s.
	lbTokenLatency = 5 * time.Millisecond
)

// limiterLoad makes the items: prompts of 50 to 2,000 tokens,
// max_tokens 16 to 512, a real output of 40 to 100% of it (fakeoai's
// [[len=N]]).
type limiterLoad struct {
	rng *rand.Rand
	n   int
}

func (l *limiterLoad) item() job.Item {
	l.n++
	id := fmt.Sprintf("i%d", l.n)
	prompt, maxTokens := 50+l.rng.IntN(1951), 16+l.rng.IntN(497)
	out := max(1, int(float64(maxTokens)*(0.4+0.6*l.rng.Float64())+0.5))
	// A chat prompt is its words plus 7 (fakeoai's ChatPromptTokens: 3 for
	// the message, 1 for the role, 3 priming the reply); three are below.
	text := fmt.Sprintf("[[len=%d]] item %s%s", out, id, strings.Repeat(" w", prompt-10))
	return job.Item{ID: id, Body: []byte(fmt.Sprintf(
		`{"model":"fake-model","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, text, maxTokens))}
}

func (l *limiterLoad) works(jobID string, chunks int) []job.Work {
	ws := make([]job.Work, chunks)
	for c := range ws {
		ws[c] = job.Work{V: job.Version, JobID: jobID, Chunk: c, Chunks: chunks, Endpoint: job.EndpointChatCompletions}
		for range pbChunkItems {
			ws[c].Items = append(ws[c].Items, l.item())
		}
	}
	return ws
}

// warnCounter keeps the subscriber's warnings: how many, and the first few.
type warnCounter struct {
	n     atomic.Int64
	mu    sync.Mutex
	first []string
}

func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnCounter) Handle(_ context.Context, r slog.Record) error {
	w.n.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.first) < 3 {
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
		w.first = append(w.first, b.String())
	}
	return nil
}
func (w *warnCounter) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnCounter) WithGroup(string) slog.Handler      { return w }

// lbResult is one kind and mode's figures.
type lbResult struct {
	name                      string
	charged, used, minCharged float64 // of TPM, minutes 1..N
	limited, answers          int64   // minutes 1..N
	sent, results, dead, left int
	ok                        int
	askedTwice, answeredTwice int
	answered                  int // 200s at the fake, the whole run
	warnings                  int64
	firstWarnings, perMinute  []string
	backedOff, released       float64
}

func TestBenchLimiters(t *testing.T) {
	which := os.Getenv("VRAMQ_BENCH_LIMITERS")
	if which == "" {
		t.Skip("set VRAMQ_BENCH_LIMITERS=1 (or a comma-separated list of bucket, sliding-window, fixed-window, azure) to run the real-time benchmark of one subscriber against each limiter kind (VRAMQ_BENCH_LIMITERS_MINUTES+1 minutes, default 5)")
	}
	if endpoint() == "" {
		t.Fatal("no SQS endpoint: set AWS_ENDPOINT_URL (eval \"$(localstack/emulator.sh env)\")")
	}
	minutes := 4
	if v := os.Getenv("VRAMQ_BENCH_LIMITERS_MINUTES"); v != "" {
		var err error
		if minutes, err = strconv.Atoi(v); err != nil || minutes < 1 {
			t.Fatalf("VRAMQ_BENCH_LIMITERS_MINUTES %q: want a positive number", v)
		}
	}
	var kinds []fakeoai.LimitKind
	for _, k := range []fakeoai.LimitKind{fakeoai.LimitBucket, fakeoai.LimitSlidingWindow, fakeoai.LimitFixedWindow, fakeoai.LimitAzure} {
		if which == "1" || slices.Contains(strings.Split(which, ","), string(k)) {
			kinds = append(kinds, k)
		}
	}
	var mu sync.Mutex
	var results []lbResult
	t.Run("runs", func(t *testing.T) {
		for i, k := range kinds {
			for _, configured := range []bool{true, false} {
				name := fmt.Sprintf("%s/learned", k)
				if configured {
					name = fmt.Sprintf("%s/configured", k)
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					r := benchLimiter(t, k, configured, minutes, uint64(i))
					r.name = name
					mu.Lock()
					results = append(results, r)
					mu.Unlock()
				})
			}
		}
	})
	slices.SortFunc(results, func(a, b lbResult) int { return strings.Compare(a.name, b.name) })
	var b strings.Builder
	fmt.Fprintf(&b, "TPM %d, RPM %d, real time, minutes 1–%d; one subscriber each, 32-item chunks\n", lbTPM, lbRPM, minutes)
	b.WriteString("| kind / limits | charged / TPM (min minute) | used / TPM | 429s after minute 0 | messages sent | results | dead-lettered | items answered 200 | items ok in results | goodput | items asked twice | items answered twice | backed off | released | warnings |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %.3f (%.3f) | %.3f | %d of %d (%.1f%%) | %d | %d | %d | %d | %d | %.2f | %d | %d | %.0f | %.0f | %d |\n",
			r.name, r.charged, r.minCharged, r.used, r.limited, r.answers, pct(r.limited, r.answers), r.sent, r.results, r.dead,
			r.answered, r.ok, float64(r.ok)/max(1, float64(r.answered)), r.askedTwice, r.answeredTwice, r.backedOff, r.released, r.warnings)
	}
	for _, r := range results {
		fmt.Fprintf(&b, "\n%s per minute (charged, used of TPM; requests; 429s of answers):\n  %s\n  first warnings: %q\n", r.name,
			strings.Join(r.perMinute, "\n  "), r.firstWarnings)
	}
	t.Log(b.String())
}

// benchLimiter runs one subscriber against a server of kind for minutes+1
// real minutes and reads what happened.
func benchLimiter(t *testing.T, kind fakeoai.LimitKind, configured bool, minutes int, seed uint64) lbResult {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 0)
	// More than the limit can take in the run (about 47 items a minute at
	// 1,290 tokens each, twice that in minute 0), so the queue never runs dry.
	chunks := (minutes+3)*2*lbTPM/1290/pbChunkItems + 2
	load := &limiterLoad{rng: rand.New(rand.NewPCG(seed, 33))}
	works := load.works("lim", chunks)
	if err := jobq.Send(t.Context(), client, urls.Work, works); err != nil {
		t.Fatal(err)
	}
	srv := fakeoai.NewUnstarted(fakeoai.Config{TokenLatency: lbTokenLatency, MaxNumSeqs: 1024,
		Limits: fakeoai.RateLimits{Kind: kind, TPM: lbTPM, RPM: lbRPM}})
	defer srv.Close()
	rec := fakeoai.NewRecorder(t, srv)
	start := time.Now() // the server's minute 0 began at NewUnstarted

	warns := &warnCounter{}
	logger := slog.New(warns)
	cfg := modelserver.Config{BaseURL: rec.URL(), Models: []string{"fake-model"}, Logger: logger}
	if configured {
		cfg.TPM, cfg.RPM = lbTPM, lbRPM
	}
	m, dev, err := modelserver.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(); _ = dev.Close() })
	b := &benchSub{reg: prometheus.NewRegistry(), done: make(chan struct{})}
	b.sub, err = subscriber.New(subscriber.Config{
		Queue: sqsqueue.New(client, urls.Work), Results: sqsqueue.New(client, urls.Results), DLQ: sqsqueue.New(client, urls.DLQ),
		Backend: m, Device: dev, Registerer: b.reg, Logger: logger,
		VRAMReserve: 1, // checkModelServer's: the device's memory is tokens
	})
	if err != nil {
		t.Fatal(err)
	}
	b.start(t)
	time.Sleep(time.Until(start.Add(time.Duration(minutes+1)*time.Minute + 3*time.Second)))
	st := srv.Stats()
	if len(st.Minutes) <= minutes {
		t.Fatalf("the server's ledger has %d minutes; want %d complete", len(st.Minutes), minutes+1)
	}
	shutdownAll(t, []*benchSub{b})
	o := settle(t, client, urls, len(works), []*benchSub{b})

	r := lbResult{sent: o.sent, results: o.results, dead: o.dead, left: o.left, ok: o.ok, backedOff: o.backedOff, released: o.released,
		warnings: warns.n.Load(), firstWarnings: warns.first, minCharged: 1e9}
	var charged, used int64
	for i, mi := range st.Minutes[:minutes+1] {
		r.perMinute = append(r.perMinute, fmt.Sprintf("%d: %.3f, %.3f; %d; %d of %d", i, float64(mi.Tokens)/lbTPM,
			float64(mi.PromptTokens+mi.CompletionTokens)/lbTPM, mi.Requests, mi.RateLimited, mi.Answers))
		if i == 0 {
			continue
		}
		charged += mi.Tokens
		used += mi.PromptTokens + mi.CompletionTokens
		r.limited += mi.RateLimited
		r.answers += mi.Answers
		r.minCharged = min(r.minCharged, float64(mi.Tokens)/lbTPM)
	}
	r.charged = float64(charged) / float64(minutes*lbTPM)
	r.used = float64(used) / float64(minutes*lbTPM)
	for _, statuses := range rec.Answers() {
		if len(statuses) > 1 {
			r.askedTwice++
		}
		oks := 0
		for _, s := range statuses {
			if s == 200 {
				oks++
			}
		}
		r.answered += oks
		if oks > 1 {
			r.answeredTwice++
		}
	}
	return r
}
