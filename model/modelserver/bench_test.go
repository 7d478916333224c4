package modelserver

// The "Performance" figures for the model-server backend, against
// internal/testenv/fakeoai over TCP, its clock running Speed times as fast
// as the real one. Not a pass/fail test: it prints what it measured, and
// bench/modelserver.md records the figures and the command. It runs only
// when VRAMQ_BENCH_MODELSERVER is set, taking about four minutes.
//
// Every Run here is driven by a pool of callers standing in for the
// subscriber's admitted batches: each takes a batch of items, calls Run,
// and on an error (a fault.ErrBackoff included) sleeps until the time it
// names and runs the same batch again, as the subscriber hands the
// messages back and receives them later. The subscriber's own admission is
// not run: for the KV pool, admitter stands in for it, with its rule.

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/cputime"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
)

const (
	benchSpeed = 10 // server seconds per real second
	benchTPM   = 60000
	benchRPM   = 600
	// Each chat item asks for up to benchMaxTokens and generates 16 to 96
	// (fakeoai's [[len=N]]): the server charges prompt + max_tokens.
	benchMaxTokens = 128
	// One scheduler step per generated token, server time.
	benchTokenLatency = 20 * time.Millisecond
)

// workload hands out chat items: a prompt of 10 to 30 words and a natural
// output of 16 to 96 tokens; kvWork's are larger.
type workload struct {
	mu        sync.Mutex
	rng       *rand.Rand
	n         int
	maxTokens int
	words     [2]int // prompt words, min and max
	out       [2]int // natural output tokens, min and max
}

func newWorkload(seed uint64, maxTokens int, words, out [2]int) *workload {
	return &workload{rng: rand.New(rand.NewPCG(seed, 1)), maxTokens: maxTokens, words: words, out: out}
}

// next is an item and the tokens the server charges for it.
func (w *workload) next() (job.Item, int) {
	w.mu.Lock()
	w.n++
	id := fmt.Sprintf("i%d", w.n)
	nw := w.words[0] + w.rng.IntN(w.words[1]-w.words[0]+1)
	no := w.out[0] + w.rng.IntN(w.out[1]-w.out[0]+1)
	w.mu.Unlock()
	text := fmt.Sprintf("[[len=%d]] item %s%s", no, id, strings.Repeat(" word", nw-3))
	charged := fakeoai.ChatPromptTokens([]fakeoai.Message{{Role: "user", Content: text}}) + w.maxTokens
	return chatItem(id, text, w.maxTokens), charged
}

// tally counts what a consumer's items became.
type tally struct {
	ok, failed, handedBack, gaveUp atomic.Int64
}

// runPool drives m with workers callers of batch items each until ctx ends.
func runPool(ctx context.Context, m *Model, w *workload, workers, batch int, sem *admitter, tl *tally) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				items := make([]job.Item, batch)
				for i := range items {
					items[i], _ = w.next()
				}
				for ctx.Err() == nil {
					cost := int64(0)
					if sem != nil {
						if sem.receive(ctx) != nil {
							return
						}
						cost = m.Cost("", items)
						err := sem.acquire(ctx, cost)
						sem.started()
						if err != nil {
							return
						}
					}
					outs, err := m.Run(ctx, "", items)
					if sem != nil {
						sem.release(cost)
						sem.readDevice()
					}
					if err == nil {
						for _, o := range outs {
							if o.Error == nil && o.Response != nil && o.Response.StatusCode/100 == 2 {
								tl.ok.Add(1)
							} else {
								tl.failed.Add(1)
							}
						}
						break
					}
					if ctx.Err() != nil {
						return // in flight at the end: neither done nor lost
					}
					tl.handedBack.Add(int64(len(items)))
					wait := time.Second / benchSpeed
					if until, ok := fault.BackoffUntil(err); ok {
						wait = time.Until(until)
					}
					select {
					case <-ctx.Done():
						return
					case <-time.After(wait):
					}
				}
			}
		})
	}
	return &wg
}

