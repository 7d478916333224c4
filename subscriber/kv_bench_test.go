package subscriber_test

// Issue 33's KV benchmark through the real subscriber: 32-item chunks of chat
// completions on the emulator's SQS queue, a subscriber wired as
// cmd/subscriber wires -model-server against a vLLM-style KV pool
// (internal/testenv/fakeoai: 2,048 blocks of 16 tokens, no rate limit), and a
// fixed-concurrency client against a pool of its own, in the same run. Not a
// pass/fail test: it prints what it measured, and bench/modelserver.md ("KV
// through the subscriber") records the figures and the command. It runs only
// when VRAMQ_BENCH_KV is set.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/promsum"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

const (
	kvbBlocks  = 2048 // × 16 tokens: 32,768 tokens of KV cache
	kvbMinutes = 4    // server minutes: minute 0, then 1–3 measured
	kvbChunks  = 150  // more than four server minutes take, so the queue never runs dry
	// The spread: prompts of 50–2,000 tokens, max_tokens 16–512,
	// real outputs 40–100% of max_tokens.
	kvbPromptMin, kvbPromptMax = 50, 2000
	kvbMaxTokMin, kvbMaxTokMax = 16, 512
)

// kvLoad makes the chat items. The fake counts a token per word
// plus 7 for the chat template (fakeoai.ChatPromptTokens).
type kvLoad struct {
	mu  sync.Mutex
	rng *rand.Rand
	n   int
}

func (l *kvLoad) item() job.Item {
	l.mu.Lock()
	l.n++
	id := fmt.Sprintf("k%d", l.n)
	prompt := kvbPromptMin + l.rng.IntN(kvbPromptMax-kvbPromptMin+1)
	maxTok := kvbMaxTokMin + l.rng.IntN(kvbMaxTokMax-kvbMaxTokMin+1)
	out := max(1, int(float64(maxTok)*(0.4+0.6*l.rng.Float64())))
	l.mu.Unlock()
	text := fmt.Sprintf("[[len=%d]] item %s%s", out, id, strings.Repeat(" w", max(0, prompt-7-3)))
	return job.Item{ID: id, Body: json.RawMessage(fmt.Sprintf(
		`{"model":"fake-model","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, text, maxTok))}
}

func TestBenchPipelineKV(t *testing.T) {
	if os.Getenv("VRAMQ_BENCH_KV") == "" {
		t.Skip("set VRAMQ_BENCH_KV=1 to run the KV benchmark of the subscriber against a vLLM-style pool (about a minute)")
	}
	if endpoint() == "" {
		t.Fatal("no SQS endpoint: set AWS_ENDPOINT_URL (eval \"$(localstack/emulator.sh env)\")")
	}
	cfg := fakeoai.Config{Speed: pbSpeed, TokenLatency: pbTokenLatency, MaxNumSeqs: 4096, BlockSize: 16, NumGPUBlocks: kvbBlocks}
	sv, sf := fakeoai.New(cfg), fakeoai.New(cfg)
	defer sv.Close()
	defer sf.Close()

	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 0)
	load := &kvLoad{rng: rand.New(rand.NewPCG(33, 4))}
	works := make([]job.Work, kvbChunks)
	for c := range works {
		works[c] = job.Work{V: job.Version, JobID: "kv", Chunk: c, Chunks: kvbChunks, Endpoint: job.EndpointChatCompletions}
		for range pbChunkItems {
			works[c].Items = append(works[c].Items, load.item())
		}
	}
	if err := jobq.Send(t.Context(), client, urls.Work, works); err != nil {
		t.Fatal(err)
	}

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	// As cmd/subscriber wires -model-server, with the times that are about
	// the server's pace divided by its speed (the other benchmarks' rule),
	// and the default -model-server-concurrency: with the cache followed,
	// one request per block, so that admission alone bounds the requests.
	d := subscriber.DefaultConfig()
	m, err := modelserver.Open(t.Context(), modelserver.Config{BaseURL: sv.URL(), Models: []string{"fake-model"},
		MaxOutputTokens: kvbMaxTokMax, MaxWait: modelserver.DefaultMaxWait / pbSpeed,
		MetricsMaxAge: modelserver.DefaultMetricsMaxAge / pbSpeed, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	reg := prometheus.NewRegistry()
	sub, err := subscriber.New(subscriber.Config{
		Queue: sqsqueue.New(client, urls.Work), Results: sqsqueue.New(client, urls.Results), DLQ: sqsqueue.New(client, urls.DLQ),
		Backend: m, Registerer: reg, Logger: quiet, VRAMReserve: 1,
		InferenceTimeout: d.InferenceTimeout / pbSpeed, AdmitTimeout: d.AdmitTimeout / pbSpeed, BudgetRefresh: d.BudgetRefresh / pbSpeed,
	})
	if err != nil {
		t.Fatal(err)
	}

	// Fixed concurrency tuned for the average request: the pool over its
	// average prompt and output.
	avg := float64(kvbPromptMin+kvbPromptMax)/2 + 0.7*float64(kvbMaxTokMin+kvbMaxTokMax)/2
	fixed := int(float64(kvbBlocks*16) / avg)
	ctx, cancel := context.WithTimeout(t.Context(), pbServerMinutes(kvbMinutes+0.05))
	defer cancel()
	subCtx, stopSub := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(subCtx) }()
	var fixedOK atomic.Int64
	var wg sync.WaitGroup
	for range fixed {
		wg.Go(func() {
			for ctx.Err() == nil {
				it := load.item()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sf.URL()+"/v1/chat/completions", strings.NewReader(string(it.Body)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := sf.Client().Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					fixedOK.Add(1)
				}
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
	stopSub()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}

	row := func(name string, s *fakeoai.Server, ok int64) string {
		st := s.Stats()
		var kv float64
		var req, toks int64
		ms := st.Minutes[1:kvbMinutes]
		for _, mm := range ms {
			kv += mm.KVUsage
			req += mm.Answers
			toks += mm.PromptTokens + mm.CompletionTokens
		}
		n := float64(len(ms))
		return fmt.Sprintf("| %s | %.3f | %.3f | %d | %.0f | %.0f | %d | %d |", name, kv/n,
			float64(st.MaxKVBlocksUsed)/float64(st.NumGPUBlocks), st.Preemptions, float64(req)/n, float64(toks)/n, st.MaxRunning, ok)
	}
	results := promsum.Sum(t, reg, "vramq_subscriber_results_sent_total")
	t.Logf("KV pool %d blocks × 16 tokens; prompts %d–%d tokens, max_tokens %d–%d, outputs 40–100%% of it; %d-item chunks; speed %d; %d server minutes\n"+
		"| consumer | KV use, mean of minutes 1–%d | KV high-water | preemptions | answers/min | prompt+completion tokens/min | most running | items ok |\n|---|---|---|---|---|---|---|---|\n%s\n%s\n"+
		"vramq: %v chunks' results sent (%v items)",
		kvbBlocks, kvbPromptMin, kvbPromptMax, kvbMaxTokMin, kvbMaxTokMax, pbChunkItems, pbSpeed, kvbMinutes, kvbMinutes-1,
		row("vramq (subscriber, 32-item chunks)", sv, int64(results)*pbChunkItems),
		row(fmt.Sprintf("fixed concurrency %d (pool / average request of %.0f tokens)", fixed, avg), sf, fixedOK.Load()),
		results, results*pbChunkItems)
}
