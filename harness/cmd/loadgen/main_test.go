package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

func noEnv(string) string { return "" }

func TestRunRefusesABadCommandLine(t *testing.T) {
	for _, args := range [][]string{
		{"-sizes=lognormal"},
		{"-sizes=uniform", "-min-words=10", "-max-words=5"},
		{"-messages=0"},
		{"-rate=-1"},
		{}, // no queues and no publisher
	} {
		err := run(t.Context(), args, noEnv, io.Discard, io.Discard)
		if !errors.Is(err, cli.ErrUsage) {
			t.Errorf("run(%q) = %v; want a usage error", args, err)
		}
	}
}

// flakyModel answers one tiny output per item, runs out of memory on
// batches of more than six items, and refuses the items of chunk 3 of every
// job as invalid: a workload that exercises the OOM, dead-letter and
// result counts of a run.
type flakyModel struct{}

func (flakyModel) Name() string                { return "flaky" }
func (flakyModel) Weights() int64              { return 0 }
func (flakyModel) Cost(items []job.Item) int64 { return int64(len(items)) }

func (flakyModel) Run(_ context.Context, items []job.Item) ([]job.Output, error) {
	if len(items) > 6 {
		return nil, fmt.Errorf("%d items: %w", len(items), gpu.ErrOutOfMemory)
	}
	out := make([]job.Output, len(items))
	for i, it := range items {
		if strings.HasPrefix(it.ID, "3-") {
			return nil, fmt.Errorf("item %s: %w", it.ID, fault.ErrInvalidInput)
		}
		out[i] = job.Output{ID: it.ID, Data: json.RawMessage("1")}
	}
	return out, nil
}

func TestDirectRunAccountsForEveryMessage(t *testing.T) {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	reg := prometheus.NewRegistry()
	sub, err := subscriber.New(subscriber.Config{
		Queue: sqsqueue.New(client, urls.Work), Results: sqsqueue.New(client, urls.Results), DLQ: sqsqueue.New(client, urls.DLQ),
		Backend: backend.InProcess{Model: flakyModel{}}, Device: gpu.NewSim(1 << 30), VRAMReserve: 1 << 20, WaitTime: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("subscriber: %v", err)
		}
	})
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()

	out := filepath.Join(t.TempDir(), "summary.json")
	var stdout, stderr bytes.Buffer
	err = run(t.Context(), []string{"-queue-url", urls.Work, "-results-queue-url", urls.Results, "-dlq-url", urls.DLQ,
		"-sizes=fixed", "-words=3", "-chunk-items=2", "-items=40", "-jobs=2", "-rate=400", "-job-id=lg",
		"-subscriber-metrics", metrics.URL, "-json", out, "-timeout=2m"}, noEnv, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	// Two jobs of 40 items in messages of 2: 40 messages, chunk 3 of each
	// job dead-lettered, a result for every other one.
	if s.Messages != 40 || s.Items != 80 || s.Results != 38 || s.DeadLettered != 2 {
		t.Errorf("messages %d, items %d, results %d, dead-lettered %d; want 40, 80, 38, 2", s.Messages, s.Items, s.Results, s.DeadLettered)
	}
	if s.Latency == nil || s.Latency.Count != 38 || s.Latency.P50 <= 0 || s.Latency.P50 > s.Latency.P99 || s.Latency.P99 > s.Latency.Max {
		t.Errorf("latency %+v; want 38 results timed, 0 < p50 <= p99 <= max", s.Latency)
	}
	if s.OOMs == nil || *s.OOMs < 1 {
		t.Errorf("OOMs %v; batches above six items run out of memory", s.OOMs)
	}
	if s.Redeliveries == nil || s.SubscriberReceived == nil || *s.SubscriberReceived < 40 {
		t.Errorf("subscriber received %v, redeliveries %v; want at least 40 and a figure", s.SubscriberReceived, s.Redeliveries)
	}
	// Ten per call at 400/s is forty calls a second: four calls for 40.
	if got := s.LoadgenRequests["SendMessageBatch"]; got != 4 {
		t.Errorf("loadgen's SendMessageBatch calls %v, want 4 (ten messages each)", got)
	}
	if s.SubscriberRequests["ReceiveMessage"] < 1 || s.SubscriberPerMessage["total"] <= 0 {
		t.Errorf("subscriber requests %v, per message %v; want its calls counted", s.SubscriberRequests, s.SubscriberPerMessage)
	}
	if !strings.Contains(stdout.String(), "latency           p50") || !strings.Contains(stdout.String(), "dead-lettered     2") {
		t.Errorf("summary lacks the latency or the dead letters:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "invalid_input") {
		t.Errorf("the dead letters' reasons were not shown:\n%s", stderr.String())
	}
}
