package publisher_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/publisher"
)

// A cancel reaches a batch on a model server without KV metrics (TGI,
// Ollama, OpenAI): with the default flags (16 requests at once), a 3,000-line
// chat batch cancelled 10 s after its create runs, after the cancel, no more
// than what was in flight (two rounds of the server's concurrency, a chunk
// at most past them), since the subscriber admits no more than that
// (backend.Slots) and a chunk not started is dropped by the cancel: the rest
// of the batch's lines are batch_cancelled. Before, every message was
// admitted at once, each waiting inside the process for a request slot, and
// all 3,000 lines ran. The fake takes 11 steps of 20 ms a request (a
// prefill and 10 tokens): the server alone needs about 41 s for the batch,
// and runs about 72 lines a second.
func TestBatchCancelReachesUnstartedChunks(t *testing.T) {
	t.Parallel()
	// A server that answers 16 requests at a time in about half a second
	// each, as the one issue 32 measured this against did (it ran 320 of
	// 3,000 lines in the 10 s before a cancel): about 32 lines a second.
	// How many lines a server runs before the cancel is its speed, not
	// admission's doing; what admission decides is how many of the rest
	// still run after it.
	srv := fakeoai.New(fakeoai.Config{TokenLatency: 45 * time.Millisecond, NoMetrics: true,
		OutputTokens: func(string, int) int { return 10 }})
	defer srv.Close()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	c := s.client("")
	const n = 3000
	var in bytes.Buffer
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"c-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"fake-model","messages":[{"role":"user","content":"question %d"}],"max_tokens":16}}`+"\n", i, i)
	}
	f := upload(t, c, "cancel.jsonl", in.Bytes())
	e.runServerSubscriber(srv)
	created := time.Now()
	bt := newBatch(t, c, f.ID, "/v1/chat/completions")
	time.Sleep(time.Until(created.Add(10 * time.Second)))
	if _, err := c.cancelBatch(t.Context(), bt.ID); err != nil {
		t.Fatalf("cancel: %s", apiError(err))
	}
	atCancel := srv.Stats().Admitted
	done := waitBatch(t, c, bt.ID, 2*time.Minute, "cancelled")
	cancelled := 0
	for _, l := range fileLines(t, c, done.ErrorFileID) {
		if l.Error != nil && l.Error.Code == "batch_cancelled" {
			cancelled++
		}
	}
	after := srv.Stats().Admitted - atCancel
	t.Logf("%d of %d lines batch_cancelled (%.0f%%), %d completed; %d requests at the server at the cancel, %d after it",
		cancelled, n, 100*float64(cancelled)/n, done.RequestCounts.Completed, atCancel, after)
	if cancelled < n*8/10 {
		t.Errorf("%d of %d lines batch_cancelled; want at least 80%%", cancelled, n)
	}
	if cancelled+int(done.RequestCounts.Completed) != n {
		t.Errorf("%d cancelled + %d completed; want all %d lines accounted", cancelled, done.RequestCounts.Completed, n)
	}
	// Two rounds of 16 in flight, the rest of a 32-item chunk, and what
	// starts while the subscriber's cached answer for the job lasts
	// (-cancel-check-ttl, 5 s, at about 32 lines a second).
	if most := int64(2*16 + 32 + 5*32); after > most {
		t.Errorf("%d requests after the cancel; want at most %d", after, most)
	}
}
