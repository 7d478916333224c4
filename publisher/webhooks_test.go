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
	s := e.serve(publisher.Config{BatchWebhookURL: url, BatchWebhookSecret: publishertest.WebhookSecret})
	c := s.client("")
	bad := newBatch(t, c, upload(t, c, "bad.jsonl", []byte("{\n")).ID, "/v1/embeddings")
	d := publishertest.NextDelivery(t, got)
	out, err := jsUnwrap(t, node, d, publishertest.WebhookSecret)
	if err != nil {
		t.Fatalf("webhooks.unwrap: %v: %s", err, out)
	}
	var ev struct {
		ID, Type, Object string
		Data             struct{ ID string }
	}
	if err := json.Unmarshal([]byte(out), &ev); err != nil || ev.Type != "batch.failed" || ev.Data.ID != bad.ID || ev.Object != "event" ||
		ev.ID != d.Header.Get("webhook-id") {
		t.Errorf("the event as the JavaScript SDK read it: %s (%v)", out, err)
	}
	if out, err := jsUnwrap(t, node, d, "whsec_"+base64.StdEncoding.EncodeToString([]byte("another secret of thirty-two b.."))); err == nil {
		t.Errorf("webhooks.unwrap with another secret took the event: %s", out)
	}
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
