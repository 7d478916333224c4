package publisher_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/vramq/vramq/publisher"
)

// apiCase is one request and the answer the README documents for it.
type apiCase struct {
	name     string
	noBucket bool // sent to the publisher without a payload bucket and without auth
	method   string
	path     string
	header   map[string]string // Content-Type and Authorization default as below; "" removes
	body     string
	status   int
	code     string
	item     string // the error's item, when it names one
}

const testKey = "test-key-2"

// Limits of the publisher under test, small enough for the table.
var badCfg = publisher.Config{APIKeys: []string{"test-key-1", testKey}, MaxMessageBytes: 16 << 10, MaxBodyBytes: 64 << 10, MaxItems: 50, MaxChunkItems: 100}

// badRequests is the table: every case gets its status and error code and
// enqueues nothing. seedJob is a job that exists; reusedKey an
// Idempotency-Key already used for another body.
func badRequests(seedJob, reusedKey string) []apiCase {
	one := `{"items":[{"id":"a","text":"x"}]}`
	many := make([]string, 51)
	for i := range many {
		many[i] = `{"id":"i` + strings.Repeat("x", i) + `","text":"x"}`
	}
	return []apiCase{
		{name: "wrong content type", header: map[string]string{"Content-Type": "text/plain"}, body: one, status: 415, code: publisher.CodeUnsupportedMedia},
		{name: "no content type", header: map[string]string{"Content-Type": ""}, body: one, status: 415, code: publisher.CodeUnsupportedMedia},
		{name: "form content type", header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, body: one, status: 415, code: publisher.CodeUnsupportedMedia},
		{name: "latin-1 charset", header: map[string]string{"Content-Type": "application/json; charset=iso-8859-1"}, body: one, status: 415, code: publisher.CodeUnsupportedMedia},
		{name: "empty body", body: "", status: 400, code: publisher.CodeMalformedJSON},
		{name: "malformed JSON", body: `{"items":[{"id":"a","text":"x"}`, status: 400, code: publisher.CodeMalformedJSON},
		{name: "not an object", body: `["a"]`, status: 400, code: publisher.CodeMalformedJSON},
		{name: "unknown field", body: `{"items":[{"id":"a","text":"x"}],"priority":"high"}`, status: 400, code: publisher.CodeUnknownField},
		{name: "client-side ref", body: `{"items":[{"id":"a","ref":{"bucket":"b","key":"k"}}]}`, status: 400, code: publisher.CodeUnknownField},
		{name: "trailing garbage", body: one + `garbage`, status: 400, code: publisher.CodeMalformedJSON},
		{name: "two objects", body: one + one, status: 400, code: publisher.CodeMalformedJSON},
		{name: "bad base64", body: `{"items":[{"id":"a","data":"not base64!"}]}`, status: 400, code: publisher.CodeMalformedJSON},
		{name: "text not a string", body: `{"items":[{"id":"a","text":42}]}`, status: 400, code: publisher.CodeMalformedJSON},
		{name: "null", body: `null`, status: 422, code: publisher.CodeNoItems},
		{name: "empty items", body: `{"items":[]}`, status: 422, code: publisher.CodeNoItems},
		{name: "missing id", body: `{"items":[{"text":"x"}]}`, status: 422, code: publisher.CodeMissingItemID},
		{name: "empty id", body: `{"items":[{"id":"a","text":"x"},{"id":"","text":"y"}]}`, status: 422, code: publisher.CodeMissingItemID},
		{name: "id too long", body: `{"items":[{"id":"` + strings.Repeat("i", 257) + `","text":"x"}]}`, status: 422, code: publisher.CodeItemIDTooLong},
		{name: "duplicate ids", body: `{"items":[{"id":"a","text":"x"},{"id":"b","text":"y"},{"id":"a","text":"z"}]}`, status: 422, code: publisher.CodeDuplicateItemID, item: "a"},
		{name: "no content", body: `{"items":[{"id":"a","text":"x"},{"id":"b"}]}`, status: 422, code: publisher.CodeEmptyItem, item: "b"},
		{name: "too many items", body: `{"items":[` + strings.Join(many, ",") + `]}`, status: 422, code: publisher.CodeTooManyItems},
		{name: "chunk_items negative", body: `{"items":[{"id":"a","text":"x"}],"options":{"chunk_items":-3}}`, status: 422, code: publisher.CodeInvalidOptions},
		{name: "chunk_items over cap", body: `{"items":[{"id":"a","text":"x"}],"options":{"chunk_items":101}}`, status: 422, code: publisher.CodeInvalidOptions},
		{name: "unknown option", body: `{"items":[{"id":"a","text":"x"}],"options":{"priority":1}}`, status: 400, code: publisher.CodeUnknownField},
		{name: "oversize body", body: `{"items":[{"id":"a","text":"` + strings.Repeat("x", 70<<10) + `"}]}`, status: 413, code: publisher.CodeBodyTooLarge},
		{name: "oversize item without bucket", noBucket: true, body: `{"items":[{"id":"a","text":"x"},{"id":"big","text":"` + strings.Repeat("x", 40<<10) + `"}]}`, status: 413, code: publisher.CodeItemTooLarge, item: "big"},
		{name: "wrong method on jobs", method: "PUT", body: one, status: 405, code: publisher.CodeMethodNotAllowed},
		{name: "wrong method on a job", method: "DELETE", path: "/v1/jobs/" + seedJob, status: 405, code: publisher.CodeMethodNotAllowed},
		{name: "missing auth", header: map[string]string{"Authorization": ""}, body: one, status: 401, code: publisher.CodeUnauthorized},
		{name: "wrong key", header: map[string]string{"Authorization": "Bearer test-key-3"}, body: one, status: 401, code: publisher.CodeUnauthorized},
		{name: "key prefix only", header: map[string]string{"Authorization": "Bearer test-key-"}, body: one, status: 401, code: publisher.CodeUnauthorized},
		{name: "basic auth", header: map[string]string{"Authorization": "Basic dGVzdDp0ZXN0"}, body: one, status: 401, code: publisher.CodeUnauthorized},
		{name: "auth on status", method: "GET", path: "/v1/jobs/" + seedJob, header: map[string]string{"Authorization": ""}, status: 401, code: publisher.CodeUnauthorized},
		{name: "bad idempotency key", header: map[string]string{"Idempotency-Key": "has spaces in it"}, body: one, status: 400, code: publisher.CodeInvalidIdempotency},
		{name: "reused idempotency key", header: map[string]string{"Idempotency-Key": reusedKey}, body: `{"items":[{"id":"other","text":"x"}]}`, status: 422, code: publisher.CodeIdempotencyReused},
		{name: "unknown job", method: "GET", path: "/v1/jobs/0123456789abcdef0123456789abcdef", status: 404, code: publisher.CodeNotFound},
		{name: "not a job id", method: "GET", path: "/v1/jobs/..%2Fjobs%2Fx", status: 404, code: publisher.CodeNotFound},
		{name: "bad page size", method: "GET", path: "/v1/jobs/" + seedJob + "?page_size=0", status: 400, code: publisher.CodeInvalidParameter},
		{name: "bad page token", method: "GET", path: "/v1/jobs/" + seedJob + "?page_token=zz", status: 400, code: publisher.CodeInvalidParameter},
		{name: "page token past the end", method: "GET", path: "/v1/jobs/" + seedJob + "?page_token=99", status: 400, code: publisher.CodeInvalidParameter},
		{name: "status without bucket", noBucket: true, method: "GET", path: "/v1/jobs/" + seedJob, status: 501, code: publisher.CodeStatusUnavailable},
		{name: "unknown path", method: "GET", path: "/v2/jobs", status: 404, code: publisher.CodeNotFound},
	}
}

