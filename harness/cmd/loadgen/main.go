// Command loadgen sends a synthetic workload, straight to the work queue or
// through the publisher's API, waits for a result for every message (or for
// it to be dead-lettered), and prints a summary: throughput, end-to-end
// latency percentiles, SQS requests per message, and the subscriber's own
// counters (OOMs, redeliveries, peak budget use) when its /metrics is given.
// Every flag has an environment variable of the same meaning; -h lists them.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"golang.org/x/time/rate"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/internal/testenv/workload"
)

func main() {
	cli.Main("loadgen", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr) })
}

// Summary is what a run measured; -json writes it.
type Summary struct {
	Sizes string  `json:"sizes"`
	Jobs  int     `json:"jobs"`
	Rate  float64 `json:"rate_per_second"` // messages/s asked for; 0 for as fast as possible

	Messages     int `json:"messages"`
	Items        int `json:"items"`
	Results      int `json:"results"`
	Duplicates   int `json:"duplicates"`
	DeadLettered int `json:"dead_lettered"`
	// RetriedResults counts chunks whose first result came from a message
	// received more than once (the result's attempt above 1). Direct mode
	// only.
	RetriedResults int     `json:"results_after_redelivery"`
	Seconds        float64 `json:"seconds"`
	MessagesPerS   float64 `json:"messages_per_second"`
	ItemsPerS      float64 `json:"items_per_second"`
	// Latency is from a message's send to its first result; LatencySource
	// says how the result was seen.
	Latency       *Latency `json:"latency_seconds,omitempty"`
	LatencySource string   `json:"latency_source,omitempty"`
	// LoadgenRequests are loadgen's own SQS calls by action.
	LoadgenRequests   map[string]float64 `json:"loadgen_sqs_requests,omitempty"`
	LoadgenPerMessage map[string]float64 `json:"loadgen_sqs_requests_per_message,omitempty"`
	// Publisher mode only.
	ClaimChecked int `json:"claim_checked,omitempty"`
	Outputs      int `json:"outputs,omitempty"`
	// From the subscriber's /metrics, when given: counters as grown during
	// the run, gauges as they are at its end.
	OOMs        *float64 `json:"ooms,omitempty"`
	PeakBytes   *float64 `json:"peak_admitted_bytes,omitempty"`
	BudgetBytes *float64 `json:"budget_bytes,omitempty"`
	// With a model server, the subscriber counts its KV cache in tokens
	// instead of bytes: these two are set, the two above are not.
	PeakKVTokens         *float64           `json:"peak_admitted_kv_tokens,omitempty"`
	BudgetKVTokens       *float64           `json:"budget_kv_tokens,omitempty"`
	SubscriberReceived   *float64           `json:"subscriber_received,omitempty"`
	Redeliveries         *float64           `json:"redeliveries,omitempty"`
	SubscriberRequests   map[string]float64 `json:"subscriber_sqs_requests,omitempty"`
	SubscriberPerMessage map[string]float64 `json:"subscriber_sqs_requests_per_message,omitempty"`
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	queueURL := fs.String("queue-url", "", "URL of the work queue (required without -publisher-url)")
	resultsURL := fs.String("results-queue-url", "", "URL of the results queue (required without -publisher-url)")
	dlqURL := fs.String("dlq-url", "", "URL of the dead-letter queue, to count what lands there")
	messages := fs.Int("messages", 100, "work messages per job (with -publisher-url: messages' worth of items per job), when -items is 0")
	items := fs.Int("items", 0, "items per job (0: -messages messages per job)")
	jobs := fs.Int("jobs", 0, "jobs to send (0: 1, or 3 with -publisher-url)")
	sizes := fs.String("sizes", string(workload.Bimodal), "item-size distribution: "+
		"bimodal (small messages, every -large-every-th a large one), fixed (-words), uniform (-min-words to -max-words), "+
		"heavy (a Pareto tail of index -alpha from -min-words, cut at -max-words)")
	largeEvery := fs.Int("large-every", 5, "bimodal: every Nth message is a large one (0: none)")
	words := fs.Int("words", 24, "fixed: words per item")
	minWords := fs.Int("min-words", 24, "uniform, heavy: fewest words per item (heavy: also the most common length)")
	maxWords := fs.Int("max-words", 600, "uniform, heavy: most words per item (the reference model reads up to 512 tokens, a word each)")
	alpha := fs.Float64("alpha", 1.2, "heavy: Pareto tail index (smaller: heavier tail)")
	chunkItems := fs.Int("chunk-items", 0, "items per message for fixed, uniform and heavy (0: 8); "+
		"with -publisher-url, the jobs' chunk_items option (0: the publisher's default)")
	seed := fs.Uint64("seed", 1, "seed of the item texts and lengths")
	ratePerS := fs.Float64("rate", 0, "messages per second, token-paced (0: as fast as possible)")
	senders := fs.Int("senders", 4, "SendMessageBatch calls in flight at once")
	collectors := fs.Int("collectors", 2, "results-queue readers")
	jobID := fs.String("job-id", "", "job id of the workload; several jobs are <id>-0, <id>-1, ... (default: loadgen-<time>)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up waiting for results after this long")
	metricsURL := fs.String("subscriber-metrics", "",
		"the subscriber's /metrics URL, for its OOMs, redeliveries, SQS requests and budget figures")
	jsonOut := fs.String("json", "", "also write the summary as JSON to this file")
	publisherURL := fs.String("publisher-url", "", "send jobs through the publisher at this URL instead of straight to SQS")
	apiKey := fs.String("api-key", "", "bearer key for the publisher, when it requires one")
	hugeItem := fs.Int("huge-item-bytes", 0, "with -publisher-url: add one item of this many bytes to the first job "+
		"(above the queue's message size it goes through S3)")
	if err := envflag.Parse(fs, args, getenv); err != nil {
		return err
	}
	kind, err := workload.ParseKind(*sizes)
	if err != nil {
		return fmt.Errorf("%w: -sizes: %v", cli.ErrUsage, err)
	}
	dist := workload.Sizes{Kind: kind, Words: *words, Min: *minWords, Max: *maxWords, Alpha: *alpha}
	if kind == workload.Bimodal {
		dist = workload.MixedSizes()
		dist.LargeEvery = *largeEvery
	}
	if *jobs == 0 {
		*jobs = 1
		if *publisherURL != "" {
			*jobs = 3
		}
	}
	if *jobID == "" {
		*jobID = "loadgen-" + time.Now().UTC().Format("20060102T150405")
	}
	load := workload.Load{JobID: *jobID, Jobs: *jobs, Items: *items, Messages: *messages, Sizes: dist, Seed: *seed}
	if *publisherURL == "" {
		load.ChunkItems = *chunkItems
	}
	if err := load.Validate(); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if *ratePerS < 0 || *senders < 1 || *collectors < 1 || *chunkItems < 0 {
		return fmt.Errorf("%w: -rate must not be negative, -senders and -collectors at least 1, -chunk-items not negative", cli.ErrUsage)
	}
	// Calls of up to ten messages, but no more than a tenth of a second's
	// worth, so that a low rate is paced message by message, not in bursts.
	batch := 10
	var limiter *rate.Limiter
	if *ratePerS > 0 {
		batch = min(max(int(*ratePerS/10), 1), 10)
		limiter = rate.NewLimiter(rate.Limit(*ratePerS), batch)
	}
	s := Summary{Sizes: dist.String(), Jobs: *jobs, Rate: *ratePerS}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var before scrape
	if *metricsURL != "" {
		if before, err = fetchMetrics(ctx, *metricsURL); err != nil {
			fmt.Fprintf(stderr, "loadgen: reading subscriber metrics before the run (its counters are taken from zero): %v\n", err)
		}
	}

	if *publisherURL != "" {
		r := &publisherRun{url: *publisherURL, apiKey: *apiKey, load: load, chunkItems: *chunkItems, hugeItem: *hugeItem,
			limiter: limiter, stderr: stderr}
		samples, err := r.run(ctx, &s)
		if err != nil {
			return err
		}
		if err := finish(ctx, &s, before, *metricsURL, *jsonOut, stdout, stderr); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "\n  a few results (GET /v1/jobs/{id}):")
		for _, line := range samples {
			fmt.Fprintln(stdout, "    "+line)
		}
		if s.Outputs != s.Items {
			return fmt.Errorf("%d outputs for %d items", s.Outputs, s.Items)
		}
		return nil
	}

	if *queueURL == "" || *resultsURL == "" {
		return fmt.Errorf("%w: -queue-url and -results-queue-url are required", cli.ErrUsage)
	}
	cfg, err := awsconfig.Load(ctx, nil)
	if err != nil {
		return err
	}
	var counter requestCounter
	client := sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, counter.add) })
	works := load.Works()
	s.Messages = len(works)
	for _, w := range works {
		s.Items += len(w.Items)
	}
	pace := "as fast as possible"
	if limiter != nil {
		pace = fmt.Sprintf("at %g messages/s", *ratePerS)
	}
	fmt.Fprintf(stderr, "loadgen: sending %d messages (%d items, %s) in %d job(s) %s, %s\n", s.Messages, s.Items, dist, *jobs, *jobID, pace)
	r := &directRun{client: client, workURL: *queueURL, resultsURL: *resultsURL, dlqURL: *dlqURL, works: works,
		limiter: limiter, batch: batch, senders: *senders, collectors: *collectors, stderr: stderr, maxDeadLetterReasonsLog: 10}
	if err := r.run(ctx, &s); err != nil {
		return err
	}
	s.LatencySource = "results queue, read as they come"
	s.LoadgenRequests = counter.counts()
	s.LoadgenPerMessage = perMessage(s.LoadgenRequests, s.Messages)
	return finish(ctx, &s, before, *metricsURL, *jsonOut, stdout, stderr)
}

