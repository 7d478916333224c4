package batches

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/internal/heaptest"
	"github.com/vramq/vramq/publisher/jobs"
)

// BenchmarkMessageBatchLifecycle is BenchmarkBatchLifecycle for a Message
// Batch of 50,000 requests: the create (the body's requests read one at a
// time, each checked, planned, recorded; the queue takes every chunk at
// once) and the finalization once every chunk has a result (the 50,000
// results streamed into the results file), each timed and its heap peak
// above idle sampled (heaptest.Peak). The results are written as a subscriber
// writes them (16 requests a chunk, an Anthropic Message each) before the
// timer; the bucket is the emulator's, another process.
//
//	go test -run '^$' -bench MessageBatchLifecycle -benchtime 1x -timeout 20m ./publisher/batches
func BenchmarkMessageBatchLifecycle(b *testing.B) {
	const requests, perChunk = 50_000, 16
	c := sqstest.S3(b)
	store := payload.New(c, sqstest.Bucket(b, c))
	p := newStack(b, store, jobs.Config{ChunkItems: perChunk}, nopQueue{})
	h := p.Handler()
	var body bytes.Buffer
	body.WriteString(`{"requests":[`)
	for i := range requests {
		if i > 0 {
			body.WriteByte(',')
		}
		fmt.Fprintf(&body, `{"custom_id":"doc-%05d","params":{"model":"llama","max_tokens":64,"messages":[{"role":"user","content":"summarize document %d in a sentence or two"}]}}`, i, i)
	}
	body.WriteString(`]}`)
	var createS, finalS, createHeap, finalHeap float64
	for b.Loop() {
		b.StopTimer()
		req := httptest.NewRequest(http.MethodPost, "/v1/messages/batches", bytes.NewReader(body.Bytes()))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		w := httptest.NewRecorder()
		b.StartTimer()
		createS, createHeap = heaptest.Timed(func() { h.ServeHTTP(w, req) })
		b.StopTimer()
		var mb messageBatch
		if err := json.Unmarshal(w.Body.Bytes(), &mb); err != nil || mb.ProcessingStatus != msgInProgress {
			b.Fatalf("create: %d %s", w.Code, w.Body)
		}
		putResults(b, store, mb.ID, requests, perChunk, "llama", func(i int) string {
			return fmt.Sprintf(`{"id":"doc-%05d","response":{"status_code":200,"body":{"id":"msg_%05d","type":"message","role":"assistant",`+
				`"model":"llama","content":[{"type":"text","text":"Document %d says what its title says, at some length, in plain words."}],`+
				`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":18,"output_tokens":16}}}}`, i, i, i)
		})
		b.StartTimer()
		finalS, finalHeap = heaptest.Timed(func() {
			if err := p.Sweep(b.Context()); err != nil {
				b.Error(err)
			}
		})
		b.StopTimer()
		req = httptest.NewRequest(http.MethodGet, "/v1/messages/batches/"+mb.ID, nil)
		req.Header.Set("anthropic-version", "2023-06-01")
		w = httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if err := json.Unmarshal(w.Body.Bytes(), &mb); err != nil || mb.ProcessingStatus != msgEnded || mb.RequestCounts.Succeeded != requests {
			b.Fatalf("finalize: %d %s", w.Code, w.Body)
		}
		b.StartTimer()
	}
	b.ReportMetric(createS, "create-s")
	b.ReportMetric(finalS, "finalize-s")
	b.ReportMetric(createHeap, "create-heap-MiB")
	b.ReportMetric(finalHeap, "finalize-heap-MiB")
	b.ReportMetric(float64(body.Len())/(1<<20), "body-MiB")
}

// putResults writes the results of job jobID's n items, perChunk a chunk,
// as a subscriber writes them, 16 chunks at once: output(i) is item i's
// output object.
func putResults(b *testing.B, store *payload.Store, jobID string, n, perChunk int, model string, output func(i int) string) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for ch := range (n + perChunk - 1) / perChunk {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var r strings.Builder
			fmt.Fprintf(&r, `{"v":1,"job_id":"%s","chunk":%d,"model":"%s","outputs":[`, jobID, ch, model)
			for i := ch * perChunk; i < min(n, (ch+1)*perChunk); i++ {
				if i > ch*perChunk {
					r.WriteByte(',')
				}
				r.WriteString(output(i))
			}
			r.WriteString(`],"attempt":1,"worker_ms":3}`)
			if _, err := store.Put(b.Context(), job.ResultKey(jobID, ch), []byte(r.String())); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
}
