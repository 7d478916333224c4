// Command publisher serves the vramq job API (POST /v1/jobs, GET
// /v1/jobs/{id}) over HTTP, or, when started by AWS Lambda (the
// AWS_LAMBDA_RUNTIME_API variable is set), as a Lambda function behind API
// Gateway HTTP API or a function URL. Every flag has an environment variable
// of the same meaning; -h lists them.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/publisher"
)

func main() {
	cli.Main("publisher", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stderr) })
}

var errUsage = cli.ErrUsage

// Timeouts of the HTTP server. A whole request may carry MaxBodyBytes (32 MiB
// by default) from a slow client, and a job's chunks take a while to send;
// the header timeout alone is what stops slow-loris connections.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = time.Minute
	writeTimeout      = 2 * time.Minute
	idleTimeout       = 2 * time.Minute
)

type options struct {
	queueURL, bucket     string
	addr                 string
	apiKeys, apiKeysFile string
	maxMessage, maxItem  gpu.Bytes
	maxBody              gpu.Bytes
	metrics              bool
	shutdownGrace        time.Duration
	logFormat, logLevel  string
	cfg                  publisher.Config
}

func parse(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{maxBody: 32 << 20}
	c := &o.cfg
	fs := flag.NewFlagSet("publisher", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.queueURL, "queue-url", "", "URL of the work queue (required)")
	fs.StringVar(&o.bucket, "payload-bucket", "", "S3 bucket for large items, job manifests, idempotency records and results;\nwithout it large items are refused and GET /v1/jobs/{id} answers 501")
	fs.StringVar(&o.addr, "addr", ":8080", "HTTP listen address (not used under Lambda)")
	fs.StringVar(&o.apiKeys, "api-keys", "", "comma-separated bearer API keys accepted on /v1/jobs (none: no auth)")
	fs.StringVar(&o.apiKeysFile, "api-keys-file", "", "file of bearer API keys, one per line (# comments), added to -api-keys")
	fs.Var(&o.maxMessage, "max-message-bytes", "largest work message (0: the queue's MaximumMessageSize; lower only)")
	fs.Var(&o.maxBody, "max-body-bytes", "largest request body")
	fs.IntVar(&c.MaxItems, "max-items", 10_000, "most items in one job")
	fs.Var(&o.maxItem, "max-item-bytes", "largest item carried inline; larger ones go to S3 (0: what fits in a message)")
	fs.IntVar(&c.ChunkItems, "chunk-items", 32, "most items per chunk, unless the request's options.chunk_items says otherwise")
	fs.IntVar(&c.MaxChunkItems, "max-chunk-items", 1_000, "largest options.chunk_items a request may ask for")
	fs.IntVar(&c.SendAttempts, "send-attempts", 5, "sends of one SendMessageBatch entry that SQS lists as failed, the first included")
	fs.BoolVar(&o.metrics, "metrics", true, "serve /metrics (Prometheus) on the same server")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", 25*time.Second, "how long in-flight requests may finish after SIGTERM")
	fs.StringVar(&o.logFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	if err := envflag.Parse(fs, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if o.queueURL == "" {
		return nil, fmt.Errorf("%w: missing -queue-url (or QUEUE_URL)", errUsage)
	}
	keys, err := apiKeys(o.apiKeys, o.apiKeysFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	c.APIKeys = keys
	c.MaxBodyBytes, c.MaxItemBytes = int64(o.maxBody), int(o.maxItem)
	return o, nil
}

// apiKeys merges the comma-separated list and the file's lines, trimmed;
// blank lines and # comments in the file are skipped.
func apiKeys(list, file string) ([]string, error) {
	var keys []string
	for _, k := range strings.Split(list, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	if file == "" {
		return keys, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("-api-keys-file: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k := strings.TrimSpace(sc.Text()); k != "" && !strings.HasPrefix(k, "#") {
			keys = append(keys, k)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("-api-keys-file: %v", err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("-api-keys-file %s holds no keys: refusing to start without auth by mistake", file)
	}
	return keys, nil
}

// lambdaStart is lambda.Start; tests replace it.
var lambdaStart = func(h any) { lambda.Start(h) }

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := cli.NewLogger(stderr, o.logFormat, o.logLevel)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	awsCfg, err := awsconfig.Load(ctx, log)
	if err != nil {
		return fmt.Errorf("AWS configuration: %w", err)
	}
	client := sqs.NewFromConfig(awsCfg)
	// Read once, at start (a Lambda cold start): chunks are cut to what this
	// queue accepts.
	lim, err := publisher.QueueLimits(ctx, client, o.queueURL)
	if err != nil {
		return err
	}
	c := o.cfg
	c.MaxMessageBytes = lim.MaxMessageBytes
	if o.maxMessage > 0 {
		c.MaxMessageBytes = min(c.MaxMessageBytes, int(o.maxMessage))
	}
	c.Queue = publisher.NewSQSQueue(client, o.queueURL)
	if o.bucket != "" {
		c.Payloads = payload.New(awsconfig.S3(awsCfg, getenv), o.bucket)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c.Logger, c.Registerer = log, reg
	if !o.metrics {
		// Counted, not served: the Handler serves /metrics only from a
		// Registerer that is also a Gatherer.
		c.Registerer = struct{ prometheus.Registerer }{reg}
	}
	p, err := publisher.New(c)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	log.Info("publisher ready", "queue_url", o.queueURL, "payload_bucket", o.bucket, "max_message_bytes", c.MaxMessageBytes,
		"fifo", lim.FIFO, "auth", len(c.APIKeys) > 0)

	if getenv("AWS_LAMBDA_RUNTIME_API") != "" {
		lambdaStart(publisher.LambdaHandler(p.Handler()))
		return nil
	}
	return serve(ctx, o, p.Handler(), log)
}

// serve runs the HTTP server until ctx ends (SIGTERM, SIGINT), then stops
// accepting and lets in-flight requests finish within the grace period.
func serve(ctx context.Context, o *options, h http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", o.shutdownGrace)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still running past the grace are cut off; the ones that
		// were sending chunks answered nothing, and their clients retry
		// with their Idempotency-Key.
		log.Warn("shutdown grace over, closing open connections", "err", err)
		_ = srv.Close()
	}
	log.Info("publisher stopped")
	return nil
}
