// Command loadgen sends a synthetic workload straight to the work queue, waits
// for a result for every message (or for it to be dead-lettered), and prints a
// summary, with the subscriber's own counters when its /metrics is given.
// Every flag has an environment variable of the same meaning; -h lists them.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/internal/jobq"
	"github.com/vramq/vramq/internal/workload"
)

func main() {
	cli.Main("loadgen", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr) })
}

// Summary is what a run measured; -json writes it.
type Summary struct {
	Messages     int     `json:"messages"`
	Items        int     `json:"items"`
	Results      int     `json:"results"`
	Duplicates   int     `json:"duplicates"`
	DeadLettered int     `json:"dead_lettered"`
	Seconds      float64 `json:"seconds"`
	MessagesPerS float64 `json:"messages_per_second"`
	ItemsPerS    float64 `json:"items_per_second"`
	// Publisher mode only.
	ClaimChecked int `json:"claim_checked,omitempty"`
	Outputs      int `json:"outputs,omitempty"`
	// From the subscriber's /metrics, when given.
	OOMs        *float64 `json:"ooms,omitempty"`
	PeakBytes   *float64 `json:"peak_admitted_bytes,omitempty"`
	BudgetBytes *float64 `json:"budget_bytes,omitempty"`
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	queueURL := fs.String("queue-url", "", "URL of the work queue (required)")
	resultsURL := fs.String("results-queue-url", "", "URL of the results queue (required)")
	dlqURL := fs.String("dlq-url", "", "URL of the dead-letter queue, to count what lands there")
	messages := fs.Int("messages", 100, "work messages to send")
	largeEvery := fs.Int("large-every", 5, "every Nth message is a large one (0: none)")
	jobID := fs.String("job-id", "", "job id of the workload (default: loadgen-<time>)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up waiting for results after this long")
	metricsURL := fs.String("subscriber-metrics", "", "the subscriber's /metrics URL, for its OOM and budget figures")
	jsonOut := fs.String("json", "", "also write the summary as JSON to this file")
	publisherURL := fs.String("publisher-url", "", "send jobs through the publisher at this URL instead of straight to SQS")
	apiKey := fs.String("api-key", "", "bearer key for the publisher, when it requires one")
	jobs := fs.Int("jobs", 3, "jobs to post, with -publisher-url")
	hugeItem := fs.Int("huge-item-bytes", 0, "with -publisher-url: add one item of this many bytes to the first job (above the queue's message size it goes through S3)")
	if err := envflag.Parse(fs, args, getenv); err != nil {
		return err
	}
	if *publisherURL != "" {
		return runViaPublisher(ctx, &publisherRun{url: *publisherURL, apiKey: *apiKey, jobs: *jobs, perJob: *messages, hugeItem: *hugeItem, stderr: stderr},
			*timeout, *metricsURL, *jsonOut, stdout, stderr)
	}
	if *queueURL == "" || *resultsURL == "" {
		return errors.New("-queue-url and -results-queue-url are required")
	}
	if *jobID == "" {
		*jobID = "loadgen-" + time.Now().UTC().Format("20060102T150405")
	}
	cfg, err := awsconfig.Load(ctx, nil)
	if err != nil {
		return err
	}
	client := sqs.NewFromConfig(cfg)

	spec := workload.Mixed(*jobID, *messages)
	spec.LargeEvery = *largeEvery
	works := spec.Works()
	s := Summary{Messages: len(works)}
	for _, w := range works {
		s.Items += len(w.Items)
	}
	start := time.Now()
	if err := jobq.Send(ctx, client, *queueURL, works); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "loadgen: sent %d messages (%d items, every %dth large) as job %s\n", s.Messages, s.Items, *largeEvery, *jobID)

	c := jobq.NewCollector()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	lastPrint, lastDLQ := time.Now(), time.Now()
	for len(c.Results)+s.DeadLettered < s.Messages {
		got, err := c.Poll(ctx, client, *resultsURL, 1)
		if err != nil {
			return fmt.Errorf("after %d of %d results: %w", len(c.Results), s.Messages, err)
		}
		// The DLQ is read when results stall or now and then, not every
		// round: each read long-polls, and that would pace the results.
		if *dlqURL != "" && (got == 0 || time.Since(lastDLQ) > 2*time.Second) {
			lastDLQ = time.Now()
			dead, err := jobq.DrainDLQ(ctx, client, *dlqURL)
			if err != nil {
				return err
			}
			for _, d := range dead {
				fmt.Fprintf(stderr, "loadgen: dead-lettered: %s\n", d.Reason)
			}
			s.DeadLettered += len(dead)
		}
		if time.Since(lastPrint) > 2*time.Second {
			fmt.Fprintf(stderr, "loadgen: %d/%d results, %d dead-lettered, %.0fs\n", len(c.Results), s.Messages, s.DeadLettered, time.Since(start).Seconds())
			lastPrint = time.Now()
		}
	}
	s.Seconds = time.Since(start).Seconds()
	s.Results, s.Duplicates = len(c.Results), c.Duplicates
	s.MessagesPerS = float64(s.Results) / s.Seconds
	done := 0
	for _, r := range c.Results {
		done += len(r.Outputs)
	}
	s.ItemsPerS = float64(done) / s.Seconds

	if err := finish(ctx, &s, *metricsURL, *jsonOut, stdout, stderr); err != nil {
		return err
	}
	if s.Results+s.DeadLettered < s.Messages {
		return fmt.Errorf("%d messages unaccounted for", s.Messages-s.Results-s.DeadLettered)
	}
	return nil
}

