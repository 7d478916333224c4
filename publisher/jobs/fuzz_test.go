package jobs

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// FuzzDecodeJobRequest feeds arbitrary bodies to the request decoder and,
// for those it accepts, to the chunk planner. The seed corpus is in
// testdata/fuzz/FuzzDecodeJobRequest; go test runs it. Invariants:
//   - a refusal is a 400 or 422 with a code and a message;
//   - an accepted request obeys every rule the decoder documents;
//   - its chunks (or a 413 for an item too large) are valid work messages
//     that carry every item, in order, unchanged (a body as the same JSON
//     value: it travels compacted, and escaped for SQS).
func FuzzDecodeJobRequest(f *testing.F) {
	f.Add([]byte(`{"items":[{"id":"a","text":"hello"}]}`))
	f.Add([]byte(`{"endpoint":"/v1/chat/completions","items":[{"id":"a","body":{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2}}]}`))
	f.Add([]byte(`{"endpoint":"/v1/embeddings","items":[{"id":"a","body":{"model":"m","input":[[1,2],[3]]}}]}`))
	lim := RequestLimits{MaxItems: 20, MaxChunkItems: 4, MaxN: 3, MaxOutputTokens: 100}
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
			text := it.Text != "" || len(it.Data) > 0
			if it.ID == "" || len(it.ID) > MaxItemIDBytes || seen[it.ID] {
				t.Fatalf("accepted item %+v", it)
			}
			if req.Endpoint == "" && (!text || it.Body != nil) {
				t.Fatalf("accepted item %+v in a job without an endpoint", it)
			}
			if req.Endpoint != "" && (text || !json.Valid(it.Body) || bytes.TrimSpace(it.Body)[0] != '{') {
				t.Fatalf("accepted item %+v in a job for %s", it, req.Endpoint)
			}
			seen[it.ID] = true
		}
		if req.Endpoint != "" && !job.ValidEndpoint(req.Endpoint) {
			t.Fatalf("accepted endpoint %q", req.Endpoint)
		}
		// What was accepted survives a round trip through its own encoding.
		again, e := DecodeJobRequest(api.EncodeJSON(req), lim)
		if e != nil {
			t.Fatalf("re-encoded request refused: %v", e)
		}
		if !bytes.Equal(api.EncodeJSON(again), api.EncodeJSON(req)) {
			t.Fatalf("round trip changed the request")
		}

		jobID := newJobID()
		p, e := pl.PlanFor(jobID, req.Endpoint, req.Items, req.chunkItems(3))
		if e != nil {
			if e.Status != http.StatusRequestEntityTooLarge || e.Code != api.CodeItemTooLarge {
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
			if w.Endpoint != req.Endpoint {
				t.Fatalf("chunk %d is for endpoint %q, the job for %q", c.Index, w.Endpoint, req.Endpoint)
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
			if !bytes.Equal(a, b) || !sameJSON(it.Body, want.Body) {
				t.Fatalf("item %d changed: %s %s, want %s %s", i, a, it.Body, b, want.Body)
			}
		}
	})
}

// sameJSON reports whether a and b are both absent or hold the same JSON value.
func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}
