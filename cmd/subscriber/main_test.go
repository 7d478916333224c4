package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
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
	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/subscriber/taskprotect/taskprotecttest"
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
		{[]string{"-device=cuda:0"}, env, "built without CUDA"}, {[]string{"-device=tpu"}, env, "want sim, auto or cuda:N"},
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

// Issue 25, item 11: -tenants (VRAMQ_TENANTS) names the tenants that get
// a label of their own, comma-separated; empty names and spaces around
// them are dropped.
func TestTenantsFlag(t *testing.T) {
	env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d", "VRAMQ_TENANTS": " acme, globex,,key-0123456789ab "}
	o, err := parse(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"acme", "globex", "key-0123456789ab"}, o.cfg.Tenants); diff != "" {
		t.Errorf("tenants (-want +got):\n%s", diff)
	}
	o, err = parse([]string{"-tenants=solo"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.cfg.Tenants, []string{"solo"}) {
		t.Errorf("-tenants=solo over the environment: %q", o.cfg.Tenants)
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
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
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
	// A result is on the queue before its message's delete is sent (the
	// deletes are batched), so the delete's series may come a moment after
	// the first result: scrape until every series is there, a few seconds
	// at most.
	wants := []string{
		"vramq_subscriber_messages_received_total", "vramq_subscriber_budget_bytes 3.", // 30 MiB less reserve
		`vramq_subscriber_sqs_requests_total{action="ReceiveMessage",outcome="ok"}`,
		`vramq_subscriber_sqs_requests_total{action="DeleteMessageBatch",outcome="ok"}`,
		"vramq_subscriber_batch_messages_bucket", "vramq_subscriber_inflight_bytes_peak", "go_goroutines",
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		metrics := get(t, "http://"+metricsAddr+"/metrics")
		var missing []string
		for _, want := range wants {
			if !strings.Contains(metrics, want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("/metrics lacks %s", strings.Join(missing, ", "))
			break
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
		t.Errorf("ledger received=%d deleted=%d released=%d lost=%d abandoned=%d: want all received deleted or released, some released",
			l[0], l[1], l[2], l[3], l[4])
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
	c, _ := runLogged(t, client, urls, n, env)
	return c
}

// runLogged is runUntil that also returns everything the command logged.
func runLogged(t *testing.T, client *sqs.Client, urls localstack.URLs, n int, env map[string]string) (*jobq.Collector, string) {
	t.Helper()
	return runWhile(t, client, urls, env, fmt.Sprintf("%d results", n), func(c *jobq.Collector) bool { return len(c.Results) >= n })
}

// runWhile runs the command as runUntil does until done, which is asked
// after each poll of the results queue (what says what it waits for, in a
// failure), and returns the results and the log.
func runWhile(t *testing.T, client *sqs.Client, urls localstack.URLs, env map[string]string, what string, done func(*jobq.Collector) bool) (*jobq.Collector, string) {
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
	exited := make(chan error, 1)
	go func() { exited <- run(ctx, []string{"-metrics-addr="}, getenv, &logs) }()
	c := jobq.NewCollector()
	for deadline := time.Now().Add(time.Minute); !done(c); {
		if time.Now().After(deadline) {
			cancel()
			<-exited
			t.Fatalf("no %s after a minute (%d results); log:\n%s", what, len(c.Results), logs.String())
		}
		if _, err := c.Poll(t.Context(), client, urls.Results, 1); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-exited; err != nil {
		t.Fatalf("run: %v; log:\n%s", err, logs.String())
	}
	return c, logs.String()
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
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	s3c := sqstest.S3(t)
	bucket := sqstest.Bucket(t, s3c)
	store := payload.New(s3c, bucket)
	item, _ := json.Marshal(job.Item{ID: "doc", Text: "a claim-checked document"})
	ref, err := store.Put(t.Context(), job.ItemKey("pb", "doc"), item)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobq.Send(t.Context(), client, urls.Work,
		[]job.Work{{V: 1, JobID: "pb", Items: []job.Item{{ID: "doc", Ref: &ref}}}}); err != nil {
		t.Fatal(err)
	}
	c := runUntil(t, client, urls, 1, map[string]string{"PAYLOAD_BUCKET": bucket})
	if r := c.Results[job.Key{JobID: "pb"}]; len(r.Outputs) != 1 || r.Outputs[0].ID != "doc" {
		t.Errorf("result %+v", r)
	}
	if _, err := store.Read(t.Context(), job.ResultKey("pb", 0)); err != nil {
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
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	client := sqstest.Client(t)
	for _, mode := range []string{"auto", "off"} {
		t.Run(mode, func(t *testing.T) {
			urls := sqstest.Queues(t, client, 5)
			// The agent checks each PUT's path, Content-Type and fields; the
			// wrapper records any other call, which the binary never makes.
			agent := taskprotecttest.NewAgent(t)
			var mu sync.Mutex
			var others []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPut {
					mu.Lock()
					others = append(others, r.Method+" "+r.URL.Path)
					mu.Unlock()
				}
				agent.ServeHTTP(w, r)
			}))
			defer srv.Close()
			if err := jobq.Send(t.Context(), client, urls.Work, workload.Mixed("tp", 4).Works()); err != nil {
				t.Fatal(err)
			}
			// ECS_AGENT_URI whose task protection endpoint is taskprotecttest.Path.
			uri := srv.URL + strings.TrimSuffix(taskprotecttest.Path, "/task-protection/v1/state")
			runUntil(t, client, urls, 4, map[string]string{"ECS_AGENT_URI": uri, "VRAMQ_TASK_PROTECTION": mode})
			var puts []string
			for _, p := range agent.Puts() {
				put := fmt.Sprintf("ProtectionEnabled=%v", p.Enabled)
				if p.Minutes != nil {
					put += fmt.Sprintf(" ExpiresInMinutes=%d", *p.Minutes)
				}
				puts = append(puts, put)
			}
			want := []string{"ProtectionEnabled=true ExpiresInMinutes=60", "ProtectionEnabled=false"}
			if mode == "off" {
				want = nil
			}
			if !slices.Equal(puts, want) {
				t.Errorf("agent PUTs %q, want %q", puts, want)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(others) > 0 {
				t.Errorf("agent calls other than PUT: %q", others)
			}
		})
	}
}

func TestHealthcheckCommand(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/livez" {
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
	if err := run(t.Context(),
		[]string{"healthcheck"}, getenv, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "receives failing") {
		t.Errorf("unhealthy: %v", err)
	}
	srv.Close()
	if err := run(t.Context(), []string{"healthcheck"}, getenv, &bytes.Buffer{}); err == nil {
		t.Error("nothing listening: healthcheck passed")
	}
}

// Bad values are refused at start-up, before the model loads, by an error
// that names each flag and its environment variable.
func TestConfigErrorsNameTheFlag(t *testing.T) {
	urls := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d"}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"-max-hold=1m", "-visibility-timeout=2m"}, nil,
			[]string{"-max-hold (VRAMQ_MAX_HOLD): max hold 1m0s: want from the visibility timeout (2m0s) to 12h"}},
		{nil, map[string]string{"VRAMQ_WAIT_TIME": "30s"}, []string{"-wait-time (VRAMQ_WAIT_TIME): wait time 30s"}},
		{[]string{"-admission=fifo", "-prefetch=0", "-max-message-bytes=10"}, nil,
			[]string{"-admission (VRAMQ_ADMISSION)", "-prefetch (VRAMQ_PREFETCH)", "-max-message-bytes (VRAMQ_MAX_MESSAGE_BYTES)"}},
		{[]string{"-admit-timeout=20m"}, nil,
			[]string{"-admit-timeout (VRAMQ_ADMIT_TIMEOUT): admit timeout 20m0s: want positive and below max hold 15m0s"}},
		{nil, map[string]string{"VRAMQ_TASK_PROTECTION_EXPIRY": "72h"}, []string{"-task-protection-expiry (VRAMQ_TASK_PROTECTION_EXPIRY)"}},
		{nil, map[string]string{"VRAMQ_TENANTS": "acme,bad name"}, []string{`-tenants (VRAMQ_TENANTS): tenant "bad name"`}},
	} {
		vars := maps.Clone(urls)
		maps.Copy(vars, tc.env)
		_, err := parse(tc.args, func(k string) string { return vars[k] }, &bytes.Buffer{})
		if !errors.Is(err, errUsage) {
			t.Errorf("parse(%q, %v) = %v; want a usage error", tc.args, tc.env, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("parse(%q, %v) = %v; want it to say %q", tc.args, tc.env, err, w)
			}
		}
	}
	if _, err := parse(nil, func(k string) string { return urls[k] }, &bytes.Buffer{}); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}

// The metrics server cuts off a client that trickles its headers, while it
// is still sending, and refuses headers over its limit with 431.
func TestMetricsServerLimits(t *testing.T) {
	l := metricsLimits
	if l.readHeader <= 0 || l.read < l.readHeader || l.write <= 0 || l.idle <= 0 || l.maxHeader <= 0 {
		t.Errorf("metricsLimits %+v: every limit must be set", l)
	}
	l = serverLimits{readHeader: 300 * time.Millisecond, read: 10 * time.Second, write: 10 * time.Second, idle: 10 * time.Second,
		maxHeader: 4 << 10}
	srv := metricsServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") }), l)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	if sent, stillOpen := slowloris(t, ln.Addr().String(), 200); stillOpen {
		t.Errorf("a client trickling headers kept its connection for %d lines over 10s", sent)
	}
	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("b", 8<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("8 KiB header over a 4 KiB limit: %d, want 431", resp.StatusCode)
	}
}

// slowloris opens a connection to addr and sends a request's headers one
// line every 50ms, up to lines lines, until the server closes it. It
// reports how many lines went out and whether the connection was still open
// when the client ran out of lines (a server without a header timeout).
func slowloris(t *testing.T, addr string, lines int) (sent int, stillOpen bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, conn) // returns when the server closes
		close(closed)
	}()
	for ; sent < lines; sent++ {
		select {
		case <-closed:
			return sent, false
		case <-time.After(50 * time.Millisecond):
		}
		if _, err := fmt.Fprintf(conn, "X-Slow-%d: 1\r\n", sent); err != nil {
			return sent, false
		}
	}
	return sent, true
}

