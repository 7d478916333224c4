//go:build cuda

package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The cuda binary starts without the NVIDIA driver: it prints -h, runs
// -device=sim and answers its healthcheck, and -device=cuda:0 fails with a
// message that says the driver is missing (gorgonia.org/cu's init would exit
// the process, or the loader refuse to start it, were the driver linked).
// This test binary is the cuda binary (TestMain runs main), started here with
// a library path that holds no driver; on a machine whose default library
// path has one, the last check is skipped.
func TestCUDABinaryStartsWithoutDriver(t *testing.T) {
	empty := t.TempDir()
	child := func(ctx context.Context, env []string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, os.Args[0], args...)
		cmd.Env = append(os.Environ(), "VRAMQ_TEST_RUN_MAIN=1", "LD_LIBRARY_PATH="+empty)
		cmd.Env = append(cmd.Env, env...)
		return cmd
	}

	out, err := child(t.Context(), nil, "-h").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-device") {
		t.Errorf("-h: %v\n%s", err, out)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	if out, err := child(t.Context(), []string{"VRAMQ_METRICS_ADDR=:" + port}, "healthcheck").CombinedOutput(); err != nil {
		t.Errorf("healthcheck: %v\n%s", err, out)
	}

	// -device=sim subscribes until SIGTERM, then exits 0. Its SQS answers
	// every call with a non-retryable error, so no receive is in flight
	// for long when the signal comes.
	sqs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintln(w, `{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"no such queue"}`)
	}))
	defer sqs.Close()
	queues := []string{"QUEUE_URL=" + sqs.URL + "/q", "RESULTS_QUEUE_URL=" + sqs.URL + "/r", "DLQ_URL=" + sqs.URL + "/d",
		"AWS_ENDPOINT_URL=" + sqs.URL, "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=x", "AWS_SECRET_ACCESS_KEY=x",
		"VRAMQ_METRICS_ADDR=127.0.0.1:0"}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sim := child(ctx, queues, "-device=sim")
	stderr, _ := sim.StderrPipe()
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "subscriber ready") {
			_ = sim.Process.Signal(syscall.SIGTERM)
		}
	}
	if err := sim.Wait(); err != nil || !strings.Contains(log.String(), "subscriber stopped") {
		t.Errorf("-device=sim: %v\n%s", err, log.String())
	}

	out, err = child(t.Context(), queues, "-device=cuda:0").CombinedOutput()
	if err == nil {
		t.Skipf("-device=cuda:0 started: this machine's default library path has a driver\n%s", out)
	}
	if !strings.Contains(string(out), "the NVIDIA driver could not be loaded: libcuda.so.1") {
		t.Errorf("-device=cuda:0 without a driver: %v; want the driver named as missing\n%s", err, out)
	}
}

// With a driver whose cuInit fails (no usable GPU), the binary starts too, and
// -device=cuda:0 names cuInit's error. The emulated driver's cuInit fails
// when its device state file cannot be made; run by make cuda-emu-test.
func TestCUDABinaryStartsWhenCuInitFails(t *testing.T) {
	if os.Getenv("VRAMQ_EMU_STATE") == "" {
		t.Skip("needs the emulated GPU (make cuda-emu-test)")
	}
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
		cmd.Env = append(os.Environ(), "VRAMQ_TEST_RUN_MAIN=1", "VRAMQ_EMU_STATE=/nonexistent/vramq/state",
			"QUEUE_URL=http://127.0.0.1:1/q", "RESULTS_QUEUE_URL=http://127.0.0.1:1/r", "DLQ_URL=http://127.0.0.1:1/d",
			"AWS_ENDPOINT_URL=http://127.0.0.1:1", "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=x", "AWS_SECRET_ACCESS_KEY=x")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("-h"); err != nil {
		t.Errorf("-h: %v\n%s", err, out)
	}
	out, err := run("-device=cuda:0")
	if err == nil || !strings.Contains(out, "cuInit failed: CUresult 100 (CUDA_ERROR_NO_DEVICE)") {
		t.Errorf("-device=cuda:0 with cuInit failing: %v; want cuInit's error named\n%s", err, out)
	}
}
