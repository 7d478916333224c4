package publisher

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/vramq/vramq/job"
)

// FuzzDecodeJobRequest feeds arbitrary bodies to the request decoder and,
// for those it accepts, to the chunk planner. The seed corpus is in
// testdata/fuzz/FuzzDecodeJobRequest; go test runs it. Invariants:
//   - a refusal is a 400 or 422 with a code and a message;
//   - an accepted request obeys every rule the decoder documents;
//   - its chunks (or a 413 for an item too large) are valid work messages
//     that carry every item, in order, unchanged.
func FuzzDecodeJobRequest(f *testing.F) {
	f.Add([]byte(`{"items":[{"id":"a","text":"hello"}]}`))
	lim := RequestLimits{MaxItems: 20, MaxChunkItems: 4}
	pl := &Planner{MaxMessageBytes: 2048, MaxItemBytes: 600}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := DecodeJobRequest(body, lim)
		if e != nil {
			if (e.Status != http.StatusBadRequest && e.Status != http.StatusUnprocessableEntity) || e.Code == "" || e.Message == "" {
				t.Fatalf("refusal %+v", e)
			}
			return
		}
		if len(req.Items) == 0 || len(req.Items) > lim.MaxItems {
			t.Fatalf("accepted %d items", len(req.Items))
		}
		seen := map[string]bool{}
		for _, it := range req.Items {
			if it.ID == "" || len(it.ID) > MaxItemIDBytes || seen[it.ID] || (it.Text == "" && len(it.Data) == 0) {
				t.Fatalf("accepted item %+v", it)
			}
			seen[it.ID] = true
		}
		// What was accepted survives a round trip through its own encoding.
		again, e := DecodeJobRequest(encodeJSON(req), lim)
		if e != nil {
			t.Fatalf("re-encoded request refused: %v", e)
		}
		if !bytes.Equal(encodeJSON(again), encodeJSON(req)) {
			t.Fatalf("round trip changed the request")
		}

		jobID := newJobID()
		p, e := pl.Plan(jobID, req.Items, req.chunkItems(3))
		if e != nil {
			if e.Status != http.StatusRequestEntityTooLarge || e.Code != CodeItemTooLarge {
				t.Fatalf("plan refused with %+v", e)
			}
			return
		}
		var got []job.Item
		for _, c := range p.Chunks {
			for _, r := range c.Body {
				if r >= 0xFFFE {
					t.Fatalf("chunk %d carries %U, which SQS may refuse", c.Index, r)
				}
			}
			if n := job.MessageSize(c.Body, attributes(jobID, c.Index, longestTenant)); n > pl.MaxMessageBytes {
				t.Fatalf("chunk %d is %d bytes with its attributes", c.Index, n)
			}
			w, err := job.DecodeWork([]byte(c.Body))
			if err != nil {
				t.Fatalf("chunk %d: %v\n%s", c.Index, err, c.Body)
			}
			got = append(got, w.Items...)
		}
		if len(got) != len(req.Items) {
			t.Fatalf("%d items in chunks, %d in the request", len(got), len(req.Items))
		}
		for i, it := range got {
			want := req.Items[i]
			a, _ := json.Marshal(job.Item{ID: it.ID, Text: it.Text, Data: it.Data})
			b, _ := json.Marshal(job.Item{ID: want.ID, Text: want.Text, Data: want.Data})
			if !bytes.Equal(a, b) {
				t.Fatalf("item %d changed: %s, want %s", i, a, b)
			}
		}
	})
}
