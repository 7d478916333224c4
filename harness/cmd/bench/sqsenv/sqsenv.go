// Package sqsenv is the SQS endpoint the overhead and memory benchmarks
// measure against: one client on it (straight, or through a proxy that adds
// latency), the SDK's retried receives counted, fresh queues for every run,
// and the small messages they pre-load.
package sqsenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/testenv/faultproxy"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
)

// NoopDevice is the simulated device the no-op model (timed.Noop) runs on: any size will
// do, the model allocates nothing from it.
func NoopDevice() *gpu.Sim { return gpu.NewSim(1 << 30) }

// TinyWorks are n work messages of one item of a few words: small messages,
// so that the figures are about calls and per-message work, not bytes.
func TinyWorks(jobID string, n int) []job.Work {
	return workload.Load{JobID: jobID, Messages: n, ChunkItems: 1, Sizes: workload.Sizes{Kind: workload.Fixed, Words: 4}}.Works()
}

// Env is what the overhead and RSS runs share: one SQS client on the
// endpoint under test, with the SDK's retries of ReceiveMessage counted (a
// retried receive can strand up to ten messages until their visibility
// timeout, which shows as a slow run).
type Env struct {
	Client         *sqs.Client
	ReceiveRetries atomic.Int64
	prefix         string
	queues         int
}

// New reaches the endpoint straight, or, with latency, through a proxy
// that holds every call that long before forwarding it. apiOption, when not
// nil, is added to the client's middleware (the overhead's timeline).
func New(ctx context.Context, stderr io.Writer, apiOption func(*middleware.Stack) error, latency time.Duration) (*Env, error) {
	e := &Env{}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg, err := awsconfig.Load(ctx, slog.New(RetryCounter{log.Handler(), &e.ReceiveRetries}))
	if err != nil {
		return nil, err
	}
	opts := []func(*sqs.Options){func(o *sqs.Options) {
		if apiOption != nil {
			o.APIOptions = append(o.APIOptions, apiOption)
		}
	}}
	if latency > 0 {
		target := Endpoint()
		if target == "" {
			return nil, fmt.Errorf("%w: -latency needs the endpoint in AWS_ENDPOINT_URL", cli.ErrUsage)
		}
		p, err := faultproxy.New(target, faultproxy.Faults{Slow: 1, SlowDelay: latency})
		if err != nil {
			return nil, err
		}
		context.AfterFunc(ctx, func() { _ = p.Close() })
		e.Client = p.SQS(cfg, opts...)
	} else {
		e.Client = sqs.NewFromConfig(cfg, opts...)
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	e.prefix = "bench-" + hex.EncodeToString(b[:]) + "-"
	return e, nil
}

// RetryCounter passes SDK log records on, counting retried receives in N.
type RetryCounter struct {
	slog.Handler
	N *atomic.Int64
}

// Enabled takes warnings whatever the wrapped handler takes: the SDK logs
// its retries at warn, and slog asks Enabled before Handle, so over a
// handler that drops everything (the strategies' slog.DiscardHandler) no
// retry was ever counted.
func (h RetryCounter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.Handler.Enabled(ctx, l)
}

func (h RetryCounter) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "retrying request SQS/ReceiveMessage") {
		h.N.Add(1)
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

// FreshQueues makes a work, results and dead-letter queue no other run has
// used, and returns a function that deletes them.
func (e *Env) FreshQueues(ctx context.Context) (localstack.URLs, func(), error) {
	e.queues++
	urls, err := localstack.Create(ctx, e.Client, localstack.Options{Prefix: e.prefix + strconv.Itoa(e.queues) + "-"})
	drop := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = localstack.Delete(ctx, e.Client, urls)
	}
	if err != nil {
		drop()
		return localstack.URLs{}, nil, err
	}
	return urls, drop, nil
}

// Preload puts works on the queue at url, ten per call, several calls at
// once: loading is not what is measured, so it goes as fast as it can.
func (e *Env) Preload(ctx context.Context, url string, works []job.Work) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := 0; i < len(works); i += 10 {
		b := works[i:min(i+10, len(works))]
		g.Go(func() error { return jobq.Send(ctx, e.Client, url, b) })
	}
	return g.Wait()
}

// Endpoint is the SQS endpoint under test, for the report.
func Endpoint() string {
	for _, k := range []string{"AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "AWS (no endpoint override)"
}
