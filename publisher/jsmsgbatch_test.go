package publisher_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/publisher"
)

// jsMsgSummary is what msgbatch.mjs prints when every check passed.
type jsMsgSummary struct {
	SDK            string   `json:"sdk"`
	Node           string   `json:"node"`
	BatchID        string   `json:"batch_id"`
	CanceledID     string   `json:"canceled_id"`
	Statuses       []string `json:"statuses"`
	RequestCounts  jsCounts `json:"request_counts"`
	CanceledCounts jsCounts `json:"canceled_counts"`
	Results        []string `json:"results"`
	Listed         []string `json:"listed"`
	Errors         struct {
		NotFound   jsAnthropicError `json:"not_found"`
		BadRequest jsAnthropicError `json:"bad_request"`
		Gone       jsAnthropicError `json:"gone"`
	} `json:"errors"`
}

// jsAnthropicError is an API error as the SDK's error class read it.
type jsAnthropicError struct {
	Status int    `json:"status"`
	Type   string `json:"type"`
}

type jsCounts struct {
	Processing int `json:"processing"`
	Succeeded  int `json:"succeeded"`
	Errored    int `json:"errored"`
	Canceled   int `json:"canceled"`
	Expired    int `json:"expired"`
}

// Message Batches with the official Anthropic JavaScript SDK (npm
// @anthropic-ai/sdk, pinned in testdata/jsclient/package-lock.json):
// msgbatch.mjs creates two batches, gets the SDK's NotFoundError for
// another tenant and BadRequestError for a delete before the end, cancels
// the large one mid-run, polls the other to ended, reads its results with
// the SDK's results() (which follows results_url), lists both with the
// auto-pager one a page, and deletes one; it exits non-zero on any
// mismatch. Here its summary is checked.
func TestMessageBatchesWithTheAnthropicJavaScriptSDK(t *testing.T) {
	t.Parallel()
	node := jsNode(t)
	// 31 steps of 20 ms a request, 16 at a time, without KV metrics: the
	// large batch runs past the 5 s a subscriber's answer about a job's
	// cancel lasts, so the cancel reaches chunks not yet started.
	srv := fakeoai.New(fakeoai.Config{TokenLatency: 20 * time.Millisecond, NoMetrics: true,
		OutputTokens: func(string, int) int { return 30 }})
	defer srv.Close()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{ChunkItems: 2}, API: publisher.API{APIKeys: []string{"acme:key-js", "globex:key-other"}}})
	m, err := modelserver.Open(t.Context(), modelserver.Config{BaseURL: srv.URL(), Models: []string{"fake-model"},
		Messages: modelserver.MessagesNative, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	e.runModel(m, nil)

	const n, large = 5, 400
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := jsCommand(ctx, node, "msgbatch.mjs", "ANTHROPIC_", "ANTHROPIC_BASE_URL="+s.url, "ANTHROPIC_API_KEY=key-js",
		"VRAMQ_OTHER_API_KEY=key-other", "VRAMQ_BATCH_REQUESTS="+strconv.Itoa(n), "VRAMQ_CANCEL_REQUESTS="+strconv.Itoa(large), "VRAMQ_BATCH_DEADLINE_S=120")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("node msgbatch.mjs exited %d:\n%s%s", exit.ExitCode(), stderr.Bytes(), stdout.Bytes())
		}
		t.Fatalf("node msgbatch.mjs: %v\n%s", err, stderr.Bytes())
	}
	var sum jsMsgSummary
	dec := json.NewDecoder(bytes.NewReader(stdout.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sum); err != nil {
		t.Fatalf("summary %q: %v", stdout.Bytes(), err)
	}
	t.Logf("%s on Node %s: %s went %s; the canceled one ended %+v", sum.SDK, sum.Node, sum.BatchID, strings.Join(sum.Statuses, " → "),
		sum.CanceledCounts)
	cc := sum.CanceledCounts
	if !strings.HasPrefix(sum.SDK, "anthropic-sdk-typescript ") || sum.RequestCounts != (jsCounts{Succeeded: n}) ||
		len(sum.Results) != n || slices.ContainsFunc(sum.Results, func(r string) bool { return r != "succeeded" }) ||
		cc.Succeeded == 0 || cc.Canceled == 0 || cc.Succeeded+cc.Errored+cc.Canceled != large ||
		!slices.Equal(sum.Listed, []string{sum.CanceledID, sum.BatchID}) ||
		sum.Errors.NotFound.Status != 404 || sum.Errors.NotFound.Type != "not_found_error" ||
		sum.Errors.BadRequest.Status != 400 || sum.Errors.BadRequest.Type != "invalid_request_error" ||
		sum.Errors.Gone.Status != 404 {
		t.Errorf("summary: %s", stdout.Bytes())
	}
}
