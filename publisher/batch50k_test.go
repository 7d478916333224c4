package publisher_test

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/internal/heaptest"
)

// A 50,000-line batch of each API through a real subscriber on the
// emulator's queues and the fake model server: the create's heap (for
// OpenAI's, the create and the sweep that validates and sends it; the
// subscriber not yet started, so the heap is the publisher's), the
// finalization's (the sweep that writes the output file or the results;
// the subscriber idle), and the time from the create to the end. Minutes
// on 2 shared cores, so only with VRAMQ_BATCH_50K=1 (bench/batchcreate.md):
//
//	VRAMQ_BATCH_50K=1 go test -count=1 -run TestBatchesOf50000LinesEndToEnd -v -timeout 30m ./publisher/
func TestBatchesOf50000LinesEndToEnd(t *testing.T) {
	if os.Getenv("VRAMQ_BATCH_50K") == "" {
		t.Skip("VRAMQ_BATCH_50K is not set: minutes of work")
	}
	n := 50_000
	if v := os.Getenv("VRAMQ_BATCH_LINES"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	prompt := func(i int) string { return fmt.Sprintf("summarize document %d in a sentence or two", i) }
	// until polls settled (reads never finalize a batch) every half
	// second, for up to 20 minutes.
	until := func(t *testing.T, settled func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Minute); !settled(); time.Sleep(500 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("not settled within 20 minutes")
			}
		}
	}
	sweep := func(t *testing.T, s *server) {
		if err := s.pub.Sweep(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("OpenAI", func(t *testing.T) {
		e := newEnv(t, true)
		srv := fakeoai.New(fakeoai.Config{OutputTokens: func(string, int) int { return 8 }})
		t.Cleanup(srv.Close)
		s := e.serveUnswept(publisher.Config{})
		var in bytes.Buffer
		for i := range n {
			fmt.Fprintf(&in, `{"custom_id":"doc-%05d","method":"POST","url":"/v1/chat/completions","body":{"model":"fake-model","max_tokens":64,`+
				`"messages":[{"role":"user","content":%q}]}}`+"\n", i, prompt(i))
		}
		file := s.uploadBatchFile(t, in.Bytes())
		start := time.Now()
		var b batchJSON
		createS, createMiB := heaptest.Timed(func() {
			r := s.do(http.MethodPost, "/v1/batches", map[string]string{"Content-Type": "application/json"},
				[]byte(fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, file)))
			r.json(t, &b)
			sweep(t, s)
		})
		if b = s.waitBatchJSON(t, b.ID, func(b batchJSON) bool { return b.Status != "validating" }); b.Status != "in_progress" {
			t.Fatalf("after the validating sweep: %+v", b)
		}
		e.runServerSubscriber(srv)
		until(t, func() bool {
			var now batchJSON
			s.do(http.MethodGet, "/v1/batches/"+b.ID, nil, nil).json(t, &now)
			return now.Status == "finalizing"
		})
		runS := time.Since(start).Seconds()
		finalS, finalMiB := heaptest.Timed(func() { sweep(t, s) })
		b = s.waitBatchJSON(t, b.ID, func(b batchJSON) bool { return b.Status == "completed" })
		total := time.Since(start).Seconds()
		if b.RequestCounts.Completed != n || b.OutputFileID == nil {
			t.Fatalf("completed: %+v", b)
		}
		t.Logf("OpenAI batch of %d lines (%.1f MiB file): create and validation %.1f s, peak heap %.1f MiB; settled after %.1f s; "+
			"finalization %.1f s, peak heap %.1f MiB; create to completed %.1f s", n, float64(in.Len())/(1<<20), createS, createMiB, runS,
			finalS, finalMiB, total)
	})
	t.Run("Anthropic", func(t *testing.T) {
		e := newEnv(t, true)
		srv := fakeoai.New(fakeoai.Config{OutputTokens: func(string, int) int { return 8 }})
		t.Cleanup(srv.Close)
		s := e.serveUnswept(publisher.Config{})
		a := anthropicClient{s, ""}
		body := createBody(n, func(i int) string {
			return fmt.Sprintf(`{"model":"fake-model","max_tokens":64,"messages":[{"role":"user","content":%q}]}`, prompt(i))
		})
		start := time.Now()
		var r reply
		createS, createMiB := heaptest.Timed(func() { r = a.do(http.MethodPost, "/v1/messages/batches", body) })
		var b msgBatch
		r.json(t, &b)
		if r.status != http.StatusOK {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		e.runServerSubscriber(srv)
		until(t, func() bool { return a.batch(b.ID).RequestCounts.Processing == 0 })
		runS := time.Since(start).Seconds()
		finalS, finalMiB := heaptest.Timed(func() { sweep(t, s) })
		b = a.wait(b.ID, time.Minute, ended)
		total := time.Since(start).Seconds()
		if b.RequestCounts.Succeeded != n {
			t.Fatalf("ended: %+v", b)
		}
		t.Logf("Message Batch of %d requests (%.1f MiB body): create %.1f s, peak heap %.1f MiB; settled after %.1f s; "+
			"finalization %.1f s, peak heap %.1f MiB; create to ended %.1f s", n, float64(len(body))/(1<<20), createS, createMiB, runS,
			finalS, finalMiB, total)
	})
}
