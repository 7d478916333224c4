package sdkclients

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/model/modelserver"
	"github.com/vramq/vramq/publisher"
)

// pipeline is a publisher behind an httptest server and a real subscriber
// whose model server is srv, on fresh queues and a bucket of the emulator's.
func pipeline(t *testing.T, srv *fakeoai.Server, keys ...string) string {
	t.Helper()
	s := newStack(t, publisher.Config{Jobs: publisher.Jobs{ChunkItems: 2}, API: publisher.API{APIKeys: keys}})
	m, err := modelserver.Open(t.Context(), modelserver.Config{BaseURL: srv.URL(), Models: []string{"fake-model"},
		Messages: modelserver.MessagesNative, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	s.run(m, nil)
	return s.URL
}

func sdk(url, key string) anthropic.Client {
	return anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey(key), option.WithMaxRetries(0))
}

func requests(n, maxTokens int) []anthropic.MessageBatchNewParamsRequest {
	out := make([]anthropic.MessageBatchNewParamsRequest, n)
	for i := range out {
		out[i] = anthropic.MessageBatchNewParamsRequest{CustomID: fmt.Sprintf("q-%d", i), Params: anthropic.MessageBatchNewParamsRequestParams{
			Model: "fake-model", MaxTokens: int64(maxTokens),
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(fmt.Sprintf("question %d", i)))},
		}}
	}
	return out
}

// wantStatus checks err is the SDK's *anthropic.Error with status.
func wantStatus(t *testing.T, what string, err error, status int) {
	t.Helper()
	var e *anthropic.Error
	if !errors.As(err, &e) || e.StatusCode != status {
		t.Errorf("%s: %v; want the SDK's error with status %d", what, err, status)
	}
}

// Anthropic's Go SDK (github.com/anthropics/anthropic-sdk-go/v2) as the
// client of the publisher's Message Batches: create, poll to ended, the
// results stream parsed into its types, list pages followed by its
// auto-pager, a cancel mid-run, delete, and another tenant's 404s as its
// NotFound errors.
func TestMessageBatchesWithTheAnthropicGoSDK(t *testing.T) {
	// 31 steps of 20 ms a request, 16 at a time, without KV metrics (the
	// subscriber admits two rounds of that): the large batch runs for
	// about 15 s, past the 5 s a subscriber's answer about a job's cancel
	// lasts, so the cancel reaches chunks not yet started.
	srv := fakeoai.New(fakeoai.Config{TokenLatency: 20 * time.Millisecond, NoMetrics: true,
		OutputTokens: func(string, int) int { return 30 }})
	defer srv.Close()
	url := pipeline(t, srv, "acme:key-a", "globex:key-b")
	a, b := sdk(url, "key-a"), sdk(url, "key-b")
	ctx := t.Context()

	small, err := a.Messages.Batches.New(ctx, anthropic.MessageBatchNewParams{Requests: requests(3, 8)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if small.ProcessingStatus != anthropic.MessageBatchProcessingStatusInProgress || small.RequestCounts.Processing != 3 ||
		!small.ExpiresAt.Equal(small.CreatedAt.Add(24*time.Hour)) || small.ResultsURL != "" {
		t.Errorf("created: %s", small.RawJSON())
	}
	large, err := a.Messages.Batches.New(ctx, anthropic.MessageBatchNewParams{Requests: requests(400, 32)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	_, err = b.Messages.Batches.Get(ctx, small.ID, anthropic.MessageBatchGetParams{})
	wantStatus(t, "another tenant's Get", err, 404)
	_, err = b.Messages.Batches.Cancel(ctx, small.ID, anthropic.MessageBatchCancelParams{})
	wantStatus(t, "another tenant's Cancel", err, 404)
	_, err = b.Messages.Batches.Delete(ctx, small.ID, anthropic.MessageBatchDeleteParams{})
	wantStatus(t, "another tenant's Delete", err, 404)
	_, err = a.Messages.Batches.Delete(ctx, large.ID, anthropic.MessageBatchDeleteParams{})
	wantStatus(t, "deleting a batch in progress", err, 400)

	// The auto-pager, one batch a page.
	var listed []string
	pager := a.Messages.Batches.ListAutoPaging(ctx, anthropic.MessageBatchListParams{Limit: anthropic.Int(1)})
	for pager.Next() {
		listed = append(listed, pager.Current().ID)
	}
	if err := pager.Err(); err != nil || len(listed) != 2 || listed[0] != large.ID || listed[1] != small.ID {
		t.Errorf("listed %v, %v", listed, err)
	}

	poll := func(id string, done func(*anthropic.MessageBatch) bool) *anthropic.MessageBatch {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			mb, err := a.Messages.Batches.Get(ctx, id, anthropic.MessageBatchGetParams{})
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if done(mb) {
				return mb
			}
			if time.Now().After(deadline) {
				t.Fatalf("batch %s: %s", id, mb.RawJSON())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	ended := func(mb *anthropic.MessageBatch) bool {
		return mb.ProcessingStatus == anthropic.MessageBatchProcessingStatusEnded
	}

	poll(large.ID, func(mb *anthropic.MessageBatch) bool { return mb.RequestCounts.Succeeded > 0 })
	c, err := a.Messages.Batches.Cancel(ctx, large.ID, anthropic.MessageBatchCancelParams{})
	if err != nil || c.ProcessingStatus != anthropic.MessageBatchProcessingStatusCanceling || c.CancelInitiatedAt.IsZero() {
		t.Errorf("Cancel: %v %v", err, c)
	}
	done := poll(large.ID, ended)
	if n := done.RequestCounts; n.Canceled == 0 || n.Succeeded == 0 || n.Succeeded+n.Errored+n.Canceled != 400 {
		t.Errorf("canceled: %s", done.RawJSON())
	}

	got := poll(small.ID, ended)
	if got.RequestCounts.Succeeded != 3 || got.ResultsURL == "" || got.EndedAt.IsZero() {
		t.Errorf("ended: %s", got.RawJSON())
	}
	stream := a.Messages.Batches.ResultsStreaming(ctx, small.ID, anthropic.MessageBatchResultsParams{})
	n := 0
	for stream.Next() {
		r := stream.Current()
		msg := r.Result.AsSucceeded().Message
		if r.CustomID != fmt.Sprintf("q-%d", n) || r.Result.Type != "succeeded" || msg.Role != "assistant" || len(msg.Content) != 1 ||
			msg.Content[0].Text == "" || msg.Usage.OutputTokens == 0 || msg.StopReason != anthropic.StopReasonMaxTokens {
			t.Errorf("result %d: %s", n, r.RawJSON())
		}
		n++
	}
	if err := stream.Err(); err != nil || n != 3 {
		t.Errorf("%d results, %v", n, err)
	}
	del, err := a.Messages.Batches.Delete(ctx, small.ID, anthropic.MessageBatchDeleteParams{})
	if err != nil || del.ID != small.ID {
		t.Errorf("Delete: %v %v", err, del)
	}
	_, err = a.Messages.Batches.Get(ctx, small.ID, anthropic.MessageBatchGetParams{})
	wantStatus(t, "Get after Delete", err, 404)
}
