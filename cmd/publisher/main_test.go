package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/publisher/api"
)

// TestMain lets this test binary stand in for the publisher's: with
// VRAMQ_TEST_MAIN=1 it runs main, so the Lambda end-to-end tests run it as
// the function's bootstrap. A separate go build of the program with make
// lambda's flags (-trimpath, no cgo) shared nothing with the test build and
// cost a cold CI run about 90 s.
func TestMain(m *testing.M) {
	if os.Getenv("VRAMQ_TEST_MAIN") == "1" {
		main() // exits
	}
	os.Exit(m.Run())
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParse(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keyFile, []byte("# team a\nkey-a\n\n  key-b  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parse([]string{"-chunk-items=8", "-api-keys-file=" + keyFile}, env(map[string]string{
		"QUEUE_URL": "http://q", "PAYLOAD_BUCKET": "bkt", "VRAMQ_MAX_BODY_BYTES": "1MiB", "VRAMQ_API_KEYS": "key-c, key-d",
		"VRAMQ_CHUNK_ITEMS": "99", // the flag wins
	}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.queueURL != "http://q" || o.bucket != "bkt" || o.cfg.MaxBodyBytes != 1<<20 || o.cfg.ChunkItems != 8 || o.addr != ":8080" || o.metricsAddr != ":9090" {
		t.Errorf("parsed %+v", o)
	}
	if got := strings.Join(o.cfg.APIKeys, ","); got != "key-c,key-d,key-a,key-b" {
		t.Errorf("keys %q", got)
	}
	o, err = parse([]string{"-models= llama-3.1-8b , bge-m3", "-max-n=2"}, env(map[string]string{
		"QUEUE_URL": "http://q", "VRAMQ_MAX_OUTPUT_TOKENS": "512"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.cfg.Models, ","); got != "llama-3.1-8b,bge-m3" || o.cfg.MaxN != 2 || o.cfg.MaxOutputTokens != 512 {
		t.Errorf("models %q, max n %d, max output tokens %d", got, o.cfg.MaxN, o.cfg.MaxOutputTokens)
	}

	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want error
	}{
		"help":          {[]string{"-h"}, nil, flag.ErrHelp},
		"no queue":      {nil, nil, errUsage},
		"bad size":      {[]string{"-max-body-bytes=12K"}, map[string]string{"QUEUE_URL": "q"}, errUsage},
		"extra args":    {[]string{"x"}, map[string]string{"QUEUE_URL": "q"}, errUsage},
		"empty keyfile": {[]string{"-api-keys-file=" + os.DevNull}, map[string]string{"QUEUE_URL": "q"}, errUsage},
		// A key set given but empty fails closed, not open.
		"keys: a comma":      {[]string{"-api-keys=,"}, map[string]string{"QUEUE_URL": "q"}, errUsage},
		"keys: blanks":       {nil, map[string]string{"QUEUE_URL": "q", "VRAMQ_API_KEYS": " , "}, errUsage},
		"metrics on the API": {[]string{"-addr=:8080", "-metrics-addr=:8080"}, map[string]string{"QUEUE_URL": "q"}, errUsage},
		"in flight below a body": {[]string{"-max-body-bytes=1MiB", "-max-inflight-body-bytes=512KiB"},
			map[string]string{"QUEUE_URL": "q"}, errUsage},
		"a client's share below a body": {[]string{"-max-body-bytes=1MiB", "-max-client-body-bytes=512KiB"},
			map[string]string{"QUEUE_URL": "q"}, errUsage},
		"an IPv6 client of a whole ISP": {[]string{"-ipv6-client-prefix=24"}, map[string]string{"QUEUE_URL": "q"}, errUsage},
		// A model list given but empty fails closed too.
		"models: a comma":  {[]string{"-models=,"}, map[string]string{"QUEUE_URL": "q"}, errUsage},
		"models: a repeat": {[]string{"-models=a,b,a"}, map[string]string{"QUEUE_URL": "q"}, errUsage},
		"n over OpenAI's":  {[]string{"-max-n=129"}, map[string]string{"QUEUE_URL": "q"}, errUsage},
		"no output tokens": {nil, map[string]string{"QUEUE_URL": "q", "VRAMQ_MAX_OUTPUT_TOKENS": "-5"}, errUsage},
		"a negative sweep": {[]string{"-batch-sweep-interval=-1s"}, map[string]string{"QUEUE_URL": "q"}, errUsage},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if _, err := parse(tc.args, env(tc.env), &out); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if name == "help" && !strings.Contains(out.String(), "$QUEUE_URL") {
				t.Errorf("usage does not list the variables:\n%s", out.String())
			}
		})
	}
}