// admitter stands in for the subscriber's vram admission
// (subscriber/admit.go, budget.go), with its rule: the
// messages are admitted in order, each holding its Cost, while the sum
// held is within the budget; the budget starts at the device's free memory
// plus the model's working set, less the reserve (1 byte, as
// cmd/subscriber sets it for a model server), is read again every
// budgetRefresh and after every batch (readDevice), and changes when two
// readings in a row agree within the subscriber's tolerance (1 MiB at that
// reserve), never above the device's total less the reserve. A message's cost is computed when it is
// received, and at most benchPrefetch messages wait for admission (the
// subscriber's Prefetch default), the callers standing for the messages
// held in all (MaxInflight).
type admitter struct {
	dev     backend.Memory
	waiting chan struct{}
	m       *Model
	mu      sync.Mutex
	cond    *sync.Cond
	size, budget, held,
	prev int64 // the last reading; -1 after one that did not count
	next, turn uint64
	resized    int
}

const (
	benchBudgetRefresh = 2 * time.Second / benchSpeed // the subscriber's default, in server time
	benchPrefetch      = 20
)

// receive takes a place among the messages waiting for admission.
func (a *admitter) receive(ctx context.Context) error {
	select {
	case a.waiting <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// started gives the place back: the message was admitted, or given up.
func (a *admitter) started() { <-a.waiting }

func newAdmitter(ctx context.Context, dev backend.Memory, m *Model) (*admitter, error) {
	a := &admitter{dev: dev, m: m, prev: -1, waiting: make(chan struct{}, benchPrefetch)}
	a.cond = sync.NewCond(&a.mu)
	b, err := a.reading()
	if err != nil {
		return nil, err
	}
	mi, err := dev.Read()
	if err != nil {
		return nil, err
	}
	a.size, a.budget = max(mi.Total-1, b), b
	context.AfterFunc(ctx, func() {
		a.mu.Lock()
		a.cond.Broadcast()
		a.mu.Unlock()
	})
	go func() {
		tick := time.NewTicker(benchBudgetRefresh)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				a.refresh()
			}
		}
	}()
	return a, nil
}

// reading is the subscriber's budgetFrom: free + working − reserve.
func (a *admitter) reading() (int64, error) {
	w := a.m.Working()
	mi, err := a.dev.Read()
	if err != nil {
		return 0, err
	}
	return mi.Free + w - 1, nil
}

func (a *admitter) refresh() {
	b, err := a.reading()
	if err != nil {
		return
	}
	// subscriber.budgetTolerance(backend.KVTokens, 1, pool, …): a 4096th
	// of the pool, in tokens.
	tol := a.size / 4096
	a.mu.Lock()
	defer a.mu.Unlock()
	prev := a.prev
	a.prev = b
	if prev < 0 || absDiff(prev, b) > tol {
		return
	}
	target := min(max(min(prev, b), 0), a.size)
	if absDiff(target, a.budget) <= tol {
		return
	}
	a.budget = target
	a.resized++
	a.cond.Broadcast()
}

// readDevice is the subscriber's reading after each batch: it only reads
// (the metrics, through Read), which is when the KV cache follows them.
func (a *admitter) readDevice() { _, _ = a.dev.Read() }

func (a *admitter) acquire(ctx context.Context, w int64) error {
	w = max(w, 1)
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.next
	a.next++
	for ctx.Err() == nil && (a.turn != t || a.held+w > a.budget) {
		a.cond.Wait()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	a.held += w
	a.turn++
	a.cond.Broadcast()
	return nil
}

func (a *admitter) release(w int64) {
	a.mu.Lock()
	a.held -= max(w, 1)
	a.cond.Broadcast()
	a.mu.Unlock()
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

// post sends one chat item's body directly, as the baselines do.
func post(ctx context.Context, c *http.Client, base string, it job.Item) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(string(it.Body)))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header, nil
}

