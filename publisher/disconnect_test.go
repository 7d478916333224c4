package publisher_test

// Clients that go away mid-request. The rule (README, "Submitting a job"):
// a request whose body never arrived whole enqueues nothing and records
// nothing, so its retry starts afresh; once a job is accepted for sending,
// the send is detached from the request (publisher's detach: the client
// hanging up does not cancel it), so the job reaches the queue whole, and a
// retry with the same Idempotency-Key gets that job rather than a second
// copy. Were the send cut short anyway (the process dies), the idempotency
// record is left "sending" and a retry after IdempotencyStale sends the job
// again under the same id (TestInjectedSendFailures covers the resend).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/faultproxy"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
)

// requestsWith is how many requests the publisher answered with code on
// route, from its own counter.
func requestsWith(t *testing.T, s *server, route string, code int) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "vramq_publisher_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["code"] == fmt.Sprint(code) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A client that sends half its body and hangs up: the publisher answers
// 400 to nobody, enqueues nothing and keeps no idempotency record, so the
// whole request sent again with the same key is a fresh job.
func TestClientHangsUpMidBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	body := jobBody(t, manyItems("half-", 40, 50), 4)

	u, err := url.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nIdempotency-Key: half-body\r\nContent-Length: %d\r\n\r\n", u.Host, len(body))
	if _, err := conn.Write(body[:len(body)/2]); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	wait.For(t, 20*time.Second, "the publisher to answer the cut request", func() bool {
		return requestsWith(t, s, "POST /v1/jobs", http.StatusBadRequest) == 1
	})
	if n := e.queued(); n != 0 {
		t.Fatalf("%d messages on the queue from a request whose body never arrived", n)
	}

	r := s.post(body, map[string]string{"Idempotency-Key": "half-body"})
	if r.status != http.StatusAccepted || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the whole request with the same key: %d %s, replayed %q; want a fresh 202", r.status, r.body,
			r.header.Get("Idempotent-Replayed"))
	}
	var a accepted
	r.json(t, &a)
	checkWhole(t, a, e.drain(a.Chunks))
}

// A client that goes away while its job's chunks are being sent, on a slow
// queue: the job still reaches the queue whole, each chunk once, and the
// client's retry with the same Idempotency-Key is told to wait while the
// sending goes on, then gets the same job.
func TestClientGoesAwayWhileChunksAreSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	// Every SendMessageBatch waits 100ms at the proxy: the job's 30 batches
	// take about a second at 4 at a time, long enough to leave mid-way.
	proxy, err := faultproxy.New(os.Getenv("AWS_ENDPOINT_URL"),
		faultproxy.Faults{Slow: 1, SlowDelay: 100 * time.Millisecond, Actions: []string{"SendMessageBatch"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	cfg, err := proxy.Config(t.Context(), testLogger())
	if err != nil {
		t.Fatal(err)
	}
	s := e.serve(publisher.Config{Queue: jobs.NewSQSQueue(proxy.SQS(cfg), e.urls.Work)})
	const chunks = 300
	body := jobBody(t, manyItems("gone-", chunks, 3), 1)
	key := map[string]string{"Content-Type": "application/json", "Idempotency-Key": "gone-away"}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/jobs", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range key {
		req.Header.Set(k, v)
	}
	gone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			err = fmt.Errorf("answered %s before the client left", resp.Status)
		}
		gone <- err
	}()
	wait.For(t, 30*time.Second, "the first chunks on the queue", func() bool { return e.queued() > 0 })
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's request: %v; want it cancelled mid-send", err)
	}
	atLeave := e.queued()
	if atLeave >= chunks {
		t.Fatalf("all %d chunks were on the queue when the client left: the test proves nothing", atLeave)
	}

	// The retry, until the first request's sending is over.
	var r reply
	waits := 0
	wait.For(t, 60*time.Second, "the retry to get the job", func() bool {
		r = s.do("POST", "/v1/jobs", key, body)
		if r.status == http.StatusConflict {
			waits++
			if r.header.Get("Retry-After") == "" {
				t.Error("409 without Retry-After")
			}
			return false
		}
		return true
	})
	if r.status != http.StatusAccepted || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the client left: %d %s (replayed %q); want the first request's job replayed", r.status, r.body,
			r.header.Get("Idempotent-Replayed"))
	}
	var a accepted
	r.json(t, &a)
	if a.Chunks != chunks {
		t.Fatalf("accepted %+v, want %d chunks", a, chunks)
	}
	checkWhole(t, a, e.drain(chunks))
	t.Logf("the client left with %d of %d chunks on the queue; its retry was told to wait %d times", atLeave, chunks, waits)
}