// TestRun starts the binary's run on real queues, posts a job, and stops it
// as SIGTERM would: it exits cleanly. In Lambda mode it hands the handler to
// the Lambda runtime instead of listening.
func TestRun(t *testing.T) {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := mln.Addr().String()
	mln.Close()
	vars := map[string]string{"QUEUE_URL": urls.Work, "VRAMQ_API_KEYS": "k"}
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_S3", "AWS_REGION"} {
		vars[k] = os.Getenv(k)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- run(ctx, []string{"-addr=" + addr, "-metrics-addr=" + metricsAddr, "-log-format=text"}, env(vars), &logs)
	}()
	var resp *http.Response
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err = http.Get("http://" + addr + "/healthz")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/jobs", strings.NewReader(`{"items":[{"id":"a","text":"x"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST: %v %v", resp, err)
	}
	// /metrics is on its own listener, which the load balancer does not
	// forward, and not on the API's.
	if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err != nil || resp.StatusCode != 200 || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("metrics: %v %v", resp, err)
	}
	if resp, err := http.Get("http://" + addr + "/metrics"); err != nil || resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/metrics on the API's address: %v %v; want a JSON 404", resp, err)
	}
	// net/http's own 431 comes out as the API's JSON error.
	big, _ := http.NewRequest("GET", "http://"+addr+"/healthz", nil)
	big.Header.Set("X-Big", strings.Repeat("b", 2*limits.maxHeader))
	if resp, err := http.DefaultClient.Do(big); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("headers over the limit: %v %v; want a JSON 431", resp, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "publisher stopped") {
		t.Errorf("no clean stop in the log:\n%s", logs.String())
	}

	// Lambda mode.
	var started any
	lambdaStart = func(h any) { started = h }
	t.Cleanup(func() { lambdaStart = nil })
	vars["AWS_LAMBDA_RUNTIME_API"] = "127.0.0.1:9001"
	if err := run(t.Context(), nil, env(vars), &logs); err != nil {
		t.Fatal(err)
	}
	// Either payload version: the handler reads the event's JSON.
	h, ok := started.(func(context.Context, json.RawMessage) (any, error))
	if !ok {
		t.Fatalf("lambda.Start got %T", started)
	}
	ev, err := json.Marshal(events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: "/healthz",
		RequestContext: events.APIGatewayV2HTTPRequestContext{HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "GET",
			Path: "/healthz"}}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := h(t.Context(), ev)
	if res, ok := out.(events.APIGatewayV2HTTPResponse); err != nil || !ok || res.StatusCode != 200 {
		t.Errorf("healthz through the Lambda handler: %+v %v", out, err)
	}
}

