package rss

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/harness/cmd/bench/sqsenv"
	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

// rssChild is the hidden argument that makes `bench rss` the subscriber
// whose memory is measured: a process of its own, so that its RSS is the
// subscriber's alone, not the loader's or the sampler's.
const rssChild = "subscriber-child"

// runRSSChild is the subscriber of `bench rss`: the no-op model, the
// library's defaults, until SIGTERM.
func runRSSChild(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench rss "+rssChild, flag.ContinueOnError)
	fs.SetOutput(stderr)
	work := fs.String("queue-url", "", "work queue")
	results := fs.String("results-queue-url", "", "results queue")
	dlq := fs.String("dlq-url", "", "dead-letter queue")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg, err := awsconfig.Load(ctx, log)
	if err != nil {
		return err
	}
	client := sqs.NewFromConfig(cfg)
	sub, err := subscriber.New(subscriber.Config{
		Queue:       sqsqueue.New(client, *work),
		Results:     sqsqueue.New(client, *results),
		DLQ:         sqsqueue.New(client, *dlq),
		Backend:     backend.InProcess{Model: timed.Noop{}},
		Device:      sqsenv.NoopDevice(),
		VRAMReserve: 1 << 20,
		WaitTime:    time.Second,
		Logger:      log,
		Registerer:  prometheus.NewRegistry(),
	})
	if err != nil {
		return err
	}
	return sub.Run(ctx)
}
