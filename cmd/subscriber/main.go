// Command subscriber consumes the vramq work queue onto a device: the reference
// embedding model, or a BERT-family model directory (-model), on a
// simulated device in this build. Every flag has an
// environment variable of the same meaning; -h lists them. `subscriber
// healthcheck` asks a running subscriber's /livez, for container health
// checks in images without a shell.
package main

import (
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

	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/bert"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/snsevents"
	"github.com/vramq/vramq/subscriber/sqsqueue"
	"github.com/vramq/vramq/subscriber/taskprotect"
)

func main() {
	cli.Main("subscriber", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stderr) })
}

var errUsage = cli.ErrUsage

func parse(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	c := &o.cfg
	fs := newFlagSet(o, stderr)
	if err := cli.Parse(fs, args, getenv); err != nil {
		return nil, err
	}
	given := map[string]bool{} // on the command line or from the environment
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	c.Admission = subscriber.Strategy(o.admission)
	c.VRAMReserve, c.VRAMLimit = int64(o.reserve), int64(o.limit)
	c.MaxBatchBytes = int64(o.maxBatchBytes)
	c.Tenants = envflag.List(o.tenants)
	var missing []string
	for _, f := range []struct{ name, v string }{{"-queue-url", o.queueURL}, {"-results-queue-url", o.resultsURL}, {"-dlq-url", o.dlqURL}} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	// -calibrate touches no queue, so it needs none.
	if len(missing) > 0 && !o.calibrate {
		return nil, fmt.Errorf("%w: missing %s (or their environment variables)", errUsage, strings.Join(missing, ", "))
	}
	if o.model != "" && o.weights != "" {
		return nil, fmt.Errorf("%w: -model and -weights: -weights is the reference model's, give one or the other", errUsage)
	}
	if o.calibrateItems < 0 {
		return nil, fmt.Errorf("%w: -calibrate-items=%d: want 0 (the default) or more", errUsage, o.calibrateItems)
	}
	if o.calibratePoints < 2 {
		return nil, fmt.Errorf("%w: -calibrate-points=%d: want at least 2", errUsage, o.calibratePoints)
	}
	// ECS_AGENT_URI is the agent's own variable, set in every container of
	// an ECS task, so it is read as is rather than through a flag.
	switch agent := getenv("ECS_AGENT_URI"); o.taskProtection {
	case "auto":
		o.protectionURI = agent
	case "on":
		if agent == "" {
			return nil, fmt.Errorf("%w: -task-protection=on: ECS_AGENT_URI is not set (the ECS agent sets it in a task's containers)", errUsage)
		}
		o.protectionURI = agent
	case "off":
	default:
		return nil, fmt.Errorf("%w: -task-protection=%s: want auto, on or off", errUsage, o.taskProtection)
	}
	if err := checkModelServer(o, given); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := checkDevice(o.device); err != nil {
		return nil, fmt.Errorf("%w: -device=%s: %v", errUsage, o.device, err)
	}
	if _, err := cudaOptions(o); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	// Check the flags now, before the model loads: the queues, model and
	// device are set later, so their errors are left to subscriber.New.
	if err := configError(o.cfg.Validate(), true); err != nil {
		return nil, err
	}
	return o, nil
}