// Bad values are refused at start-up, before any AWS call, by an error that
// names the flag and its environment variable.
func TestConfigErrorsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"-max-items=-1"}, nil, []string{"-max-items (VRAMQ_MAX_ITEMS): max items -1"}},
		{nil, map[string]string{"VRAMQ_RATE_LIMIT": "-5"}, []string{"-rate-limit (VRAMQ_RATE_LIMIT): rate limit -5"}},
		{[]string{"-rate-limit=10", "-rate-burst=-1"}, nil, []string{"-rate-burst (VRAMQ_RATE_BURST)"}},
		{[]string{"-chunk-items=5000"}, nil,
			[]string{"-max-chunk-items (VRAMQ_MAX_CHUNK_ITEMS): max chunk items 1000: want at least chunk items (5000)"}},
		{[]string{"-max-item-bytes=2MiB"}, nil, []string{"-max-item-bytes (VRAMQ_MAX_ITEM_BYTES)"}},
		{[]string{"-trusted-proxies=10.0.0.0/8,alb"}, nil, []string{"-trusted-proxies (VRAMQ_TRUSTED_PROXIES)", `"alb"`}},
		{[]string{"-rate-limit-clients=-1", "-send-attempts=-2"}, nil,
			[]string{"-rate-limit-clients (VRAMQ_RATE_LIMIT_CLIENTS)", "-send-attempts (VRAMQ_SEND_ATTEMPTS)"}},
		{[]string{"-max-n=-1", "-max-output-tokens=-1"}, nil,
			[]string{"-max-n (VRAMQ_MAX_N): max n -1: want 1 to 128", "-max-output-tokens (VRAMQ_MAX_OUTPUT_TOKENS)"}},
		{[]string{"-ipv6-client-prefix=129", "-max-client-bodies=-1", "-body-grace=-1s"}, nil,
			[]string{"-ipv6-client-prefix (VRAMQ_IPV6_CLIENT_PREFIX): IPv6 client prefix /129", "-max-client-bodies (VRAMQ_MAX_CLIENT_BODIES)",
				"-body-grace (VRAMQ_BODY_GRACE)"}},
	} {
		vars := map[string]string{"QUEUE_URL": "http://q"}
		for k, v := range tc.env {
			vars[k] = v
		}
		_, err := parse(tc.args, env(vars), &bytes.Buffer{})
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

	o, err := parse(nil, env(map[string]string{"QUEUE_URL": "http://q", "VRAMQ_TRUSTED_PROXIES": "10.0.0.0/16, 192.0.2.1"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	c := o.cfg
	// A global limit is on by default: a client keyed by its address that
	// mints addresses still meets it.
	if c.RateLimit != defaultRateLimit || c.RateBurst != defaultRateBurst || c.GlobalRateLimit != 1000 || c.GlobalRateBurst != 2000 ||
		c.IPv6ClientPrefix != 56 || fmt.Sprint(c.TrustedProxies) != "[10.0.0.0/16 192.0.2.1/32]" {
		t.Errorf("defaults: rate %v burst %d global %v burst %d, IPv6 client prefix %d, trusted %v", c.RateLimit, c.RateBurst,
			c.GlobalRateLimit, c.GlobalRateBurst, c.IPv6ClientPrefix, c.TrustedProxies)
	}
}

// The server's limits: a client that trickles its headers is cut off by the
// header timeout while it is still sending, and headers over the limit are
// refused with 431. The real limits keep the write timeout above what a
// request may take: its body, then up to 90 s of enqueueing.
func TestServerLimits(t *testing.T) {
	if limits.write < limits.read+90*time.Second || limits.readHeader >= limits.read || limits.idle <= 120*time.Second || limits.maxHeader < 8<<10 {
		t.Errorf("limits %+v: want readHeader < read, write >= read + 90s, idle over the ALB's 120s, room for 8 KiB of headers", limits)
	}

	short := serverLimits{readHeader: 300 * time.Millisecond, read: 10 * time.Second, write: 10 * time.Second, idle: 10 * time.Second,
		maxHeader: 4 << 10}
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") }),
		slog.New(slog.DiscardHandler), short)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(api.JSONErrors(ln))
	t.Cleanup(func() { srv.Close() })

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	trickled := make(chan int, 1)
	go func() { // one header line every 50ms, for up to 10s
		n := 0
		defer func() { trickled <- n }()
		for ; n < 200; n++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := fmt.Fprintf(conn, "X-Slow-%d: 1\r\n", n); err != nil {
				return
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, rerr := io.ReadAll(conn)
	close(stop)
	n := <-trickled
	var ne net.Error
	if errors.As(rerr, &ne) && ne.Timeout() {
		t.Fatalf("the server kept a connection trickling headers open for 20s (%d lines sent)", n)
	}
	if n >= 200 {
		t.Errorf("the connection was closed only after the client stopped sending")
	}

	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("b", 8<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("8 KiB header over a 4 KiB limit: %d %q, want a JSON 431", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// The runtime's memory limit: the flag, else GOMEMLIMIT left alone, else
// the Lambda function's memory, else the cgroup's, each less a tenth.
func TestMemoryLimit(t *testing.T) {
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(name string) ([]byte, error) {
			if v, ok := m[name]; ok {
				return []byte(v), nil
			}
			return nil, os.ErrNotExist
		}
	}
	v2, v1 := cgroupMemoryFiles[0], cgroupMemoryFiles[1]
	tenthLess := func(n int64) int64 { return n - n/10 }
	for _, tc := range []struct {
		name  string
		flag  int64
		env   map[string]string
		files map[string]string
		want  int64
		from  string
	}{
		{"flag", 300 << 20, map[string]string{"GOMEMLIMIT": "1GiB"}, map[string]string{v2: "1073741824\n"}, 300 << 20, "-memory-limit"},
		{"GOMEMLIMIT", 0, map[string]string{"GOMEMLIMIT": "1GiB"}, map[string]string{v2: "1073741824\n"}, 0, "GOMEMLIMIT"},
		{"Lambda", 0, map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024"}, nil, tenthLess(1 << 30), "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"},
		{"cgroup v2", 0, nil, map[string]string{v2: "1073741824\n"}, tenthLess(1 << 30), v2},
		{"cgroup v2 unlimited", 0, nil, map[string]string{v2: "max\n", v1: "1073741824\n"}, 0, ""},
		{"cgroup v1", 0, nil, map[string]string{v1: "2147483648\n"}, tenthLess(2 << 30), v1},
		{"cgroup v1 unlimited", 0, nil, map[string]string{v1: "9223372036854771712\n"}, 0, ""},
		{"nothing", 0, nil, nil, 0, ""},
	} {
		got, from := memoryLimit(tc.flag, env(tc.env), files(tc.files))
		if got != tc.want || from != tc.from {
			t.Errorf("%s: %d from %q, want %d from %q", tc.name, got, from, tc.want, tc.from)
		}
	}
}
