package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
)

// probes is a prober whose answers the test sets.
type probes struct{ live, healthy error }

func (p probes) Live() error    { return p.live }
func (p probes) Healthy() error { return p.healthy }

// status GETs url and returns its status code and body.
func status(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Issue 34 item 11: a subscriber whose model needs an operator (a spent
// quota, a refused key) answered /healthz 503, which `subscriber
// healthcheck` asked, so ECS replaced a task that was fine; each
// replacement took a round of messages and handed them back, a receive
// each, until good messages were dead-lettered. Liveness (/livez, what the
// healthcheck asks) ignores the operator state; readiness (/healthz) still
// reports it; what liveness is for (a lost queue or device) still fails it.
func TestLivenessIgnoresTheOperatorState(t *testing.T) {
	for _, tc := range []struct {
		name           string
		p              probes
		livez, healthz int
	}{
		{"well", probes{}, 200, 200},
		{"needs an operator", probes{healthy: errors.New("subscriber: stopped until an operator acts: insufficient_quota")}, 200, 503},
		{"receives failing", probes{live: errors.New("receives failing since 2026-01-01T00:00:00Z"),
			healthy: errors.New("receives failing since 2026-01-01T00:00:00Z")}, 503, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeAddr(t)
			srv, err := serve(addr, prometheus.NewRegistry(), tc.p, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			if got, body := status(t, "http://"+addr+"/livez"); got != tc.livez {
				t.Errorf("/livez: %d %q; want %d", got, body, tc.livez)
			}
			if got, body := status(t, "http://"+addr+"/healthz"); got != tc.healthz {
				t.Errorf("/healthz: %d %q; want %d", got, body, tc.healthz)
			}
			env := map[string]string{"VRAMQ_METRICS_ADDR": addr}
			err = run(t.Context(), []string{"healthcheck"}, func(k string) string { return env[k] }, &bytes.Buffer{})
			if (err == nil) != (tc.livez == 200) {
				t.Errorf("subscriber healthcheck: %v; want it to pass exactly when /livez does (%d)", err, tc.livez)
			}
		})
	}
}

// The same through the real subscriber, on the emulator's queues, against
// the fake model server with its quota spent: once the subscriber has
// stopped for an operator, /healthz says why and the container health
// check still passes.
func TestAQuotaSpentSubscriberStaysLive(t *testing.T) {
	srv := fakeoai.New(fakeoai.Config{})
	defer srv.Close()
	srv.SetQuotaExhausted(true)
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	works := []job.Work{{V: job.Version, JobID: "quota", Chunk: 0, Chunks: 1, Endpoint: "/v1/chat/completions",
		Items: []job.Item{{ID: "a", Body: json.RawMessage(`{"model":"fake-model","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`)}}}}
	if err := jobq.Send(t.Context(), client, urls.Work, works); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	env := map[string]string{"QUEUE_URL": urls.Work, "RESULTS_QUEUE_URL": urls.Results, "DLQ_URL": urls.DLQ,
		"VRAMQ_WAIT_TIME": "1s", "VRAMQ_LOG_LEVEL": "warn", "VRAMQ_METRICS_ADDR": addr,
		"VRAMQ_MODEL_SERVER": srv.URL(), "VRAMQ_MODEL_SERVER_MODELS": "fake-model"}
	getenv := func(k string) string {
		if v, ok := env[k]; ok {
			return v
		}
		return os.Getenv(k)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var logs syncBuffer
	exited := make(chan error, 1)
	go func() { exited <- run(ctx, nil, getenv, &logs) }()
	defer func() {
		cancel()
		if err := <-exited; err != nil {
			t.Errorf("run: %v", err)
		}
		if t.Failed() {
			t.Logf("subscriber log:\n%s", logs.String())
		}
	}()

	var code int
	var body string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/healthz did not report the spent quota within a minute (last: %d %q)", code, body)
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			continue // not listening yet
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if code, body = resp.StatusCode, string(b); code == http.StatusServiceUnavailable && strings.Contains(body, "insufficient_quota") {
			break
		}
	}
	if got, b := status(t, "http://"+addr+"/livez"); got != http.StatusOK {
		t.Errorf("/livez while an operator is needed: %d %q; want 200", got, b)
	}
	if err := run(t.Context(), []string{"healthcheck"}, getenv, &bytes.Buffer{}); err != nil {
		t.Errorf("subscriber healthcheck while an operator is needed: %v; want it to pass (ECS would replace the task)", err)
	}
}

// `subscriber healthcheck` takes flags only: a stray argument (a path
// written after it in a task definition, say) is a usage error, exit 2,
// before anything is asked, even of a subscriber that would answer 200.
func TestHealthcheckRefusesStrayArguments(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked.Add(1) }))
	defer srv.Close()
	env := map[string]string{"VRAMQ_METRICS_ADDR": srv.Listener.Addr().String()}
	getenv := func(k string) string { return env[k] }
	if err := run(t.Context(), []string{"healthcheck"}, getenv, &bytes.Buffer{}); err != nil {
		t.Fatalf("healthcheck of a live subscriber: %v", err)
	}
	asked.Store(0)
	for _, args := range [][]string{{"healthcheck", "/livez"}, {"healthcheck", "-timeout=1s", "extra"}} {
		err := run(t.Context(), args, getenv, &bytes.Buffer{})
		var msg bytes.Buffer
		if code := cli.ExitCode("subscriber", err, &msg); code != 2 || !strings.Contains(msg.String(), "unexpected arguments") {
			t.Errorf("%q: exit %d, %q; want 2 and the arguments named", args, code, msg.String())
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("%d requests made with stray arguments; want none", n)
	}
}