// configError turns subscriber.Config's errors into a usage error that
// names, for each problem, the flag and the environment variable that set
// it; nil when there are none. With flagsOnly, problems with fields no flag
// sets are left out.
func configError(err error, flagsOnly bool) error {
	var lines []string
	for _, e := range cli.Leaves[*subscriber.FieldError](err) {
		var fe *subscriber.FieldError
		switch {
		case errors.As(e, &fe) && configFlags[fe.Field] != "":
			f := configFlags[fe.Field]
			lines = append(lines, "-"+f+" ("+envflag.Name(f)+"): "+fe.Err.Error())
		case !flagsOnly:
			lines = append(lines, e.Error())
		}
	}
	if len(lines) == 0 {
		return nil
	}
	return fmt.Errorf("%w: invalid configuration:\n  %s", errUsage, strings.Join(lines, "\n  "))
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "healthcheck" {
		return healthcheck(ctx, args[1:], getenv, stderr)
	}
	o, err := parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := cli.NewLogger(stderr, o.logFormat, o.logLevel)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}

	// The registry comes first: the model server's backend registers its
	// own metrics when it opens.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var be backend.Backend
	if o.ms.url != "" {
		m, err := openModelServer(ctx, o, getenv, log, reg)
		if err != nil {
			return err
		}
		defer m.Close()
		be = m
	} else {
		dev, model, err := openBackend(o, log)
		if err != nil {
			return err
		}
		defer dev.Close()
		defer model.Close()
		if _, ok := model.(*bert.Embedder); o.model != "" && !ok {
			// A backend that does not run BERT must not serve another model
			// under a request for this one.
			return fmt.Errorf("%w: -model: the %s backend runs only the reference model; use -device=sim", errUsage, dev.Name())
		}
		if o.calibrate {
			return measureCostModel(ctx, o, dev, model, log, stderr)
		}
		if o.costModel != "" {
			if err := useCostModel(o, dev, model, log); err != nil {
				return err
			}
		}
		be = backend.InProcess{Model: model, Device: dev}
	}

	awsCfg, err := awsconfig.Load(ctx, log)
	if err != nil {
		return fmt.Errorf("AWS configuration: %w", err)
	}
	client := sqs.NewFromConfig(awsCfg)
	c := o.cfg
	c.Queue = sqsqueue.New(client, o.queueURL)
	c.Results = sqsqueue.New(client, o.resultsURL)
	c.DLQ = sqsqueue.New(client, o.dlqURL)
	c.Backend, c.Logger, c.Registerer = be, log, reg
	if o.payloadBucket != "" {
		c.Payloads = payload.New(awsconfig.S3(awsCfg, getenv), o.payloadBucket)
	}
	if o.eventsTopicARN != "" {
		c.Events = snsevents.New(sns.NewFromConfig(awsCfg), o.eventsTopicARN)
	}
	if o.protectionURI != "" {
		if c.TaskProtection, err = taskprotect.New(o.protectionURI, nil); err != nil {
			return fmt.Errorf("%w: -task-protection: %v", errUsage, err)
		}
		log.Info("ECS task scale-in protection on while messages are held", "agent", o.protectionURI, "expiry", c.TaskProtectionExpiry)
	}
	sub, err := subscriber.New(c)
	if err != nil {
		var fe *subscriber.FieldError
		if errors.As(err, &fe) {
			return configError(err, false)
		}
		return err
	}

	if o.metricsAddr != "" {
		srv, err := serve(o.metricsAddr, reg, sub, log)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	return sub.Run(ctx)
}

// prober is what the health endpoints ask (*subscriber.Subscriber).
type prober interface {
	Live() error
	Healthy() error
}

// serve exposes /metrics, /livez and /healthz. /livez is liveness, what a
// container health check asks (`subscriber healthcheck`): it fails only
// where a new process could do better. /healthz is readiness: it also fails
// while the model needs an operator (a spent quota, a refused key), which a
// replacement would meet again, after taking a round of messages and
// handing them back; vramq_subscriber_needs_operator on /metrics says the
// same. The listener is opened before Run so a port already in use fails
// the start, not a probe later.
func serve(addr string, reg *prometheus.Registry, sub prober, log *slog.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	probe := func(check func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if err := check(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		}
	}
	mux.HandleFunc("GET /livez", probe(sub.Live))
	mux.HandleFunc("GET /healthz", probe(sub.Healthy))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	srv := metricsServer(mux, metricsLimits)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	log.Info("serving /metrics, /livez and /healthz", "addr", ln.Addr().String())
	return srv, nil
}

// metricsLimits are the metrics server's. Its clients are Prometheus and
// health checks, which send small GETs, so every bound is tight: a slow-loris
// connection is cut after 5 s of trickled headers, a scrape (a few hundred
// series) has 30 s to be written, an idle keep-alive connection is closed
// after a minute, and headers over 16 KiB are answered 431.
var metricsLimits = serverLimits{
	readHeader: 5 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: time.Minute, maxHeader: 16 << 10,
}

type serverLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeader                     int
}

func metricsServer(h http.Handler, l serverLimits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.readHeader, ReadTimeout: l.read, WriteTimeout: l.write,
		IdleTimeout: l.idle, MaxHeaderBytes: l.maxHeader}
}

// healthcheck asks a running subscriber's /livez and fails unless it
// answers 200. It is for container health checks (an ECS task definition's
// healthCheck, Docker's HEALTHCHECK) in images that have no shell or curl,
// such as distroless: ["CMD", "/usr/local/bin/subscriber", "healthcheck"].
// Liveness, not /healthz: ECS replaces a task that fails its check, and a
// subscriber waiting for an operator is not helped by that.
func healthcheck(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	var ho healthcheckOptions
	if err := cli.Parse(newHealthcheckFlagSet(&ho, stderr), args, getenv); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(ho.metricsAddr)
	if err != nil || ho.metricsAddr == "" {
		return fmt.Errorf("%w: healthcheck: -metrics-addr=%q: want host:port", errUsage, ho.metricsAddr)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if ho.timeout <= 0 {
		return fmt.Errorf("%w: healthcheck: -timeout=%v: want a positive duration", errUsage, ho.timeout)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/livez", nil)
	if err != nil {
		return err
	}
	resp, err := healthClient(ho.timeout).Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// healthClient asks the local /livez only: no proxy from the environment
// (HTTP_PROXY would otherwise apply to a container's host name), no
// redirects followed (only the subscriber's own 200 counts), and the whole
// exchange, connecting included, within timeout.
func healthClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:             nil,
			DialContext:       (&net.Dialer{Timeout: timeout}).DialContext,
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