func runViaPublisher(ctx context.Context, r *publisherRun, timeout time.Duration, metricsURL, jsonOut string, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var s Summary
	samples, err := r.run(ctx, &s)
	if err != nil {
		return err
	}
	if err := finish(ctx, &s, metricsURL, jsonOut, stdout, stderr); err != nil {
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

// finish adds the subscriber's figures, prints the summary and writes it as JSON.
func finish(ctx context.Context, s *Summary, metricsURL, jsonOut string, stdout, stderr io.Writer) error {
	if metricsURL != "" {
		m, err := scrape(ctx, metricsURL)
		if err != nil {
			fmt.Fprintf(stderr, "loadgen: reading subscriber metrics: %v\n", err)
		} else {
			s.OOMs = m["vramq_subscriber_oom_retries_total"]
			s.PeakBytes = m["vramq_subscriber_inflight_bytes_peak"]
			s.BudgetBytes = m["vramq_subscriber_budget_bytes"]
		}
	}
	print(stdout, *s)
	if jsonOut != "" {
		b, _ := json.MarshalIndent(s, "", "  ")
		return os.WriteFile(jsonOut, append(b, '\n'), 0o644)
	}
	return nil
}

func print(w io.Writer, s Summary) {
	fmt.Fprintf(w, "\n  messages sent     %d (%d items)\n", s.Messages, s.Items)
	if s.ClaimChecked > 0 {
		fmt.Fprintf(w, "  through S3        %d item(s) (claim-check, hash verified by the subscriber)\n", s.ClaimChecked)
	}
	fmt.Fprintf(w, "  results           %d (%d duplicate messages collapsed)\n", s.Results, s.Duplicates)
	fmt.Fprintf(w, "  dead-lettered     %d\n", s.DeadLettered)
	fmt.Fprintf(w, "  time              %.1fs: %.1f messages/s, %.0f items/s\n", s.Seconds, s.MessagesPerS, s.ItemsPerS)
	if s.OOMs != nil {
		fmt.Fprintf(w, "  out of memory     %.0f (batches that hit OOM and were split or run alone)\n", *s.OOMs)
	}
	if s.PeakBytes != nil && s.BudgetBytes != nil && *s.BudgetBytes > 0 {
		fmt.Fprintf(w, "  peak budget use   %s of %s (%.0f%%)\n", gpu.FormatBytes(int64(*s.PeakBytes)), gpu.FormatBytes(int64(*s.BudgetBytes)), 100**s.PeakBytes / *s.BudgetBytes)
	}
}

// scrape reads a Prometheus text endpoint into name → value (summed over
// labels), for counters and gauges.
func scrape(ctx context.Context, url string) (map[string]*float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]*float64{}
	for name, mf := range mfs {
		var v float64
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		out[name] = &v
	}
	return out, nil
}
