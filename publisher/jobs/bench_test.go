package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
)

// benchItems returns n request items of words words each, texts of the
// default mixed workload's kind.
func benchItems(n, words int) []RequestItem {
	w := workload.Spec{JobID: "bench", Messages: 1, SmallItems: n, SmallWords: words, Seed: 1}.Works()[0]
	items := make([]RequestItem, len(w.Items))
	for i, it := range w.Items {
		items[i] = RequestItem{ID: it.ID, Text: it.Text}
	}
	return items
}

// benchSets are the item sets of BenchmarkPlan: 1,000 small items (24 words,
// as in the mixed workload's small messages) and 100 large ones (600 words).
var benchSets = []struct {
	name         string
	count, words int
}{{"small1000", 1000, 24}, {"large100", 100, 600}}

// BenchmarkPlan is the publisher's cutting of one job into work messages:
// encoding each item, sizing chunks by count and by exact encoded size, and
// writing each message body. chunk=32 is the default chunk_items (chunks cut
// by count); chunk=1000 is the most a request may ask for (chunks cut by the
// message size limit). BenchmarkMarshalItemsPlain is its baseline.
func BenchmarkPlan(b *testing.B) {
	const jobID = "0123456789abcdef0123456789abcdef"
	for _, set := range benchSets {
		items := benchItems(set.count, set.words)
		for _, c := range []struct {
			limit, chunk int
		}{{256 << 10, 32}, {256 << 10, 1000}, {1 << 20, 1000}} {
			b.Run(fmt.Sprintf("%s/limit=%dKiB/chunk=%d", set.name, c.limit>>10, c.chunk), func(b *testing.B) {
				b.ReportAllocs()
				pl := &Planner{MaxMessageBytes: c.limit, MaxItemBytes: maxInlineItem(c.limit)}
				p, aerr := pl.Plan(jobID, items, c.chunk)
				if aerr != nil {
					b.Fatal(aerr)
				}
				total := 0
				for _, ch := range p.Chunks {
					total += len(ch.Body)
				}
				b.SetBytes(int64(total))
				for b.Loop() {
					if _, aerr := pl.Plan(jobID, items, c.chunk); aerr != nil {
						b.Fatal(aerr)
					}
				}
				b.ReportMetric(float64(len(p.Chunks)), "chunks")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/item")
			})
		}
	}
}

// BenchmarkMarshalItemsPlain is the baseline of BenchmarkPlan: one
// json.Marshal of the same items as []job.Item, the encoding any publisher
// must do. SetBytes is its output's size.
func BenchmarkMarshalItemsPlain(b *testing.B) {
	for _, set := range benchSets {
		req := benchItems(set.count, set.words)
		items := make([]job.Item, len(req))
		for i, it := range req {
			items[i] = job.Item{ID: it.ID, Text: it.Text, Data: it.Data}
		}
		b.Run(set.name, func(b *testing.B) {
			b.ReportAllocs()
			body, err := json.Marshal(items)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := json.Marshal(items); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/item")
		})
	}
}

// BenchmarkPostJob is one POST /v1/jobs through the job routes behind the
// gate, as publisher.Handler serves them (middleware, reading and checking
// the body, planning, sending to a queue that takes everything at once, the
// answer), for the job of
// bench overhead's publisher comparison: 400 items of 4 words, 10 per
// message. BenchmarkPostJobBaseline is its floor: decoding the same body
// into []RequestItem and marshalling the 40 messages' items with
// encoding/json, what any publisher must do.
func BenchmarkPostJob(b *testing.B) {
	_, h := newTestService(b, Config{}, nil)
	body := postJobBody(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/jobs", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusAccepted {
			b.Fatalf("%d: %s", w.Code, w.Body)
		}
	}
}

func BenchmarkPostJobBaseline(b *testing.B) {
	body := postJobBody(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		var req struct {
			Items []RequestItem `json:"items"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < len(req.Items); i += 10 {
			if _, err := json.Marshal(req.Items[i : i+10]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// postJobBody is the request of BenchmarkPostJob and its baseline: 400
// items of 4 words, 10 per message.
func postJobBody(b *testing.B) []byte {
	body, err := json.Marshal(map[string]any{"items": benchItems(400, 4), "options": map[string]any{"chunk_items": 10}})
	if err != nil {
		b.Fatal(err)
	}
	return body
}