// sdkDelay is openai-go's retry delay (internal/requestconfig): the
// server's retry-after-ms, else Retry-After, when within a minute; else
// 0.5 s × 2^retries capped at 8 s, less up to a quarter of jitter. The
// fallback is taken as server time, so it is divided by the speed.
func sdkDelay(h http.Header, retries int) time.Duration {
	if ms, err := strconv.ParseFloat(h.Get("retry-after-ms"), 64); err == nil && ms > 0 && ms <= 60000 {
		return time.Duration(ms * float64(time.Millisecond))
	}
	if s, err := strconv.ParseFloat(h.Get("Retry-After"), 64); err == nil && s > 0 && s <= 60 {
		return time.Duration(s * float64(time.Second))
	}
	d := min(time.Duration(float64(500*time.Millisecond)*math.Pow(2, float64(retries))), 8*time.Second)
	d -= time.Duration(rand.Float64() * 0.25 * float64(d))
	return d / benchSpeed
}

func retryable(status int) bool {
	return status == 408 || status == 409 || status == 429 || status >= 500
}

// runSDK is a fixed-concurrency consumer with openai-go's retries: 2
// retries, then the item is given up (the application would have to run
// it again: it is counted, and taken again).
func runSDK(ctx context.Context, c *http.Client, base string, w *workload, conc int, tl *tally) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				it, _ := w.next()
				for retries := 0; ; retries++ {
					status, h, err := post(ctx, c, base, it)
					if ctx.Err() != nil {
						return
					}
					if err == nil && status/100 == 2 {
						tl.ok.Add(1)
						break
					}
					if err == nil && !retryable(status) {
						tl.failed.Add(1)
						break
					}
					if retries == 2 {
						tl.gaveUp.Add(1)
						break
					}
					select {
					case <-ctx.Done():
						return
					case <-time.After(sdkDelay(h, retries)):
					}
				}
			}
		})
	}
	return &wg
}

// runCookbook is OpenAI's cookbook api_request_parallel_processor.py: its
// own buckets of max_requests_per_minute and max_tokens_per_minute (here
// 75% of the limits, in server minutes), full at the start, each request
// taking its exact token count; after a 429 it dispatches nothing for 15 s
// (server time) and retries the request, up to 5 attempts.
func runCookbook(ctx context.Context, c *http.Client, base string, w *workload, tl *tally) *sync.WaitGroup {
	const share = 0.75
	// Refilled per real minute; each holds one server minute's worth.
	rpm, tpm := share*benchRPM*benchSpeed, share*benchTPM*benchSpeed
	capR, capT := share*benchRPM, share*benchTPM
	reqCap, tokCap := capR, capT
	last := time.Now()
	var mu sync.Mutex
	var lastLimited time.Time
	type attempt struct {
		it     job.Item
		tokens int
		left   int
	}
	retry := make(chan attempt, 1<<16)
	var wg sync.WaitGroup
	wg.Go(func() {
		var next *attempt
		for ctx.Err() == nil {
			if next == nil {
				select {
				case a := <-retry:
					next = &a
				default:
					it, tok := w.next()
					next = &attempt{it: it, tokens: tok, left: 5}
				}
			}
			now := time.Now()
			dt := now.Sub(last).Minutes()
			last = now
			reqCap, tokCap = min(reqCap+rpm*dt, capR), min(tokCap+tpm*dt, capT)
			if reqCap >= 1 && tokCap >= float64(next.tokens) {
				reqCap -= 1
				tokCap -= float64(next.tokens)
				a := *next
				next = nil
				wg.Go(func() {
					status, _, err := post(ctx, c, base, a.it)
					switch {
					case ctx.Err() != nil:
					case err == nil && status/100 == 2:
						tl.ok.Add(1)
					case a.left > 1 && (err != nil || status == 429 || status >= 500):
						if status == 429 {
							mu.Lock()
							lastLimited = time.Now()
							mu.Unlock()
						}
						a.left--
						retry <- a
					case err == nil && status != 429 && status < 500:
						tl.failed.Add(1)
					default:
						tl.gaveUp.Add(1)
					}
				})
			}
			time.Sleep(time.Millisecond) // the cookbook's 0.001 s loop
			mu.Lock()
			pause := 15*time.Second/benchSpeed - time.Since(lastLimited)
			mu.Unlock()
			if pause > 0 {
				time.Sleep(pause)
			}
		}
	})
	return &wg
}

