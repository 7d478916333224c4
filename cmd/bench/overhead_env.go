package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/faultproxy"
	"github.com/vramq/vramq/internal/jobq"
	"github.com/vramq/vramq/internal/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
)

// noopDevice is the simulated device the no-op model (timed.Noop) runs on: any size will
// do, the model allocates nothing from it.
func noopDevice() *gpu.Sim { return gpu.NewSim(1 << 30) }

// tinyWorks are n work messages of one item of a few words: small messages,
// so that the figures are about calls and per-message work, not bytes.
func tinyWorks(jobID string, n int) []job.Work {
	return workload.Load{JobID: jobID, Messages: n, ChunkItems: 1, Sizes: workload.Sizes{Kind: workload.Fixed, Words: 4}}.Works()
}

// benchEnv is what the overhead and RSS runs share: one SQS client on the
// endpoint under test, with the SDK's retries of ReceiveMessage counted (a
// retried receive can strand up to ten messages until their visibility
// timeout, which shows as a slow run).
type benchEnv struct {
	client         *sqs.Client
	receiveRetries atomic.Int64
	prefix         string
	queues         int
	discarded      int // runs thrown away for a retried receive
	// tl records the consumer runs' calls when -timeline is set; nil
	// otherwise. run names the run in progress for it.
	tl  *timeline
	run struct {
		variant string
		trial   int
		summary string // the timeline's summary of the run last ended
	}
}

// newBenchEnv reaches the endpoint straight, or, with latency, through a
// proxy that holds every call that long before forwarding it.
func newBenchEnv(ctx context.Context, stderr io.Writer, tl *timeline, latency time.Duration) (*benchEnv, error) {
	e := &benchEnv{tl: tl}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg, err := awsconfig.Load(ctx, slog.New(retryCounter{log.Handler(), &e.receiveRetries}))
	if err != nil {
		return nil, err
	}
	opts := []func(*sqs.Options){func(o *sqs.Options) {
		if tl != nil {
			o.APIOptions = append(o.APIOptions, tl.apiOption)
		}
	}}
	if latency > 0 {
		target := endpoint()
		if target == "" {
			return nil, fmt.Errorf("%w: -latency needs the endpoint in AWS_ENDPOINT_URL", cli.ErrUsage)
		}
		p, err := faultproxy.New(target, faultproxy.Faults{Slow: 1, SlowDelay: latency})
		if err != nil {
			return nil, err
		}
		context.AfterFunc(ctx, func() { _ = p.Close() })
		e.client = p.SQS(cfg, opts...)
	} else {
		e.client = sqs.NewFromConfig(cfg, opts...)
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	e.prefix = "bench-" + hex.EncodeToString(b[:]) + "-"
	return e, nil
}

// begin is a consumer run's start: its clock, and the timeline's.
func (e *benchEnv) begin() time.Time { return e.tl.begin(e.run.variant, e.run.trial) }

// end is a consumer run's end after n messages: the time since start. The
// timeline's summary of the run is left in e.run.summary.
func (e *benchEnv) end(start time.Time, n int) time.Duration {
	took := time.Since(start)
	e.run.summary = e.tl.end(took, n)
	return took
}

// retryCounter passes SDK log records on, counting retried receives.
type retryCounter struct {
	slog.Handler
	n *atomic.Int64
}

// Enabled takes warnings whatever the wrapped handler takes: the SDK logs
// its retries at warn, and slog asks Enabled before Handle, so over a
// handler that drops everything (the strategies' slog.DiscardHandler) no
// retry was ever counted.
func (h retryCounter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.Handler.Enabled(ctx, l)
}

func (h retryCounter) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "retrying request SQS/ReceiveMessage") {
		h.n.Add(1)
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

// freshQueues makes a work, results and dead-letter queue no other run has
// used, and returns a function that deletes them.
func (e *benchEnv) freshQueues(ctx context.Context) (localstack.URLs, func(), error) {
	e.queues++
	urls, err := localstack.Create(ctx, e.client, localstack.Options{Prefix: e.prefix + strconv.Itoa(e.queues) + "-"})
	drop := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = localstack.Delete(ctx, e.client, urls)
	}
	if err != nil {
		drop()
		return localstack.URLs{}, nil, err
	}
	return urls, drop, nil
}

// preload puts works on the queue at url, ten per call, several calls at
// once: loading is not what is measured, so it goes as fast as it can.
func (e *benchEnv) preload(ctx context.Context, url string, works []job.Work) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := 0; i < len(works); i += 10 {
		b := works[i:min(i+10, len(works))]
		g.Go(func() error { return jobq.Send(ctx, e.client, url, b) })
	}
	return g.Wait()
}

// loadAverage is the machine's 1, 5 and 15 minute load averages, as
// /proc/loadavg gives them, to say how busy it was; "unknown" elsewhere.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// publish prints a command's report, puts it in its section of the
// Markdown file md (when set) and writes rep as JSON to jsonOut (when set).
func publish(stdout io.Writer, report, md, section, jsonOut string, rep any) error {
	fmt.Fprint(stdout, report)
	if md != "" {
		if err := updateSection(md, section, report); err != nil {
			return err
		}
	}
	if jsonOut == "" {
		return nil
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(jsonOut, append(b, '\n'), 0o644)
}