// The healthcheck gives up within its -timeout on a subscriber that does
// not answer, and does not take a redirect for health.
func TestHealthcheckTimeoutAndRedirect(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/livez" { // a subscriber that accepts and never answers
			select {
			case <-hang:
			case <-r.Context().Done():
			}
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	defer srv.Close()
	defer close(hang)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	env := map[string]string{"VRAMQ_METRICS_ADDR": "127.0.0.1:" + port}
	done := make(chan error, 1)
	go func() {
		done <- run(t.Context(), []string{"healthcheck", "-timeout=300ms"}, func(k string) string { return env[k] }, &bytes.Buffer{})
	}()
	select {
	case err := <-done:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("healthcheck on a subscriber that never answers: %v; want a timeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("healthcheck still waiting after 30s with -timeout=300ms")
	}

	redirect := httptest.NewServer(http.RedirectHandler(srv.URL+"/elsewhere", http.StatusFound))
	defer redirect.Close()
	_, port, _ = net.SplitHostPort(redirect.Listener.Addr().String())
	env["VRAMQ_METRICS_ADDR"] = "127.0.0.1:" + port
	if err := run(t.Context(), []string{"healthcheck"}, func(k string) string { return env[k] }, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "302") {
		t.Errorf("healthcheck answered by a redirect to a 200: %v; want it to fail on the 302", err)
	}
	if err := run(t.Context(), []string{"healthcheck", "-timeout=0s"}, func(k string) string { return env[k] }, &bytes.Buffer{}); !errors.Is(err, errUsage) {
		t.Errorf("-timeout=0s: %v; want a usage error", err)
	}
}

// Nothing a message carries, and no credential, reaches the subscriber's
// logs, even at debug level: neither an item's text on the way to a result,
// nor a malformed body on its way to the DLQ (whose reason the log repeats).
func TestLogsCarryNoPayloadsOrCredentials(t *testing.T) {
	const secret = "sk_live_9f2c4e7d1b0a8c3e"
	const awsSecret = "vramqTestSecretAccessKey0x5eCrEt"
	t.Setenv("AWS_SECRET_ACCESS_KEY", awsSecret) // the SDK reads its credentials from the environment itself
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	if err := jobq.Send(t.Context(), client, urls.Work, []job.Work{{V: 1, JobID: "logs", Chunks: 1,
		Items: []job.Item{{ID: "doc", Text: "the password is " + secret}, {ID: "blob", Data: []byte(secret)}}}}); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"v":1,"job_id":"leak","chunk":0,"chunks":1,"items":[{"id":"a","text":"` + secret + `"}],"note":"` + secret + `"}`,
		`{"v":1,"job_id":"leak","chunk":"` + secret + `","items":[]}`,
		secret,
	} {
		if _, err := client.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: &urls.Work, MessageBody: &body}); err != nil {
			t.Fatal(err)
		}
	}
	_, logs := runWhile(t, client, urls, map[string]string{"VRAMQ_LOG_LEVEL": "debug", "VRAMQ_LOG_FORMAT": "json"},
		"result and 3 dead-lettered messages", func(c *jobq.Collector) bool {
			dlq, _, err := jobq.Counts(t.Context(), client, urls.DLQ)
			return err == nil && len(c.Results) == 1 && dlq == 3
		})
	for _, want := range []string{`"msg":"batch"`, `"msg":"message dead-lettered"`, `"reason":"malformed"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %s: the test did not see the paths it checks", want)
		}
	}
	for _, leak := range []string{secret, awsSecret, base64.StdEncoding.EncodeToString([]byte(secret))} {
		if strings.Contains(logs, leak) {
			t.Errorf("the log contains %q:\n%s", leak, logs)
		}
	}
}