// ledger sums the server's minutes from index from, the last (partial) one
// left out: tokens and requests per minute, 429s and answers.
type ledger struct {
	minutes                                    int
	tpm, rpm, frac, fracReq, min0Frac, minFrac float64
	// ofMost is the tokens of every complete minute over the most the
	// server could admit in them: its bucket, full at the start, and a
	// refill of the limit per minute.
	ofMost                                   float64
	limited, answers, limitedAll, answersAll int64
	kv                                       float64
}

func readLedger(s *fakeoai.Server, from int) ledger {
	st := s.Stats()
	ms := st.Minutes[:len(st.Minutes)-1]
	var l ledger
	l.minFrac = math.Inf(1)
	var tok, req, all int64
	for i, m := range ms {
		all += m.Tokens
		l.limitedAll += m.RateLimited
		l.answersAll += m.Answers
		if i == 0 {
			l.min0Frac = float64(m.Tokens) / benchTPM
		}
		if i < from {
			continue
		}
		l.minutes++
		tok += m.Tokens
		req += m.Requests
		l.limited += m.RateLimited
		l.answers += m.Answers
		l.kv += m.KVUsage
		l.minFrac = min(l.minFrac, float64(m.Tokens)/benchTPM)
	}
	if l.minutes > 0 {
		l.tpm = float64(tok) / float64(l.minutes)
		l.rpm = float64(req) / float64(l.minutes)
		l.frac = l.tpm / benchTPM
		l.fracReq = l.rpm / benchRPM
		l.kv /= float64(l.minutes)
	}
	l.ofMost = float64(all) / float64(benchTPM*(len(ms)+1))
	return l
}

func (l ledger) row(name string, tl *tally) string {
	pct := func(a, b int64) float64 {
		if b == 0 {
			return 0
		}
		return 100 * float64(a) / float64(b)
	}
	return fmt.Sprintf("| %s | %.0f | %.3f (min %.3f) | %.3f | %.0f | %.3f | %.3f | %d of %d (%.2f%%) | %d of %d (%.2f%%) | %d | %d | %d | %d |",
		name, l.tpm, l.frac, l.minFrac, l.ofMost, l.rpm, l.fracReq, l.min0Frac,
		l.limited, l.answers, pct(l.limited, l.answers), l.limitedAll, l.answersAll, pct(l.limitedAll, l.answersAll),
		tl.ok.Load(), tl.failed.Load(), tl.gaveUp.Load(), tl.handedBack.Load())
}

const rateHeader = "| consumer | tokens/min (minutes 1–10) | of TPM | of the most admissible | requests/min | of RPM | minute 0 of TPM | 429s after minute 0 | 429s in all | items ok | item errors | given up | handed back |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|"

func rateServer() *fakeoai.Server {
	return fakeoai.New(fakeoai.Config{Speed: benchSpeed, TokenLatency: benchTokenLatency, MaxNumSeqs: 1024,
		Limits: fakeoai.RateLimits{TPM: benchTPM, RPM: benchRPM}})
}

