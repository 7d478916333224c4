package publisher_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/publishertest"
)

// jsFlowsSummary is what batchflows.mjs prints last when every check passed.
type jsFlowsSummary struct {
	SDK       string `json:"sdk"`
	Node      string `json:"node"`
	Endpoints map[string]struct {
		BatchID   string `json:"batch_id"`
		Completed int    `json:"completed"`
		Usage     struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	} `json:"endpoints"`
	Cancelled jsEnded `json:"cancelled"`
	Expired   jsEnded `json:"expired"`
}

// jsEnded is a batch stopped mid-run, as batchflows.mjs counted its files.
type jsEnded struct {
	BatchID   string `json:"batch_id"`
	Completed int    `json:"completed"`
	Failed    int    `json:"failed"`
}

// Issue 35, "Done when": the OpenAI JavaScript SDK runs a batch of each of
// the five endpoints (the publisher serving all five, the fake model
// server answering), each with output_expires_after, and checks its output
// lines, its files' expiry and its usage; then a batch cancelled once some
// of it has run and one that expires mid-run, each line then in the output
// file or the error file (batch_cancelled, batch_expired), once. Each
// batch's end is a webhook event the SDK's webhooks.unwrap verifies and
// reads as batch.completed, batch.cancelled or batch.expired. Expiry is
// the record's window moved into the past, as 24 hours would, when the
// script asks on stdout; the publisher's reads and sweeper do the rest.
func TestBatchFlowsWithTheOpenAIJavaScriptSDK(t *testing.T) {
	t.Parallel()
	node := jsNode(t)
	const n, slow, outTokens = 3, 400, 5
	srv := publishertest.MidRunFake(outTokens)
	defer srv.Close()
	hook, delivered := publishertest.WebhookReceiver(t)
	e := newEnv(t, true)
	s := e.serve(publisher.Config{
		Jobs:    publisher.Jobs{ChunkItems: 2, ServedEndpoints: job.BatchEndpoints},
		Batches: publisher.Batches{BatchWebhookURL: hook, BatchWebhookSecret: publishertest.WebhookSecret},
		API: publisher.API{
			APIKeys: []string{"acme:key-js"},
		},
	})
	e.runServerSubscriber(srv)

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	cmd := jsCommand(ctx, node, "batchflows.mjs", "OPENAI_", "OPENAI_BASE_URL="+s.url+"/v1", "OPENAI_API_KEY=key-js",
		"VRAMQ_BATCH_LINES="+strconv.Itoa(n), "VRAMQ_SLOW_LINES="+strconv.Itoa(slow),
		"VRAMQ_OUTPUT_TOKENS="+strconv.Itoa(outTokens), "VRAMQ_BATCH_DEADLINE_S=180")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var last []byte
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		last = bytes.Clone(sc.Bytes())
		var ask struct {
			Expire string `json:"expire"`
		}
		if json.Unmarshal(last, &ask) != nil || ask.Expire == "" {
			continue
		}
		if err := publishertest.ExpireBatch(ctx, e.store, "acme", ask.Expire); err != nil {
			t.Errorf("expiring %s: %v", ask.Expire, err)
			break
		}
		if _, err := io.WriteString(stdin, "expired\n"); err != nil {
			t.Errorf("telling the script: %v", err)
		}
	}
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("node batchflows.mjs exited %d:\n%s%s", exit.ExitCode(), stderr.Bytes(), last)
		}
		t.Fatalf("node batchflows.mjs: %v\n%s", err, stderr.Bytes())
	}
	var sum jsFlowsSummary
	dec := json.NewDecoder(bytes.NewReader(last))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sum); err != nil {
		t.Fatalf("summary %q: %v", last, err)
	}
	t.Logf("%s on Node %s: cancelled %+v, expired %+v", sum.SDK, sum.Node, sum.Cancelled, sum.Expired)
	if !strings.HasPrefix(sum.SDK, "openai-node ") || len(sum.Endpoints) != len(job.BatchEndpoints) {
		t.Errorf("summary: %s", last)
	}

	// What the script saw is what the publisher holds, and announced: each
	// batch's end is one event, which the SDK's webhooks.unwrap verifies.
	wantEvents := map[string]string{sum.Cancelled.BatchID: "batch.cancelled", sum.Expired.BatchID: "batch.expired"}
	for _, ep := range sum.Endpoints {
		wantEvents[ep.BatchID] = "batch.completed"
	}
	for range len(wantEvents) {
		d := publishertest.NextDelivery(t, delivered)
		ev := jsEvent(t, node, d)
		if ev.Type != wantEvents[ev.Data.ID] {
			t.Errorf("the event as the JavaScript SDK read it: %s; want %s", ev.raw, wantEvents[ev.Data.ID])
		}
		delete(wantEvents, ev.Data.ID)
	}
	if len(wantEvents) != 0 {
		t.Errorf("no event for %v", wantEvents)
	}
	c := s.client("key-js")
	for _, ep := range job.BatchEndpoints {
		got := sum.Endpoints[ep]
		b, err := c.getBatch(t.Context(), got.BatchID)
		if err != nil || b.Status != "completed" || b.field("endpoint") != strconv.Quote(ep) || b.RequestCounts.Completed != n || got.Completed != n {
			t.Errorf("%s batch %q: %v %s", ep, got.BatchID, err, b.RawJSON())
		}
	}
	for want, got := range map[string]jsEnded{"cancelled": sum.Cancelled, "expired": sum.Expired} {
		b, err := c.getBatch(t.Context(), got.BatchID)
		if err != nil || b.Status != want || int(b.RequestCounts.Completed) != got.Completed || int(b.RequestCounts.Failed) != got.Failed ||
			got.Completed == 0 || got.Failed == 0 || got.Completed+got.Failed != slow {
			t.Errorf("%s batch %+v: %v %s", want, got, err, b.RawJSON())
		}
	}
}