// finish adds the subscriber's figures, prints the summary and writes it as JSON.
func finish(ctx context.Context, s *Summary, before scrape, metricsURL, jsonOut string, stdout, stderr io.Writer) error {
	if metricsURL != "" {
		after, err := fetchMetrics(ctx, metricsURL)
		if err != nil {
			fmt.Fprintf(stderr, "loadgen: reading subscriber metrics: %v\n", err)
		} else {
			for _, w := range s.addSubscriber(before, after) {
				fmt.Fprintf(stderr, "loadgen: %s\n", w)
			}
		}
	}
	printSummary(stdout, *s)
	if jsonOut != "" {
		b, err := json.MarshalIndent(s, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(jsonOut, append(b, '\n'), 0o644)
	}
	return nil
}

func printSummary(w io.Writer, s Summary) {
	pace := "as fast as possible"
	if s.Rate > 0 {
		pace = fmt.Sprintf("paced at %g messages/s", s.Rate)
	}
	fmt.Fprintf(w, "\n  workload          %d job(s), item sizes %s, %s\n", s.Jobs, s.Sizes, pace)
	fmt.Fprintf(w, "  messages sent     %d (%d items)\n", s.Messages, s.Items)
	if s.ClaimChecked > 0 {
		fmt.Fprintf(w, "  through S3        %d item(s) (claim-check, hash verified by the subscriber)\n", s.ClaimChecked)
	}
	fmt.Fprintf(w, "  results           %d (%d duplicate messages collapsed, %d after a redelivery)\n",
		s.Results, s.Duplicates, s.RetriedResults)
	fmt.Fprintf(w, "  dead-lettered     %d\n", s.DeadLettered)
	fmt.Fprintf(w, "  time              %.1fs: %.1f messages/s, %.0f items/s\n", s.Seconds, s.MessagesPerS, s.ItemsPerS)
	if l := s.Latency; l != nil {
		fmt.Fprintf(w, "  latency           p50 %s  p90 %s  p99 %s  max %s (send to result; %s)\n",
			secs(l.P50), secs(l.P90), secs(l.P99), secs(l.Max), s.LatencySource)
	}
	if s.OOMs != nil {
		fmt.Fprintf(w, "  out of memory     %.0f (batches that hit OOM and were split or run alone)\n", *s.OOMs)
	}
	if s.Redeliveries != nil {
		fmt.Fprintf(w, "  redeliveries      %.0f (subscriber receives beyond one per message)\n", *s.Redeliveries)
	}
	if s.PeakBytes != nil && s.BudgetBytes != nil && *s.BudgetBytes > 0 {
		fmt.Fprintf(w, "  peak budget use   %s of %s (%.0f%%)\n",
			bytesize.Format(int64(*s.PeakBytes)), bytesize.Format(int64(*s.BudgetBytes)), 100**s.PeakBytes / *s.BudgetBytes)
	}
	if s.PeakKVTokens != nil && s.BudgetKVTokens != nil && *s.BudgetKVTokens > 0 {
		fmt.Fprintf(w, "  peak budget use   %.0f of %.0f KV tokens (%.0f%%)\n",
			*s.PeakKVTokens, *s.BudgetKVTokens, 100**s.PeakKVTokens / *s.BudgetKVTokens)
	}
	if s.SubscriberPerMessage != nil {
		fmt.Fprintf(w, "  SQS calls/message subscriber: %s\n", perMessageLine(s.SubscriberPerMessage))
	}
	if s.LoadgenPerMessage != nil {
		fmt.Fprintf(w, "                    loadgen:    %s\n", perMessageLine(s.LoadgenPerMessage))
	}
}

func secs(v float64) string {
	return time.Duration(v * float64(time.Second)).Round(time.Millisecond).String()
}

// perMessageLine lists the actions in name order, the total last.
func perMessageLine(m map[string]float64) string {
	var parts []string
	for _, a := range slices.Sorted(maps.Keys(m)) {
		if a != "total" {
			parts = append(parts, fmt.Sprintf("%s %.3f", a, m[a]))
		}
	}
	return strings.Join(append(parts, fmt.Sprintf("total %.3f", m["total"])), ", ")
}
