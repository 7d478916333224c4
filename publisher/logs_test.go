package publisher_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/faultproxy"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
)

// lockedBuffer is a bytes.Buffer that several goroutines may write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// refusing is a queue that refuses every entry as SQS refuses a body it
// will never take.
type refusing struct{}

func (refusing) SendBatch(_ context.Context, entries []jobs.Entry) ([]error, error) {
	errs := make([]error, len(entries))
	for i := range errs {
		errs[i] = &jobs.EntryError{Code: "InvalidMessageContents", Message: "refused by the test", SenderFault: true}
	}
	return errs, nil
}

// Requests carrying a recognisable secret in every place a client can put
// one (item text and data, a claim-checked item, the API key, the
// Idempotency-Key, malformed and oversized bodies) go through the publisher
// on every path that logs: accepted, replayed, refused at each step, the
// enqueue failing, and the SDK retrying throttled sends. The log, at debug
// level, says what happened without any of them.
func TestLogsCarryNoPayloadsOrCredentials(t *testing.T) {
	t.Parallel()
	const (
		secret  = "sk_live_51HqSecretItemText9c2f"
		apiKey  = "vq_prod_key_7d1e0b5a93c4f2e8"
		idemKey = "idem-4c8e2a1f9b7d3e6a"
	)
	secretData := base64.StdEncoding.EncodeToString([]byte(secret + "-as-bytes"))
	e := newEnv(t, true)
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// The first send is throttled, so that the SDK's retry line is in the
	// log too; the retry goes through.
	proxy, err := faultproxy.New(os.Getenv("AWS_ENDPOINT_URL"), faultproxy.Faults{Throttle: 1, Actions: []string{"SendMessageBatch"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	go func() {
		for proxy.Injected()[faultproxy.KindThrottle] == 0 && t.Context().Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		_ = proxy.Set(faultproxy.Faults{})
	}()
	cfg, err := proxy.Config(t.Context(), log)
	if err != nil {
		t.Fatal(err)
	}
	base := publisher.Config{Jobs: publisher.Jobs{MaxItemBytes: 2 << 10}, API: publisher.API{APIKeys: []string{apiKey}, MaxBodyBytes: 256 << 10, Logger: log}}
	base.Queue = jobs.NewSQSQueue(proxy.SQS(cfg), e.urls.Work)
	s := e.serve(base)
	failing := base
	failing.Queue = refusing{}
	f := e.serve(failing)

	auth := map[string]string{"Authorization": "Bearer " + apiKey}
	job := `{"items":[{"id":"a","text":"the password is ` + secret + `"},{"id":"b","data":"` + secretData + `"},` +
		`{"id":"big","text":"` + strings.Repeat(secret+" ", 200) + `"}],"options":{"chunk_items":1}}`
	for _, tc := range []struct {
		name   string
		s      *server
		header map[string]string
		body   string
		status int
	}{
		{"accepted, one item claim-checked", s, map[string]string{"Authorization": auth["Authorization"], "Idempotency-Key": idemKey}, job, 202},
		{"replayed", s, map[string]string{"Authorization": auth["Authorization"], "Idempotency-Key": idemKey}, job, 202},
		{"wrong key", s, map[string]string{"Authorization": "Bearer " + secret}, job, 401},
		{"key without a scheme", s, map[string]string{"Authorization": apiKey}, job, 401},
		{"malformed", s, auth, `{"items":[{"id":"a","text":"` + secret + `"}`, 400},
		{"unknown field", s, auth, `{"items":[{"id":"a","text":"x"}],"` + secret + `":1}`, 400},
		{"not base64", s, auth, `{"items":[{"id":"a","data":"` + secret + `!"}]}`, 400},
		{"too large", s, auth, `{"items":[{"id":"a","text":"` + strings.Repeat(secret, 10_000) + `"}]}`, 413},
		{"queue refuses", f, auth, job, 503},
	} {
		h := map[string]string{"Content-Type": "application/json"}
		for k, v := range tc.header {
			h[k] = v
		}
		if r := tc.s.do("POST", "/v1/jobs", h, []byte(tc.body)); r.status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, r.status, r.body, tc.status)
		}
	}

	out := logs.String()
	for _, want := range []string{`"status":202`, `"replayed":true`, `"status":401`, `"status":413`, `"status":503`,
		`"msg":"sending chunks"`, `"component":"aws-sdk"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %s: a path the test means to check did not log", want)
		}
	}
	for _, leak := range []string{secret, secretData, apiKey, idemKey} {
		if strings.Contains(out, leak) {
			t.Errorf("the log contains %q:\n%s", leak, out)
		}
	}
}
