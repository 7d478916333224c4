package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/internal/jobq"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/sqstest"
	"github.com/vramq/vramq/internal/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
)

// The test binary doubles as the subscriber binary, so the process tests run
// the real main (signals, exit codes) without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("VRAMQ_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestFlagsAndEnvironment(t *testing.T) {
	env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d", "PAYLOAD_BUCKET": "b",
		"VRAMQ_ADMISSION": "count", "VRAMQ_VRAM": "2GiB", "COUNT": "99"}
	o, err := parse([]string{"-count=3", "-vram=1GiB"}, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.queueURL != "q" || o.payloadBucket != "b" || o.cfg.Admission != "count" || o.cfg.Count != 3 || o.vram != 1<<30 {
		t.Errorf("parsed %+v: flags must win over the environment, the environment over defaults", o)
	}

	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "missing -queue-url, -results-queue-url, -dlq-url"},
		{[]string{"-vram=lots"}, env, "vram"},
		{nil, map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d", "VRAMQ_MAX_BATCH": "x"}, "VRAMQ_MAX_BATCH"},
		{[]string{"-device=cuda:0"}, env, "simulated device only"},
	} {
		_, err := parse(tc.args, func(k string) string { return tc.env[k] }, &bytes.Buffer{})
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse(%q) = %v; want a usage error naming %q", tc.args, err, tc.want)
		}
	}

	var help bytes.Buffer
	if _, err := parse([]string{"-h"}, func(string) string { return "" }, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"-queue-url", "$QUEUE_URL", "-admission", "$VRAMQ_VRAM_RESERVE", "-payload-bucket", "$PAYLOAD_BUCKET"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-h does not list %s", want)
		}
	}
}

func TestInvalidConfigFailsAtStart(t *testing.T) {
	env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d", "AWS_REGION": "us-east-1"}
	err := run(t.Context(), []string{"-visibility-timeout=1s", "-metrics-addr="}, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "visibility timeout") {
		t.Errorf("run with a 1s visibility timeout: %v", err)
	}
}