func benchOpen(t *testing.T, s *fakeoai.Server, cfg Config) *Model {
	t.Helper()
	cfg.BaseURL = s.URL()
	cfg.Models = []string{"fake-model"}
	cfg.Logger = quiet()
	m, err := Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// serverMinutes is d minutes of the server's clock in real time.
func serverMinutes(d float64) time.Duration {
	return time.Duration(d * float64(time.Minute) / benchSpeed)
}

func TestBenchModelServer(t *testing.T) {
	if os.Getenv("VRAMQ_BENCH_MODELSERVER") == "" {
		t.Skip("set VRAMQ_BENCH_MODELSERVER=1 to run the model-server benchmarks (about four minutes)")
	}
	if which := os.Getenv("VRAMQ_BENCH_MODELSERVER"); which == "1" || strings.Contains(which, "rate") {
		t.Run("rate", benchRate)
	}
	if which := os.Getenv("VRAMQ_BENCH_MODELSERVER"); which == "1" || strings.Contains(which, "shared") {
		t.Run("shared", benchShared)
	}
	if which := os.Getenv("VRAMQ_BENCH_MODELSERVER"); which == "1" || strings.Contains(which, "kv") {
		t.Run("kv", func(t *testing.T) { benchKV(t, [2]int{100, 400}, [2]int{16, 256}, 512) })
		// Mostly short answers and a long tail: the spread a pool sized
		// for the average does not hold.
		t.Run("kv-wide", func(t *testing.T) { benchKV(t, [2]int{20, 200}, [2]int{16, 1024}, 1024) })
	}
	if which := os.Getenv("VRAMQ_BENCH_MODELSERVER"); which == "1" || strings.Contains(which, "cost") {
		t.Run("cost", benchCost)
	}
}

const (
	rateWorkers = 8
	rateBatch   = 8
	sdkConc     = 16
	rateMinutes = 11 // minute 0 and ten full minutes after it
)

// benchRate runs vramq, the SDK-style consumer and the cookbook-style one
// at once, each against a server of its own with the same limits, for
// eleven server minutes.
func benchRate(t *testing.T) {
	words, out := [2]int{10, 30}, [2]int{16, 96}
	sv, ss, sc := rateServer(), rateServer(), rateServer()
	defer sv.Close()
	defer ss.Close()
	defer sc.Close()
	m := benchOpen(t, sv, Config{MaxOutputTokens: benchMaxTokens})
	defer m.Close()
	var tv, ts, tc tally
	ctx, cancel := context.WithTimeout(t.Context(), serverMinutes(rateMinutes+0.05))
	defer cancel()
	wgs := []*sync.WaitGroup{
		runPool(ctx, m, newWorkload(1, benchMaxTokens, words, out), rateWorkers, rateBatch, nil, &tv),
		runSDK(ctx, ss.Client(), ss.URL(), newWorkload(1, benchMaxTokens, words, out), sdkConc, &ts),
		runCookbook(ctx, sc.Client(), sc.URL(), newWorkload(1, benchMaxTokens, words, out), &tc),
	}
	for _, wg := range wgs {
		wg.Wait()
	}
	t.Logf("limits %d TPM, %d RPM per server minute; speed %d; %d server minutes\n%s\n%s\n%s\n%s",
		benchTPM, benchRPM, benchSpeed, rateMinutes, rateHeader,
		readLedger(sv, 1).row(fmt.Sprintf("vramq (%d callers × %d items)", rateWorkers, rateBatch), &tv),
		readLedger(ss, 1).row(fmt.Sprintf("SDK-style, %d at once", sdkConc), &ts),
		readLedger(sc, 1).row("cookbook-style, 75%", &tc))
	t.Logf("vramq answers by row: %v", m.answersSnapshot())
}

// benchShared runs three Models, each with its own callers, against one
// server's limits.
func benchShared(t *testing.T) {
	words, out := [2]int{10, 30}, [2]int{16, 96}
	s := rateServer()
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), serverMinutes(rateMinutes+0.05))
	defer cancel()
	var tls [3]tally
	var wgs []*sync.WaitGroup
	var ms []*Model
	for i := range 3 {
		m := benchOpen(t, s, Config{MaxOutputTokens: benchMaxTokens})
		defer m.Close()
		ms = append(ms, m)
		wgs = append(wgs, runPool(ctx, m, newWorkload(uint64(10+i), benchMaxTokens, words, out), rateWorkers, rateBatch, nil, &tls[i]))
	}
	for _, wg := range wgs {
		wg.Wait()
	}
	var all tally
	var per []string
	for i := range tls {
		all.ok.Add(tls[i].ok.Load())
		all.failed.Add(tls[i].failed.Load())
		all.handedBack.Add(tls[i].handedBack.Load())
		per = append(per, fmt.Sprintf("model %d: %d ok, %d item errors, %d handed back; rows %v", i,
			tls[i].ok.Load(), tls[i].failed.Load(), tls[i].handedBack.Load(), ms[i].answersSnapshot()))
	}
	t.Logf("three Models sharing %d TPM, %d RPM; speed %d; %d server minutes\n%s\n%s\n%s", benchTPM, benchRPM, benchSpeed, rateMinutes,
		rateHeader, readLedger(s, 1).row("3 × vramq", &all), strings.Join(per, "\n"))
}

