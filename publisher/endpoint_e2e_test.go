package publisher_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
)

// endpointBody is a job of requests for endpoint, one item per body, with
// ids r000, r001, ...
func endpointBody(t *testing.T, endpoint string, bodies []string, chunkItems int) []byte {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, `{"endpoint":%q,"items":[`, endpoint)
	for i, body := range bodies {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"r%03d","body":%s}`, i, body)
	}
	fmt.Fprintf(&b, `],"options":{"chunk_items":%d}}`, chunkItems)
	if !json.Valid([]byte(b.String())) {
		t.Fatalf("test job is not JSON: %.200s", b.String())
	}
	return []byte(b.String())
}

// compact is body as the work message carries it.
func compact(t *testing.T, body string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(body)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// Issue 27, item 1, end to end on the emulator: a job of chat completion
// requests and one of embedding requests reach the queue as work messages
// that name the endpoint, in chunks, every item's body as the client sent
// it: byte for byte where it was compact, compacted where it was not, and
// nothing else changed (not "<", "&", nor a character of another script).
func TestEndpointJobsEnqueued(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{Models: []string{"llama-3.1-8b", "bge-m3"}, MaxN: 4, MaxOutputTokens: 512}})

	for _, tc := range []struct {
		endpoint string
		bodies   []string
	}{
		{job.EndpointChatCompletions, func() []string {
			var out []string
			for i := range 25 {
				out = append(out, fmt.Sprintf(`{"model":"llama-3.1-8b","messages":[{"role":"system","content":"Answer in one word."},`+
					`{"role":"user","content":"Is %d < %d & why? \u00e9\u4e2d"}],"max_tokens":%d,"temperature":0.2,"n":%d}`, i, i+1, 16+i, 1+i%4))
			}
			// As Python's json.dumps writes it: with spaces, and a field
			// the publisher does not know, which it passes on.
			out = append(out, "{\"model\": \"llama-3.1-8b\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],\n"+
				"  \"response_format\": {\"type\": \"json_object\"}, \"max_completion_tokens\": 512, \"stream\": false}")
			return out
		}()},
		{job.EndpointEmbeddings, []string{
			`{"model":"bge-m3","input":"The quick brown fox"}`,
			`{"model":"bge-m3","input":["one","two","three"],"encoding_format":"float"}`,
			`{"model":"bge-m3","input":[101,2023,102]}`,
			`{"model":"bge-m3","input":[[101,2023,102],[101,102]],"dimensions":256}`,
		}},
	} {
		t.Run(strings.TrimPrefix(tc.endpoint, "/v1/"), func(t *testing.T) {
			a := s.mustPost(endpointBody(t, tc.endpoint, tc.bodies, 10), nil)
			if a.Items != len(tc.bodies) || a.ClaimChecked != 0 || a.Chunks != (len(tc.bodies)+9)/10 {
				t.Errorf("accepted %+v", a)
			}
			works := checkWhole(t, a, e.drain(a.Chunks))
			var got []job.Item
			for _, w := range works {
				if w == nil {
					t.FailNow()
				}
				if w.Endpoint != tc.endpoint {
					t.Errorf("chunk %d names endpoint %q, want %q", w.Chunk, w.Endpoint, tc.endpoint)
				}
				got = append(got, w.Items...)
			}
			for i, it := range got {
				if want := fmt.Sprintf("r%03d", i); it.ID != want || it.Text != "" || it.Data != nil || it.Ref != nil {
					t.Fatalf("item %d is %+v, want %s with a body only", i, it, want)
				}
				if want := compact(t, tc.bodies[i]); string(it.Body) != want {
					t.Errorf("item %s's body on the queue\n got %s\nwant %s", it.ID, it.Body, want)
				}
			}
		})
	}
}

// A request body too large for a message goes through S3 as a large text
// does: the message carries a reference, and the object holds the item with
// its body as sent, which the reference verifies.
func TestEndpointBodyClaimChecked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{MaxMessageBytes: 8 << 10, MaxItemBytes: 4 << 10}})
	long := strings.Repeat("Summarise this sentence, which goes on. ", 400) // 16 KB
	bodies := []string{
		`{"model":"llama","messages":[{"role":"user","content":"short"}]}`,
		`{"model":"llama","messages":[{"role":"user","content":"` + long + `"}],"max_tokens":256}`,
		`{"model":"llama","messages":[{"role":"user","content":"also short"}]}`,
	}
	a := s.mustPost(endpointBody(t, job.EndpointChatCompletions, bodies, 10), nil)
	if a.ClaimChecked != 1 || a.Items != 3 {
		t.Fatalf("accepted %+v; want one item claim-checked", a)
	}
	works := checkWhole(t, a, e.drain(a.Chunks))
	var got []job.Item
	for _, w := range works {
		if w == nil {
			t.FailNow()
		}
		got = append(got, w.Items...)
	}
	big := got[1]
	if big.ID != "r001" || big.Ref == nil || big.Body != nil || big.Ref.Key != job.ItemKey(a.JobID, "r001") {
		t.Fatalf("large item on the queue: %+v", big)
	}
	b, err := e.store.Get(t.Context(), *big.Ref) // verifies size and SHA-256
	if err != nil {
		t.Fatal(err)
	}
	var stored job.Item
	if err := json.Unmarshal(b, &stored); err != nil || stored.ID != "r001" || string(stored.Body) != bodies[1] || stored.Ref != nil {
		t.Errorf("claim-checked object holds %.120s (%v)", b, err)
	}
	// The subscriber's rule takes the object as the item of this job.
	if err := stored.CheckFor(job.EndpointChatCompletions); err != nil {
		t.Errorf("claim-checked item fails the rule: %v", err)
	}
	for _, i := range []int{0, 2} {
		if string(got[i].Body) != bodies[i] {
			t.Errorf("item %d: %s", i, got[i].Body)
		}
	}
}

// GET /v1/jobs/{id} answers an output's response as the subscriber stored
// it, streamed with the other outputs: the body's bytes untouched, "<" and
// "&" included, and an item the server refused with its error and response.
func TestEndpointResponsesServed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	bodies := []string{`{"model":"m","messages":[{"role":"user","content":"a"}]}`, `{"model":"m","messages":[{"role":"user","content":"b"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"c"}]}`}
	a := s.mustPost(endpointBody(t, job.EndpointChatCompletions, bodies, 2), nil)
	works := checkWhole(t, a, e.drain(a.Chunks))
	if len(works) != 2 {
		t.Fatalf("%d chunks", len(works))
	}
	ok := `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x < y && z > w \u2028 \u00e9"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}`
	refused := `{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`
	// Written by hand, as a subscriber that does not escape HTML writes it.
	stored := []string{
		`{"v":1,"job_id":"` + a.JobID + `","chunk":0,"model":"m","outputs":[` +
			`{"id":"r000","response":{"status_code":200,"body":` + ok + `}},` +
			`{"id":"r001","error":{"code":"request_refused","message":"400: This model's maximum context length is 8192 tokens"},` +
			`"response":{"status_code":400,"body":` + refused + `}}],"items_failed":1,"attempt":1,"worker_ms":5}`,
		`{"v":1,"job_id":"` + a.JobID + `","chunk":1,"model":"m","outputs":[{"id":"r002","response":{"status_code":200,"body":` + ok + `}}],"attempt":1,"worker_ms":5}`,
	}
	for c, r := range stored {
		if _, err := e.store.Put(t.Context(), job.ResultKey(a.JobID, c), []byte(r)); err != nil {
			t.Fatal(err)
		}
	}
	for _, page := range []string{"?page_size=1", "?page_size=1&page_token=1", ""} {
		r := s.do("GET", "/v1/jobs/"+a.JobID+page, nil, nil)
		if r.status != 200 {
			t.Fatalf("GET %s: %d %s", page, r.status, r.body)
		}
		if !bytes.Contains(r.body, []byte(`"response":{"status_code":200,"body":`+ok+`}`)) {
			t.Errorf("GET %s: the response body is not as stored:\n%s", page, r.body)
		}
	}
	st := s.status(t, a.JobID, "")
	if len(st.Results) != 2 || len(st.Results[0].Outputs) != 2 {
		t.Fatalf("results %+v", st.Results)
	}
	o := st.Results[0].Outputs[1]
	if o.Error == nil || o.Error.Code != job.ItemRequestRefused || o.Response == nil || o.Response.StatusCode != 400 || string(o.Response.Body) != refused {
		t.Errorf("refused item's output: %+v (error %+v, response %+v)", o, o.Error, o.Response)
	}
	if r := s.do("GET", "/v1/jobs/"+a.JobID, nil, nil); !bytes.Contains(r.body, []byte(refused)) {
		t.Errorf("the refused item's response body is not as stored:\n%s", r.body)
	}
}
