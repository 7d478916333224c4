package publisher_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/publishertest"
)

// The same event verified with the official JavaScript SDK (npm openai,
// pinned in testdata/jsclient/package-lock.json): webhook.mjs hands the
// delivery's body and headers to client.webhooks.unwrap with the secret,
// which takes it and reads batch.failed for the batch; with another secret
// it throws.
func TestBatchWebhooksWithTheOpenAIJavaScriptSDK(t *testing.T) {
	t.Parallel()
	node := jsNode(t)
	url, got := publishertest.WebhookReceiver(t)
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Batches: publisher.Batches{BatchWebhookURL: url, BatchWebhookSecret: publishertest.WebhookSecret}})
	c := s.client("")
	bad := newBatch(t, c, upload(t, c, "bad.jsonl", []byte("{\n")).ID, "/v1/embeddings")
	d := publishertest.NextDelivery(t, got)
	if ev := jsEvent(t, node, d); ev.Type != "batch.failed" || ev.Data.ID != bad.ID {
		t.Errorf("the event as the JavaScript SDK read it: %s", ev.raw)
	}
	if out, err := jsUnwrap(t, node, d, "whsec_"+base64.StdEncoding.EncodeToString([]byte("another secret of thirty-two b.."))); err == nil {
		t.Errorf("webhooks.unwrap with another secret took the event: %s", out)
	}
}

// jsWebhookEvent is an event as the JavaScript SDK's webhooks.unwrap read it.
type jsWebhookEvent struct {
	ID, Type, Object string
	Data             struct{ ID string }
	raw              string
}

// jsEvent is delivery d as the JavaScript SDK reads it with the secret
// (publishertest.WebhookSecret): an event whose id is the webhook-id, as
// Standard Webhooks has it.
func jsEvent(t *testing.T, node string, d publishertest.Delivery) jsWebhookEvent {
	t.Helper()
	out, err := jsUnwrap(t, node, d, publishertest.WebhookSecret)
	if err != nil {
		t.Fatalf("webhooks.unwrap: %v: %s", err, out)
	}
	ev := jsWebhookEvent{raw: out}
	if err := json.Unmarshal([]byte(out), &ev); err != nil || ev.Object != "event" || ev.ID != d.Header.Get("webhook-id") {
		t.Errorf("the event as the JavaScript SDK read it: %s (%v); want an event with the webhook-id %s", out, err, d.Header.Get("webhook-id"))
	}
	return ev
}

// jsUnwrap hands delivery d to the JavaScript SDK's webhooks.unwrap with
// secret (webhook.mjs), and returns the event as the SDK read it, or its
// error's message.
func jsUnwrap(t *testing.T, node string, d publishertest.Delivery, secret string) (string, error) {
	t.Helper()
	headers := map[string]string{}
	for k := range d.Header {
		headers[strings.ToLower(k)] = d.Header.Get(k)
	}
	in, _ := json.Marshal(map[string]any{"body": string(d.Body), "headers": headers, "secret": secret})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "webhook.mjs")
	cmd.Dir = jsClientDir
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stderr.String(), err
	}
	return stdout.String(), nil
}
