//go:build cuda

package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/internal/testenv/workload"
)

// The cuda binary on the emulated GPU, a sticky fault injected mid-run: it
// exits non-zero on its own, leaving every message without a result back on
// the work queue, visible at once, and none in the DLQ. (Before, each later
// batch failed as if transient, and redrive drained the work to the DLQ
// while /healthz stayed green.) Needs the emulated GPU and an SQS endpoint:
// make cuda-emu-test.
func TestCUDADeviceLostExitsAndReleases(t *testing.T) {
	if os.Getenv("VRAMQ_EMU_STATE") == "" {
		t.Skip("needs the emulated GPU (make cuda-emu-test)")
	}
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 2)
	const n = 12
	if err := jobq.Send(t.Context(), client, urls.Work, workload.Mixed("lost", n).Works()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()

	var logs syncBuffer
	cmd := exec.Command(os.Args[0], "-device=cuda:0", "-metrics-addr="+metricsAddr)
	// Loading the model runs one batch (6 launches); the fault comes in
	// the third batch after it.
	cmd.Env = append(os.Environ(), "VRAMQ_TEST_RUN_MAIN=1", "VRAMQ_EMU_FAULT=launch=16",
		"QUEUE_URL="+urls.Work, "RESULTS_QUEUE_URL="+urls.Results, "DLQ_URL="+urls.DLQ,
		"VRAMQ_WAIT_TIME=1s", "VRAMQ_VISIBILITY_TIMEOUT=60s", "VRAMQ_MAX_BATCH=2", "VRAMQ_LOG_FORMAT=text")
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err = <-exited:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("still running a minute after start; log:\n%s", logs.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("exit: %v, want a non-zero status; log:\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "device lost") {
		t.Errorf("the log does not say the device is lost:\n%s", logs.String())
	}

	c := jobq.NewCollector()
	for {
		got, err := c.Poll(t.Context(), client, urls.Results, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got == 0 {
			break
		}
	}
	visible, inflight, err := jobq.Counts(t.Context(), client, urls.Work)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := jobq.DrainDLQ(t.Context(), client, urls.DLQ)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the loss: %d results, %d messages back on the work queue (%d in flight), %d dead letters", len(c.Results), visible,
		inflight, len(dead))
	if len(dead) != 0 || inflight != 0 || len(c.Results)+visible != n {
		t.Errorf("%d results + %d visible on the work queue, %d in flight, %d in the DLQ; want %d results and visible, none in flight or dead; log:\n%s",
			len(c.Results), visible, inflight, len(dead), n, logs.String())
	}
}
