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
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/jobs"
)

func main() {
	cli.Main("publisher", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stderr) })
}

var errUsage = cli.ErrUsage

// Limits of the HTTP server. ReadHeaderTimeout is what stops slow-loris
// clients (a connection that trickles its headers holds a goroutine and a
// file descriptor); ReadTimeout allows a whole body of -max-body-bytes (32
// MiB by default) from a slow client. WriteTimeout runs from the end of the
// headers, so it covers reading the body, enqueueing (which goes on for up to
// 90 s when the client hangs up; see publisher's enqueue timeout) and writing
// the answer: a shorter one would cut the 202 of a job already on the queue.
// IdleTimeout closes keep-alive connections nobody uses; it is longer than
// the load balancer's idle timeout (120 s in infra/publisher.tf), as AWS
// advises, so that the balancer, not the publisher, closes an idle
// connection and never sends a request down one being closed (a 502).
// MaxHeaderBytes
// is far above an Authorization and an Idempotency-Key header (net/http's
// default is 1 MiB); more is answered 431.
var limits = serverLimits{
	readHeader: 10 * time.Second,
	read:       time.Minute,
	write:      time.Minute + 90*time.Second + 30*time.Second,
	idle:       150 * time.Second,
	maxHeader:  64 << 10,
}

type serverLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeader                     int
}

func parse(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	c := &o.cfg
	fs := newFlagSet(o, stderr)
	if err := cli.Parse(fs, args, getenv); err != nil {
		return nil, err
	}
	if o.queueURL == "" {
		return nil, fmt.Errorf("%w: missing -queue-url (or QUEUE_URL)", errUsage)
	}
	if o.sweepInterval < 0 {
		return nil, fmt.Errorf("%w: %s must be 0 or more", errUsage, flagName("batch-sweep-interval"))
	}
	if o.metricsAddr != "" && o.metricsAddr == o.addr {
		return nil, fmt.Errorf("%w: %s is the API's address: /metrics must be served apart from the API", errUsage, flagName("metrics-addr"))
	}
	keys, err := apiKeys(o.apiKeys, o.apiKeysFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	c.APIKeys = keys
	c.MaxBodyBytes, c.MaxBodyBytesInFlight, c.MaxItemBytes = int64(o.maxBody), int64(o.maxInFlight), int(o.maxItem)
	c.MaxResultBytesInFlight, c.MaxPageBytes = int64(o.maxResultsInFlight), int64(o.maxPage)
	c.MaxBodyBytesPerClient, c.MinBodyRate = int64(o.maxClientBody), int64(o.minBodyRate)
	c.MaxResultBytesPerClient = int64(o.maxClientResults)
	if c.Models, err = models(o.models); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	c.MaxFileBytes, c.MaxFileLineBytes = int64(o.maxFile), int64(o.maxFileLine)
	c.ServedEndpoints = envflag.List(o.servedEndpoints)
	if c.TrustedProxies, err = prefixes(o.trustedProxies); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errUsage, flagName("trusted-proxies"), err)
	}
	// Check the flags now, before any AWS call, on a stand-in for the queue
	// at the largest message size; what depends on the real queue's size is
	// checked again once it is known.
	probe := *c
	probe.Queue, probe.Logger = noQueue{}, slog.New(slog.DiscardHandler)
	probe.MaxMessageBytes = job.MaxMessageBytes
	if o.maxMessage > 0 {
		probe.MaxMessageBytes = int(o.maxMessage)
	}
	if _, err := publisher.New(probe); err != nil {
		return nil, configError(err)
	}
	return o, nil
}

// noQueue stands in for the work queue while the flags are checked.
type noQueue struct{}

func (noQueue) SendBatch(context.Context, []jobs.Entry) ([]error, error) {
	return nil, errors.New("no queue")
}

// configError turns publisher.New's errors into a usage error that names,
// for each problem, the flag and the environment variable that set it.
func configError(err error) error {
	var lines []string
	for _, e := range cli.Leaves[*publisher.FieldError](err) {
		var fe *publisher.FieldError
		if errors.As(e, &fe) && configFlags[fe.Field] != "" {
			lines = append(lines, flagName(configFlags[fe.Field])+": "+fe.Err.Error())
		} else {
			lines = append(lines, e.Error())
		}
	}
	return fmt.Errorf("%w: invalid configuration:\n  %s", errUsage, strings.Join(lines, "\n  "))
}

// flagName is how errors name a flag: -max-items (VRAMQ_MAX_ITEMS).
func flagName(flag string) string { return "-" + flag + " (" + envflag.Name(flag) + ")" }