const (
	kvBlocks  = 2048 // × 16 tokens: 32,768 tokens of KV cache
	kvMinutes = 4
)

// benchKV runs vramq's admission (the stand-in) and a fixed concurrency
// tuned for the average request, at once, each against a KV pool of its
// own and no rate limits.
func benchKV(t *testing.T, words, out [2]int, kvMaxTokens int) {
	cfg := fakeoai.Config{Speed: benchSpeed, TokenLatency: benchTokenLatency, MaxNumSeqs: 4096, BlockSize: 16, NumGPUBlocks: kvBlocks}
	sv, sf := fakeoai.New(cfg), fakeoai.New(cfg)
	defer sv.Close()
	defer sf.Close()
	// The metrics are read at most a second of server time old, Config's
	// default at Speed 1.
	m, dev, err := openKV(t.Context(), Config{BaseURL: sv.URL(), Models: []string{"fake-model"}, Logger: quiet(),
		MaxOutputTokens: kvMaxTokens, MaxConcurrency: 4096, MetricsMaxAge: time.Second / benchSpeed})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mi, err := dev.Read()
	if err != nil {
		t.Fatal(err)
	}
	// The average request holds its prompt and, at its end, its output:
	// (100+400)/2 + 3+1+3 + (16+256)/2 tokens.
	avg := float64(words[0]+words[1])/2 + 7 + float64(out[0]+out[1])/2
	fixed := int(float64(kvBlocks*16) / avg)
	var tv, tf tally
	ctx, cancel := context.WithTimeout(t.Context(), serverMinutes(kvMinutes+0.05))
	defer cancel()
	sem, err := newAdmitter(ctx, dev, m)
	if err != nil {
		t.Fatal(err)
	}
	wgs := []*sync.WaitGroup{
		runPool(ctx, m, newWorkload(2, kvMaxTokens, words, out), 256, 1, sem, &tv),
		runSDK(ctx, sf.Client(), sf.URL(), newWorkload(2, kvMaxTokens, words, out), fixed, &tf),
	}
	for _, wg := range wgs {
		wg.Wait()
	}
	row := func(name string, s *fakeoai.Server, tl *tally) string {
		st := s.Stats()
		l := readLedger(s, 1)
		var gen int64
		for _, mm := range st.Minutes[1 : len(st.Minutes)-1] {
			gen += mm.PromptTokens + mm.CompletionTokens
		}
		return fmt.Sprintf("| %s | %.3f | %.3f | %d | %.0f | %.0f | %d | %d |", name, l.kv,
			float64(st.MaxKVBlocksUsed)/float64(st.NumGPUBlocks), st.Preemptions, l.rpm, float64(gen)/float64(l.minutes), st.MaxRunning, tl.ok.Load())
	}
	t.Logf("KV pool %d blocks × 16 tokens (capacity %d tokens); prompts %v words, outputs %v tokens, max_tokens %d; speed %d; %d server minutes\n"+
		"| consumer | KV use, mean of minutes 1–%d | KV high-water | preemptions | requests/min | prompt+completion tokens/min | most running | items ok |\n|---|---|---|---|---|---|---|---|\n%s\n%s",
		kvBlocks, mi.Total, words, out, kvMaxTokens, benchSpeed, kvMinutes, kvMinutes-1,
		row("vramq (the subscriber's rule, stood in)", sv, &tv),
		row(fmt.Sprintf("fixed concurrency %d (pool / average request of %.0f tokens)", fixed, avg), sf, &tf))
	aw, ao := (words[0]+words[1])/2, (out[0]+out[1])/2
	probe, charged := newWorkload(99, kvMaxTokens, [2]int{aw, aw}, [2]int{ao, ao}).next()
	dev.mu.Lock()
	retract, share := dev.retract, dev.share
	dev.mu.Unlock()
	t.Logf("vramq answers by row: %v; budget resized %d times, ending at %d tokens; %d retractions, share %.3f at the end; "+
		"Cost of an average item at the end: %d tokens (the server's worst case %d, %d+7 prompt)",
		m.answersSnapshot(), sem.resized, sem.budget, retract, share, m.Cost("", []job.Item{probe}), charged, aw)
}

