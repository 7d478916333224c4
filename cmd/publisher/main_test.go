package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/vramq/vramq/internal/sqstest"
)

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
	if o.queueURL != "http://q" || o.bucket != "bkt" || o.cfg.MaxBodyBytes != 1<<20 || o.cfg.ChunkItems != 8 || o.addr != ":8080" {
		t.Errorf("parsed %+v", o)
	}
	if got := strings.Join(o.cfg.APIKeys, ","); got != "key-c,key-d,key-a,key-b" {
		t.Errorf("keys %q", got)
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
	vars := map[string]string{"QUEUE_URL": urls.Work, "VRAMQ_API_KEYS": "k"}
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_S3", "AWS_REGION"} {
		vars[k] = os.Getenv(k)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() { done <- run(ctx, []string{"-addr=" + addr, "-log-format=text"}, env(vars), &logs) }()
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
	if resp, err := http.Get("http://" + addr + "/metrics"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("metrics: %v %v", resp, err)
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
	h, ok := started.(func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error))
	if !ok {
		t.Fatalf("lambda.Start got %T", started)
	}
	res, err := h(t.Context(), events.APIGatewayV2HTTPRequest{RawPath: "/healthz",
		RequestContext: events.APIGatewayV2HTTPRequestContext{HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "GET", Path: "/healthz"}}})
	if err != nil || res.StatusCode != 200 {
		t.Errorf("healthz through the Lambda handler: %+v %v", res, err)
	}
}