// TestBadRequests sends every case of the table to publishers on real queues
// and checks the status, the JSON error, and that nothing but the seed job
// reached the queue.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	withBucket := e.serve(badCfg)
	noBucketCfg := badCfg
	noBucketCfg.APIKeys = nil
	noBucket := (&env{t: t, client: e.client, urls: e.urls, seen: e.seen}).serve(noBucketCfg) // same queue, no bucket

	auth := map[string]string{"Authorization": "Bearer " + testKey}
	seed := withBucket.mustPost([]byte(`{"items":[{"id":"seed","text":"x"}]}`), map[string]string{"Authorization": "Bearer " + testKey, "Idempotency-Key": "seed-key"})

	cases := badRequests(seed.JobID, "seed-key")
	if len(cases) < 20 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := withBucket
			h := map[string]string{"Content-Type": "application/json"}
			if tc.noBucket {
				s = noBucket
			} else {
				h["Authorization"] = auth["Authorization"]
			}
			for k, v := range tc.header {
				h[k] = v
			}
			method, path := tc.method, tc.path
			if method == "" {
				method = "POST"
			}
			if path == "" {
				path = "/v1/jobs"
			}
			r := s.do(method, path, h, []byte(tc.body))
			var got struct {
				Error *publisher.APIError `json:"error"`
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if err := json.Unmarshal(r.body, &got); err != nil || got.Error == nil {
				t.Fatalf("%d %q is not a JSON error: %v", r.status, r.body, err)
			}
			if r.status != tc.status || got.Error.Code != tc.code || got.Error.Item != tc.item {
				t.Errorf("got %d %s item %q (%s), want %d %s item %q", r.status, got.Error.Code, got.Error.Item, got.Error.Message, tc.status, tc.code, tc.item)
			}
			if got.Error.Message == "" {
				t.Error("no message")
			}
			switch tc.status {
			case http.StatusUnauthorized:
				if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("WWW-Authenticate %q", r.header.Get("WWW-Authenticate"))
				}
			case http.StatusMethodNotAllowed:
				if r.header.Get("Allow") == "" {
					t.Error("no Allow header")
				}
			}
		})
	}
	msgs := e.drain(1)
	if len(msgs) != 1 || msgs[0].work.JobID != seed.JobID {
		for _, m := range msgs {
			t.Errorf("on the queue: job %s chunk %d", m.work.JobID, m.work.Chunk)
		}
		t.Fatalf("%d messages on the queue, want only the seed job's", len(msgs))
	}
	if n := e.queued(); n != 1 {
		t.Errorf("queue counts %d messages, want 1", n)
	}
}