// benchCost sends the same sequential requests directly and through Run,
// interleaved in rounds, against a server without limits or latency: the
// CPU time of the whole process (server included, the same for both) and
// each request's wall time.
func benchCost(t *testing.T) {
	s := fakeoai.New(fakeoai.Config{MaxNumSeqs: 1024})
	defer s.Close()
	m := benchOpen(t, s, Config{MaxOutputTokens: benchMaxTokens})
	defer m.Close()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	direct := &http.Client{Transport: tr}
	w := newWorkload(3, benchMaxTokens, [2]int{10, 30}, [2]int{16, 96})
	const rounds, per = 10, 1000
	var cpuD, cpuV time.Duration
	var latD, latV []time.Duration
	ctx := t.Context()
	for r := range rounds {
		for _, viaRun := range []bool{r%2 == 0, r%2 != 0} {
			c0 := cputime.Process()
			for range per {
				it, _ := w.next()
				t0 := time.Now()
				if viaRun {
					outs, err := m.Run(ctx, "", []job.Item{it})
					if err != nil || outs[0].Error != nil {
						t.Fatalf("Run: %v %+v", err, outs)
					}
					latV = append(latV, time.Since(t0))
				} else {
					if status, _, err := post(ctx, direct, s.URL(), it); err != nil || status != 200 {
						t.Fatalf("post: %d %v", status, err)
					}
					latD = append(latD, time.Since(t0))
				}
			}
			if viaRun {
				cpuV += cputime.Process() - c0
			} else {
				cpuD += cputime.Process() - c0
			}
		}
	}
	q := func(l []time.Duration, p float64) time.Duration {
		slices.Sort(l)
		return l[int(p*float64(len(l)-1))]
	}
	n := time.Duration(rounds * per)
	t.Logf("%d sequential chat requests each way, in %d interleaved rounds; CPU is the whole process's (getrusage), the fake server's included\n"+
		"| path | CPU per request | p50 latency | p90 | p99 |\n|---|---|---|---|---|\n"+
		"| direct (net/http) | %v | %v | %v | %v |\n| through Model.Run | %v | %v | %v | %v |\n| added by the backend | %v | %v | %v | %v |",
		rounds*per, rounds, cpuD/n, q(latD, .5), q(latD, .9), q(latD, .99), cpuV/n, q(latV, .5), q(latV, .9), q(latV, .99),
		(cpuV-cpuD)/n, q(latV, .5)-q(latD, .5), q(latV, .9)-q(latD, .9), q(latV, .99)-q(latD, .99))
}

func (m *Model) answersSnapshot() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int64, len(m.answers))
	for k, v := range m.answers {
		out[k] = v
	}
	return out
}
