package publisher_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/vramq/vramq/publisher"
)

// webhookSecret is a secret as OpenAI's dashboard gives one.
var webhookSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("a secret of thirty-two bytes....."))

// delivery is one POST a webhook receiver got.
type delivery struct {
	header http.Header
	body   []byte
}

// webhookReceiver serves a webhook URL that answers each POST with the
// next of statuses (200 once they are used up), and hands each to the
// returned channel.
func webhookReceiver(t *testing.T, statuses ...int) (string, <-chan delivery) {
	t.Helper()
	ch := make(chan delivery, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ch <- delivery{r.Header.Clone(), body}
		status := http.StatusOK
		if len(statuses) > 0 {
			status, statuses = statuses[0], statuses[1:]
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, ch
}

// next waits for the next delivery.
func next(t *testing.T, ch <-chan delivery) delivery {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(time.Minute):
		t.Fatal("no webhook delivered within a minute")
		return delivery{}
	}
}

// Issue 35, item 1: a batch's end is announced as OpenAI announces it, a
// webhook event signed by the Standard Webhooks scheme: openai-go's
// Webhooks.Unwrap, given the secret, verifies each and reads it as its
// own event type, batch.failed for a batch whose file has a bad line and
// batch.completed for one whose job settled.
func TestBatchWebhooksVerifyWithTheOpenAISDK(t *testing.T) {
	t.Parallel()
	url, got := webhookReceiver(t)
	e := newEnv(t, true)
	s := e.serve(publisher.Config{ChunkItems: 1, BatchWebhookURL: url, BatchWebhookSecret: webhookSecret})
	c := s.sdk("")
	sdk := openai.NewClient(option.WithWebhookSecret(webhookSecret))

	bad := newBatch(t, c, upload(t, c, "bad.jsonl", []byte("{\n")).ID, openai.BatchNewParamsEndpointV1Embeddings)
	d := next(t, got)
	ev, err := sdk.Webhooks.Unwrap(d.body, d.header)
	if err != nil {
		t.Fatalf("Unwrap: %v (%s)", err, d.body)
	}
	if f := ev.AsBatchFailed(); f.Type != "batch.failed" || f.Data.ID != bad.ID || f.Object != "event" || !strings.HasPrefix(f.ID, "evt_") ||
		f.CreatedAt == 0 || d.header.Get("webhook-id") != f.ID {
		t.Errorf("batch.failed: %s (webhook-id %s)", d.body, d.header.Get("webhook-id"))
	}

	bt := newBatch(t, c, upload(t, c, "ok.jsonl", embeddingLines(2)).ID, openai.BatchNewParamsEndpointV1Embeddings)
	putResults(t, e, bt.ID, 0, 2)
	d = next(t, got)
	if ev, err = sdk.Webhooks.Unwrap(d.body, d.header); err != nil {
		t.Fatalf("Unwrap: %v (%s)", err, d.body)
	}
	if done := ev.AsBatchCompleted(); done.Type != "batch.completed" || done.Data.ID != bt.ID {
		t.Errorf("batch.completed: %s", d.body)
	}
	if b, err := c.Batches.Get(t.Context(), bt.ID); err != nil || b.Status != openai.BatchStatusCompleted {
		t.Errorf("the batch announced completed: %v %s", err, b.RawJSON())
	}
	// Another secret's signature is refused: the SDK checks it.
	other := openai.NewClient(option.WithWebhookSecret("whsec_" + base64.StdEncoding.EncodeToString([]byte("another secret of thirty-two b.."))))
	if _, err := other.Webhooks.Unwrap(d.body, d.header); err == nil {
		t.Error("Unwrap with another secret took the event")
	}
}

// The same event verified with the official JavaScript SDK (npm openai,
// pinned in testdata/jsclient/package-lock.json): webhook.mjs hands the
// delivery's body and headers to client.webhooks.unwrap with the secret,
// which takes it and reads batch.failed for the batch; with another secret
// it throws.
func TestBatchWebhooksWithTheOpenAIJavaScriptSDK(t *testing.T) {
	t.Parallel()
	node := jsNode(t)
	url, got := webhookReceiver(t)
	e := newEnv(t, true)
	s := e.serve(publisher.Config{BatchWebhookURL: url, BatchWebhookSecret: webhookSecret})
	c := s.sdk("")
	bad := newBatch(t, c, upload(t, c, "bad.jsonl", []byte("{\n")).ID, openai.BatchNewParamsEndpointV1Embeddings)
	d := next(t, got)
	headers := map[string]string{}
	for k := range d.header {
		headers[strings.ToLower(k)] = d.header.Get(k)
	}
	unwrap := func(secret string) (string, error) {
		in, _ := json.Marshal(map[string]any{"body": string(d.body), "headers": headers, "secret": secret})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, "webhook.mjs")
		cmd.Dir = jsClientDir
		cmd.Stdin = bytes.NewReader(in)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err != nil {
			return stderr.String(), err
		}
		return stdout.String(), nil
	}
	out, err := unwrap(webhookSecret)
	if err != nil {
		t.Fatalf("webhooks.unwrap: %v: %s", err, out)
	}
	var ev struct {
		ID, Type, Object string
		Data             struct{ ID string }
	}
	if err := json.Unmarshal([]byte(out), &ev); err != nil || ev.Type != "batch.failed" || ev.Data.ID != bad.ID || ev.Object != "event" ||
		ev.ID != d.header.Get("webhook-id") {
		t.Errorf("the event as the JavaScript SDK read it: %s (%v)", out, err)
	}
	if out, err := unwrap("whsec_" + base64.StdEncoding.EncodeToString([]byte("another secret of thirty-two b.."))); err == nil {
		t.Errorf("webhooks.unwrap with another secret took the event: %s", out)
	}
}