// SIGTERM in the middle of a busy run: the process exits 0, and every
// message has its result or is back on the queue, none left invisible.
func TestSIGTERMMidRunLosesNothing(t *testing.T) {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	const n = 120
	spec := workload.Mixed("sigterm", n)
	spec.LargeEvery = 2 // enough work to be busy when the signal comes
	if err := jobq.Send(t.Context(), client, urls.Work, spec.Works()); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()

	var logs syncBuffer
	cmd := exec.Command(os.Args[0], "-metrics-addr="+metricsAddr)
	cmd.Env = append(os.Environ(), "VRAMQ_TEST_RUN_MAIN=1",
		"QUEUE_URL="+urls.Work, "RESULTS_QUEUE_URL="+urls.Results, "DLQ_URL="+urls.DLQ,
		"VRAMQ_VRAM=48MiB", "VRAMQ_VRAM_RESERVE=1MiB", "VRAMQ_WAIT_TIME=1s", "VRAMQ_VISIBILITY_TIMEOUT=10s",
		"VRAMQ_SHUTDOWN_GRACE=5s", "VRAMQ_LOG_FORMAT=text")
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	c := jobq.NewCollector()
	for deadline := time.Now().Add(time.Minute); len(c.Results) < 10; {
		if time.Now().After(deadline) {
			t.Fatalf("no results after a minute; log:\n%s", logs.String())
		}
		if _, err := c.Poll(t.Context(), client, urls.Results, 1); err != nil {
			t.Fatal(err)
		}
	}
	// Mid-run, the real endpoints answer with the subscriber's series.
	if body := get(t, "http://"+metricsAddr+"/healthz"); !strings.Contains(body, "ok") {
		t.Errorf("/healthz: %q", body)
	}
	metrics := get(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{
		"vramq_subscriber_messages_received_total", "vramq_subscriber_budget_bytes 3.", // 30 MiB less reserve
		`vramq_subscriber_sqs_requests_total{action="ReceiveMessage",outcome="ok"}`,
		`vramq_subscriber_sqs_requests_total{action="DeleteMessageBatch",outcome="ok"}`,
		"vramq_subscriber_batch_messages_bucket", "vramq_subscriber_inflight_bytes_peak", "go_goroutines",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("subscriber exited with %v after SIGTERM; log:\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("subscriber still running 30s after SIGTERM; log:\n%s", logs.String())
	}

	// The subscriber's own ledger: every message it received was deleted
	// or handed back, none abandoned.
	log := logs.String()
	m := regexp.MustCompile(`msg="subscriber stopped" received=(\d+) deleted=(\d+) released=(\d+) lost=(\d+) abandoned=(\d+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no ledger in the log:\n%s", log)
	}
	l := make([]int, 5)
	for i := range l {
		l[i], _ = strconv.Atoi(m[i+1])
	}
	if l[0] != l[1]+l[2]+l[3] || l[4] != 0 || l[2] == 0 {
		t.Errorf("ledger received=%d deleted=%d released=%d lost=%d abandoned=%d: want all received deleted or released, some released", l[0], l[1], l[2], l[3], l[4])
	}

	// On the queue: nothing in flight, except what a receive retried by the
	// SDK may have stranded (its first response was lost in transit, so the
	// subscriber never saw those messages; they come back after their
	// visibility timeout, at most 10 per retried receive).
	_, inflight, err := jobq.Counts(t.Context(), client, urls.Work)
	if err != nil {
		t.Fatal(err)
	}
	retried := strings.Count(log, "retrying request SQS/ReceiveMessage")
	if inflight > 10*retried {
		t.Errorf("%d messages left invisible after shutdown, %d receive retries; subscriber log:\n%s", inflight, retried, log)
	}

	// Every chunk has its result or is back on the queue. Read both until
	// all are accounted for, waiting out anything stranded in transit.
	accounted := map[job.Key]bool{}
	for k := range c.Results {
		accounted[k] = true
	}
	back := 0
	for deadline := time.Now().Add(60 * time.Second); len(accounted) < n && time.Now().Before(deadline); {
		if _, err := c.Poll(t.Context(), client, urls.Results, 1); err != nil {
			t.Fatal(err)
		}
		for k := range c.Results {
			accounted[k] = true
		}
		for _, k := range receiveWork(t, client, urls.Work) {
			accounted[k] = true
			back++
		}
	}
	if len(accounted) != n {
		t.Errorf("%d results + %d back on the queue cover %d of %d chunks", len(c.Results), back, len(accounted), n)
	}
	if len(c.Results) == n || back == 0 {
		t.Errorf("SIGTERM came after all the work was done (%d results); the test proves nothing", len(c.Results))
	}
	t.Logf("at SIGTERM: %d chunks done, %d handed back, %d duplicate results, %d in flight after exit (%d receive retries)",
		len(c.Results), back, c.Duplicates, inflight, retried)
}

// runUntil runs the command in-process on urls, with env over the test
// defaults (a small simulated device, short polls), until n results are in,
// then stops it as SIGTERM would and checks it returned nil.
func runUntil(t *testing.T, client *sqs.Client, urls localstack.URLs, n int, env map[string]string) *jobq.Collector {
	t.Helper()
	base := map[string]string{"QUEUE_URL": urls.Work, "RESULTS_QUEUE_URL": urls.Results, "DLQ_URL": urls.DLQ,
		"VRAMQ_VRAM": "48MiB", "VRAMQ_VRAM_RESERVE": "1MiB", "VRAMQ_WAIT_TIME": "1s", "VRAMQ_LOG_LEVEL": "warn"}
	getenv := func(k string) string {
		if v, ok := env[k]; ok {
			return v
		}
		if v, ok := base[k]; ok {
			return v
		}
		return os.Getenv(k)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-metrics-addr="}, getenv, &logs) }()
	c := jobq.NewCollector()
	for deadline := time.Now().Add(time.Minute); len(c.Results) < n; {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("%d of %d results after a minute; log:\n%s", len(c.Results), n, logs.String())
		}
		if _, err := c.Poll(t.Context(), client, urls.Results, 1); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v; log:\n%s", err, logs.String())
	}
	return c
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(b)
}

// syncBuffer is a bytes.Buffer safe to read while the process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// receiveWork takes one batch of visible work messages and returns their
// chunk keys. The visibility is short on purpose: a receive of ours that the
// SDK retried strands its first attempt's messages for that long, and they
// must come back within the accounting loop (seeing one twice is harmless).
func receiveWork(t *testing.T, client *sqs.Client, url string) []job.Key {
	t.Helper()
	out, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
		VisibilityTimeout: 10, MessageAttributeNames: []string{"All"}})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]job.Key, len(out.Messages))
	for i, m := range out.Messages {
		chunk, err := strconv.Atoi(*m.MessageAttributes[job.AttrChunk].StringValue)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = job.Key{JobID: *m.MessageAttributes[job.AttrJobID].StringValue, Chunk: chunk}
	}
	return keys
}

// -payload-bucket wires the S3 store: a claim-checked item is fetched and its
// chunk's result lands in the bucket.
func TestPayloadBucket(t *testing.T) {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	s3c := sqstest.S3(t)
	bucket := sqstest.Bucket(t, s3c)
	store := payload.New(s3c, bucket)
	item, _ := json.Marshal(job.Item{ID: "doc", Text: "a claim-checked document"})
	ref, err := store.Put(t.Context(), payload.ItemKey("pb", 0), item)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobq.Send(t.Context(), client, urls.Work, []job.Work{{V: 1, JobID: "pb", Items: []job.Item{{ID: "doc", Ref: &ref}}}}); err != nil {
		t.Fatal(err)
	}
	c := runUntil(t, client, urls, 1, map[string]string{"PAYLOAD_BUCKET": bucket})
	if r := c.Results[job.Key{JobID: "pb"}]; len(r.Outputs) != 1 || r.Outputs[0].ID != "doc" {
		t.Errorf("result %+v", r)
	}
	if _, err := store.Read(t.Context(), payload.ResultKey("pb", 0)); err != nil {
		t.Errorf("the result is not in the bucket: %v", err)
	}
}

func TestTaskProtectionFlag(t *testing.T) {
	const agent = "http://169.254.170.2/api/abc"
	for _, tc := range []struct {
		args     []string
		agentURI string
		want     string // the agent URI protection uses; "error" for a usage error
	}{
		{nil, agent, agent}, // auto, on ECS
		{nil, "", ""},       // auto, elsewhere: nothing is called
		{[]string{"-task-protection=on"}, agent, agent},
		{[]string{"-task-protection=on"}, "", "error"},
		{[]string{"-task-protection=off"}, agent, ""},
		{[]string{"-task-protection=maybe"}, agent, "error"},
	} {
		env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d", "ECS_AGENT_URI": tc.agentURI}
		o, err := parse(tc.args, func(k string) string { return env[k] }, &bytes.Buffer{})
		switch {
		case tc.want == "error":
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "-task-protection") {
				t.Errorf("parse(%q) with ECS_AGENT_URI=%q: %v; want a usage error", tc.args, tc.agentURI, err)
			}
		case err != nil:
			t.Errorf("parse(%q) with ECS_AGENT_URI=%q: %v", tc.args, tc.agentURI, err)
		case o.protectionURI != tc.want:
			t.Errorf("parse(%q) with ECS_AGENT_URI=%q: protection through %q, want %q", tc.args, tc.agentURI, o.protectionURI, tc.want)
		}
	}
	env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d", "VRAMQ_TASK_PROTECTION_EXPIRY": "2h"}
	if o, err := parse(nil, func(k string) string { return env[k] }, &bytes.Buffer{}); err != nil || o.cfg.TaskProtectionExpiry != 2*time.Hour {
		t.Errorf("VRAMQ_TASK_PROTECTION_EXPIRY=2h: %v, %v", o.cfg.TaskProtectionExpiry, err)
	}
}

// On ECS (ECS_AGENT_URI set), the binary protects the task while it works
// and clears the protection by the time it exits; with -task-protection=off
// it never calls the agent.
func TestTaskProtectionThroughTheAgent(t *testing.T) {
	client := sqstest.Client(t)
	for _, mode := range []string{"auto", "off"} {
		t.Run(mode, func(t *testing.T) {
			urls := sqstest.Queues(t, client, 5)
			var mu sync.Mutex
			var puts []string
			agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				var req struct{ ProtectionEnabled bool }
				_ = json.Unmarshal(b, &req)
				mu.Lock()
				puts = append(puts, r.Method+" "+r.URL.Path+" "+string(b))
				mu.Unlock()
				fmt.Fprintf(w, `{"protection":{"ExpirationDate":null,"ProtectionEnabled":%v,"TaskArn":"arn:aws:ecs:us-east-1:1:task/c/t"}}`, req.ProtectionEnabled)
			}))
			defer agent.Close()
			if err := jobq.Send(t.Context(), client, urls.Work, workload.Mixed("tp", 4).Works()); err != nil {
				t.Fatal(err)
			}
			runUntil(t, client, urls, 4, map[string]string{"ECS_AGENT_URI": agent.URL + "/api/task-1", "VRAMQ_TASK_PROTECTION": mode})
			mu.Lock()
			defer mu.Unlock()
			const path = "/api/task-1/task-protection/v1/state "
			want := []string{"PUT " + path + `{"ProtectionEnabled":true,"ExpiresInMinutes":60}`, "PUT " + path + `{"ProtectionEnabled":false}`}
			if mode == "off" {
				want = nil
			}
			if !slices.Equal(puts, want) {
				t.Errorf("agent calls %q, want %q", puts, want)
			}
		})
	}
}

func TestHealthcheckCommand(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		if !healthy.Load() {
			http.Error(w, "receives failing since 2026-01-01T00:00:00Z", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	env := map[string]string{"VRAMQ_METRICS_ADDR": ":" + port}
	getenv := func(k string) string { return env[k] }
	if err := run(t.Context(), []string{"healthcheck"}, getenv, &bytes.Buffer{}); err != nil {
		t.Errorf("healthy: %v", err)
	}
	healthy.Store(false)
	if err := run(t.Context(), []string{"healthcheck"}, getenv, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "receives failing") {
		t.Errorf("unhealthy: %v", err)
	}
	srv.Close()
	if err := run(t.Context(), []string{"healthcheck"}, getenv, &bytes.Buffer{}); err == nil {
		t.Error("nothing listening: healthcheck passed")
	}
}