// prefixes reads a comma-separated list of CIDR blocks and addresses (an
// address is a block of one).
func prefixes(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range envflag.List(list) {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an address nor a CIDR block", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// models reads the comma-separated list of -models, trimmed. A list that is
// given but names no model ("," or " ") is refused: whoever wrote it meant
// to bound the models, and starting without a bound would take any.
func models(list string) ([]string, error) {
	out := envflag.List(list)
	if list != "" && len(out) == 0 {
		return nil, fmt.Errorf("%s names no model: refusing to start taking any model by mistake", flagName("models"))
	}
	return out, nil
}

// apiKeys merges the comma-separated list and the file's lines, trimmed;
// blank lines and # comments in the file are skipped. A list that is given
// but names no key ("," or " ") is refused, like an empty file: whoever wrote
// it meant auth to be on, and starting without it would fail open.
func apiKeys(list, file string) ([]string, error) {
	keys := envflag.List(list)
	if list != "" && len(keys) == 0 {
		return nil, fmt.Errorf("%s names no key: refusing to start without auth by mistake", flagName("api-keys"))
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
	c := o.cfg
	if o.apiKeysSecret != "" {
		keys, err := apiKeysFromSecret(ctx, secretsmanager.NewFromConfig(awsCfg), o.apiKeysSecret)
		if err != nil {
			return err
		}
		c.APIKeys = append(c.APIKeys, keys...)
	}
	client := sqs.NewFromConfig(awsCfg)
	// Read once, at start (a Lambda cold start): chunks are cut to what this
	// queue accepts.
	lim, err := jobs.QueueLimits(ctx, client, o.queueURL)
	if err != nil {
		return err
	}
	c.MaxMessageBytes = lim.MaxMessageBytes
	if o.maxMessage > 0 {
		c.MaxMessageBytes = min(c.MaxMessageBytes, int(o.maxMessage))
	}
	c.Queue = jobs.NewSQSQueue(client, o.queueURL)
	if o.bucket != "" {
		c.Payloads = payload.New(awsconfig.S3(awsCfg, getenv), o.bucket)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c.Logger, c.Registerer = log, reg
	p, err := publisher.New(c)
	if err != nil {
		return configError(err)
	}
	memLimit, memFrom := memoryLimit(int64(o.memoryLimit), getenv, os.ReadFile)
	if memLimit > 0 {
		debug.SetMemoryLimit(memLimit)
	}
	log.Info("publisher ready", "queue_url", o.queueURL, "payload_bucket", o.bucket, "max_message_bytes", c.MaxMessageBytes,
		"fifo", lim.FIFO, "auth", len(c.APIKeys) > 0, "rate_limit", c.RateLimit, "rate_burst", c.RateBurst,
		"global_rate_limit", c.GlobalRateLimit, "trusted_proxies", len(c.TrustedProxies),
		"memory_limit", debug.SetMemoryLimit(-1), "memory_limit_from", memFrom)

	if getenv("AWS_LAMBDA_RUNTIME_API") != "" {
		// No /metrics: API Gateway would route it to API clients, and
		// nothing scrapes a Lambda instance.
		lambdaStart(publisher.LambdaEvents(p.Handler(), p))
		return nil
	}
	if o.bucket != "" && o.sweepInterval > 0 {
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go p.RunSweeper(sctx, o.sweepInterval)
	}
	return serve(ctx, o, p.Handler(), p.MetricsHandler(), log)
}

// newServer is the HTTP server of h, with the limits l.
func newServer(h http.Handler, log *slog.Logger, l serverLimits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.readHeader, ReadTimeout: l.read,
		WriteTimeout: l.write, IdleTimeout: l.idle, MaxHeaderBytes: l.maxHeader,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
}

// metricsLimits are the limits of the /metrics server: a scrape is a small
// GET that Prometheus answers in well under a second.
var metricsLimits = serverLimits{
	readHeader: 5 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: time.Minute, maxHeader: 16 << 10,
}

// serve runs the API's HTTP server, and /metrics on its own listener when
// -metrics-addr is set, until ctx ends (SIGTERM, SIGINT), then stops
// accepting and lets in-flight requests finish within the grace period.
// The API's listener turns net/http's own error answers (431 and the like)
// into the API's JSON errors (api.JSONErrors).
func serve(ctx context.Context, o *options, h, metrics http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	srv := newServer(h, log, limits)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(api.JSONErrors(ln)) }()
	log.Info("serving", "addr", ln.Addr().String())
	if o.metricsAddr != "" && metrics != nil {
		mln, err := net.Listen("tcp", o.metricsAddr)
		if err != nil {
			_ = srv.Close()
			return fmt.Errorf("listening for /metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics)
		msrv := newServer(mux, log, metricsLimits)
		go func() { errc <- msrv.Serve(mln) }()
		defer msrv.Close()
		log.Info("serving /metrics", "addr", mln.Addr().String())
	}
	select {
	case err := <-errc:
		_ = srv.Close()
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
