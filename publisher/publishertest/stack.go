package publishertest

// The end-to-end environment of the publisher's tests, exported so that the
// tests with a provider's SDK as the client, which live in the harness's
// module (harness/sdkclients: the product's module may not require the SDKs,
// issue 32), run on the same publisher and subscriber as the package's own.

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

// Served is a publisher behind an httptest server, closed when the test ends.
type Served struct {
	Pub *publisher.Publisher
	Reg *prometheus.Registry // the publisher's metrics
	URL string
}

// Serve starts a publisher with cfg on the work queue workURL, with the
// queue's real limits: Queue, Payloads (store) and MaxMessageBytes are
// filled in where unset, Logger where nil (quiet), Registerer always. Its
// batch sweeper does not run: see Sweep.
func Serve(t testing.TB, client *sqs.Client, workURL string, store *payload.Store, cfg publisher.Config) *Served {
	t.Helper()
	lim, err := jobs.QueueLimits(t.Context(), client, workURL)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = lim.MaxMessageBytes
	}
	if cfg.Queue == nil {
		cfg.Queue = jobs.NewSQSQueue(client, workURL)
	}
	if cfg.Payloads == nil {
		cfg.Payloads = store
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Served{Reg: prometheus.NewRegistry()}
	cfg.Registerer = s.Reg
	if s.Pub, err = publisher.New(cfg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Pub.Handler())
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// Sweep runs pub's batch sweeper as server mode does, every second here,
// until the test ends.
func Sweep(t testing.TB, pub *publisher.Publisher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		pub.RunSweeper(ctx, time.Second)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// RunSubscriber runs a real subscriber of b on dev (nil for a backend
// that owns its memory), on the queues urls and the bucket of store, until
// the test ends.
func RunSubscriber(t testing.TB, client *sqs.Client, urls localstack.URLs, store *payload.Store, b backend.Backend, dev gpu.Device,
	logger *slog.Logger) {
	t.Helper()
	sub, err := subscriber.New(subscriberConfig(client, urls, store, b, dev, logger))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("subscriber: %v", err)
		}
	})
}

// subscriberConfig is RunSubscriber's configuration of a subscriber. Its
// reserve is by b's kind, as cmd/subscriber chooses its default: a model in
// this process keeps some of its device for the framework's allocations (1
// MiB of a simulated device here), whichever device it runs on; a model
// server's KV cache is counted in tokens, where such a reserve means nothing
// (1, the least Config takes).
func subscriberConfig(client *sqs.Client, urls localstack.URLs, store *payload.Store, b backend.Backend, dev gpu.Device,
	logger *slog.Logger) subscriber.Config {
	var reserve int64 = 1
	if _, inProcess := b.(backend.InProcess); inProcess {
		reserve = 1 << 20
	}
	return subscriber.Config{
		Queue:       sqsqueue.New(client, urls.Work),
		Results:     sqsqueue.New(client, urls.Results),
		DLQ:         sqsqueue.New(client, urls.DLQ),
		Payloads:    store,
		Backend:     b,
		Device:      dev,
		VRAMReserve: reserve,
		WaitTime:    time.Second, // short polls keep shutdown quick
		Visibility:  10 * time.Second,
		Logger:      logger,
		Registerer:  prometheus.NewRegistry(),
	}
}

// RefModel is the reference embedding model (model name "ref") on a
// simulated device with room for it, closed when the test ends.
func RefModel(t testing.TB) (gpu.Model, gpu.Device) {
	t.Helper()
	mcfg := refembed.DefaultConfig()
	w := refembed.GenerateWeights(mcfg)
	dev := gpu.NewSim(w.Bytes() + 64<<20)
	embedder, err := refembed.NewEmbedder(w, mcfg, dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = embedder.Close() })
	return embedder, dev
}

// ServerModel is the model-server backend on srv (model "fake-model"),
// which owns its memory (RunSubscriber's dev is nil for it), closed when
// the test ends.
func ServerModel(t testing.TB, srv *fakeoai.Server) backend.Backend {
	t.Helper()
	m, err := modelserver.Open(t.Context(), modelserver.Config{BaseURL: srv.URL(), Models: []string{"fake-model"},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}
