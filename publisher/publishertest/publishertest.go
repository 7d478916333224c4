// Package publishertest holds the publisher's API contract as a table of
// requests and the answers docs/api.md documents for them. It exists so that
// the HTTP server (publisher's tests) and the Lambda function (cmd/publisher's
// tests, through the Runtime API) run one and the same contract: a case added
// here is checked on both transports, and neither can drift from the other.
//
// It also holds the end-to-end environment (Serve, RunSubscriber,
// LambdaDownloads, ...) that the package's tests share with the harness's
// SDK tests (harness/sdkclients), which cannot import _test files.
package publishertest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/api"
)

// The publisher the table assumes. The limits are small so that a request
// over each of them fits in a test (and in a Lambda event); the Lambda test
// passes them to the binary as its flags' variables, so they are plain values.
const (
	Key             = "test-key-2" // the key the cases send, when they send a valid one
	MaxMessageBytes = 16 << 10     // -max-message-bytes
	MaxBodyBytes    = 64 << 10     // -max-body-bytes
	MaxItems        = 50           // -max-items
	MaxChunkItems   = 100          // -max-chunk-items
	Model           = "test-model" // -models: the one model requests may name
	MaxN            = 4            // -max-n
	MaxOutputTokens = 256          // -max-output-tokens
)

// Canary marks request content in the cases that put some in a path, a
// query, a header or a field name: no error message may carry it back.
const Canary = "QZXCANARY"

// Keys are the API keys (-api-keys) of the publisher with a bucket. Two, so
// that a request with the other one's prefix proves keys are compared whole.
var Keys = []string{"test-key-1", Key}

// Config is the table's publisher as a Config, for publishers in process;
// the caller fills in Queue and Payloads. A NoBucket case goes to the same
// config without Payloads and without APIKeys.
func Config() publisher.Config {
	return publisher.Config{
		Jobs: publisher.Jobs{MaxMessageBytes: MaxMessageBytes, MaxItems: MaxItems, MaxChunkItems: MaxChunkItems, Models: []string{Model}, MaxN: MaxN, MaxOutputTokens: MaxOutputTokens},
		API: publisher.API{
			APIKeys:      append([]string(nil), Keys...),
			MaxBodyBytes: MaxBodyBytes,
		},
	}
}

// Case is one request and the answer docs/api.md documents for it.
type Case struct {
	Name     string
	NoBucket bool // sent to the publisher without a payload bucket and without auth
	Method   string
	Path     string
	Header   map[string]string // over the defaults of Request; "" removes one
	Body     string
	Status   int
	Code     string
	Item     string // the error's item, when it names one
}

// Request is the request of c as a client sends it: method (default POST),
// path (default /v1/jobs) and headers: Content-Type application/json and,
// unless NoBucket, Authorization with Key, then c.Header over them. A header
// c.Header sets to "" is left out, so each transport sends the map as is.
func (c Case) Request() (method, path string, header map[string]string) {
	method, path = c.Method, c.Path
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = "/v1/jobs"
	}
	header = map[string]string{"Content-Type": "application/json"}
	if !c.NoBucket {
		header["Authorization"] = "Bearer " + Key
	}
	for k, v := range c.Header {
		if v == "" {
			delete(header, k)
		} else {
			header[k] = v
		}
	}
	return method, path, header
}

// Cases is the table: every case gets its status and error code and
// enqueues nothing. seedJob is a job that exists; reusedKey an
// Idempotency-Key already used, with Key, for another body.
func Cases(seedJob, reusedKey string) []Case {
	one := `{"items":[{"id":"a","text":"x"}]}`
	many := make([]string, MaxItems+1)
	for i := range many {
		many[i] = `{"id":"i` + strings.Repeat("x", i) + `","text":"x"}`
	}
	// req is a job of one request for endpoint, with these fields.
	req := func(endpoint string, fields ...string) string {
		return `{"endpoint":"` + endpoint + `","items":[{"id":"r","body":{` + strings.Join(fields, ",") + `}}]}`
	}
	const (
		chat, embed = "/v1/chat/completions", "/v1/embeddings"
		model       = `"model":"` + Model + `"`
		msgs        = `"messages":[{"role":"user","content":"hi"}]`
	)
	ct := func(v string) map[string]string { return map[string]string{"Content-Type": v} }
	auth := func(v string) map[string]string { return map[string]string{"Authorization": v} }
	idem := func(v string) map[string]string { return map[string]string{"Idempotency-Key": v} }
	return []Case{
		{Name: "wrong content type", Header: ct("text/plain"), Body: one, Status: 415, Code: api.CodeUnsupportedMedia},
		{Name: "no content type", Header: ct(""), Body: one, Status: 415, Code: api.CodeUnsupportedMedia},
		{Name: "form content type", Header: ct("application/x-www-form-urlencoded"), Body: one,
			Status: 415, Code: api.CodeUnsupportedMedia},
		{Name: "latin-1 charset", Header: ct("application/json; charset=iso-8859-1"), Body: one,
			Status: 415, Code: api.CodeUnsupportedMedia},
		{Name: "empty body", Body: "", Status: 400, Code: api.CodeMalformedJSON},
		{Name: "malformed JSON", Body: `{"items":[{"id":"a","text":"x"}`, Status: 400, Code: api.CodeMalformedJSON},
		{Name: "not an object", Body: `["a"]`, Status: 400, Code: api.CodeMalformedJSON},
		{Name: "items not a list", Body: `{"items":"a"}`, Status: 400, Code: api.CodeMalformedJSON},
		{Name: "unknown field", Body: `{"items":[{"id":"a","text":"x"}],"priority":"high"}`, Status: 400, Code: api.CodeUnknownField},
		{Name: "client-side ref", Body: `{"items":[{"id":"a","ref":{"bucket":"b","key":"k"}}]}`, Status: 400, Code: api.CodeUnknownField},
		{Name: "trailing garbage", Body: one + `garbage`, Status: 400, Code: api.CodeMalformedJSON},
		{Name: "two objects", Body: one + one, Status: 400, Code: api.CodeMalformedJSON},
		{Name: "bad base64", Body: `{"items":[{"id":"a","data":"not base64!"}]}`, Status: 400, Code: api.CodeMalformedJSON},
		{Name: "text not a string", Body: `{"items":[{"id":"a","text":42}]}`, Status: 400, Code: api.CodeMalformedJSON},
		{Name: "null", Body: `null`, Status: 422, Code: api.CodeNoItems},
		{Name: "empty items", Body: `{"items":[]}`, Status: 422, Code: api.CodeNoItems},
		{Name: "missing id", Body: `{"items":[{"text":"x"}]}`, Status: 422, Code: api.CodeMissingItemID},
		{Name: "empty id", Body: `{"items":[{"id":"a","text":"x"},{"id":"","text":"y"}]}`, Status: 422, Code: api.CodeMissingItemID},
		{Name: "id too long", Body: `{"items":[{"id":"` + strings.Repeat("i", 257) + `","text":"x"}]}`,
			Status: 422, Code: api.CodeItemIDTooLong},
		{Name: "duplicate ids", Body: `{"items":[{"id":"a","text":"x"},{"id":"b","text":"y"},{"id":"a","text":"z"}]}`,
			Status: 422, Code: api.CodeDuplicateItemID, Item: "a"},
		{Name: "no content", Body: `{"items":[{"id":"a","text":"x"},{"id":"b"}]}`, Status: 422, Code: api.CodeEmptyItem, Item: "b"},
		{Name: "too many items", Body: `{"items":[` + strings.Join(many, ",") + `]}`, Status: 422, Code: api.CodeTooManyItems},
		{Name: "chunk_items negative", Body: `{"items":[{"id":"a","text":"x"}],"options":{"chunk_items":-3}}`,
			Status: 422, Code: api.CodeInvalidOptions},
		{Name: "chunk_items over cap", Body: `{"items":[{"id":"a","text":"x"}],"options":{"chunk_items":` + strconv.Itoa(MaxChunkItems+1) + `}}`,
			Status: 422, Code: api.CodeInvalidOptions},
		{Name: "unknown option", Body: `{"items":[{"id":"a","text":"x"}],"options":{"priority":1}}`,
			Status: 400, Code: api.CodeUnknownField},
		{Name: "oversize body", Body: `{"items":[{"id":"a","text":"` + strings.Repeat("x", MaxBodyBytes) + `"}]}`,
			Status: 413, Code: api.CodeBodyTooLarge},
		// Larger than a message, within the body limit: only a bucket could take it.
		{Name: "oversize item without bucket", NoBucket: true,
			Body:   `{"items":[{"id":"a","text":"x"},{"id":"big","text":"` + strings.Repeat("x", 2*MaxMessageBytes) + `"}]}`,
			Status: 413, Code: api.CodeItemTooLarge, Item: "big"},
		// Without auth the tenant header is the tenant: untrusted, checked
		// against SQS's MessageGroupId rule before the body is read.
		{Name: "tenant with a space", NoBucket: true, Header: map[string]string{api.TenantHeader: "a b"}, Body: one,
			Status: 400, Code: api.CodeInvalidTenant},
		{Name: "tenant too long", NoBucket: true, Header: map[string]string{api.TenantHeader: strings.Repeat("t", 129)}, Body: one,
			Status: 400, Code: api.CodeInvalidTenant},
		{Name: "wrong method on jobs", Method: "PUT", Body: one, Status: 405, Code: api.CodeMethodNotAllowed},
		{Name: "GET on jobs", Method: "GET", Status: 405, Code: api.CodeMethodNotAllowed},
		{Name: "wrong method on a job", Method: "PUT", Path: "/v1/jobs/" + seedJob, Status: 405, Code: api.CodeMethodNotAllowed},
		{Name: "POST on a job", Method: "POST", Path: "/v1/jobs/" + seedJob, Body: one, Status: 405, Code: api.CodeMethodNotAllowed},
		{Name: "missing auth", Header: auth(""), Body: one, Status: 401, Code: api.CodeUnauthorized},
		{Name: "wrong key", Header: auth("Bearer test-key-3"), Body: one, Status: 401, Code: api.CodeUnauthorized},
		{Name: "key prefix only", Header: auth("Bearer test-key-"), Body: one, Status: 401, Code: api.CodeUnauthorized},
		{Name: "key without scheme", Header: auth(Key), Body: one, Status: 401, Code: api.CodeUnauthorized},
		{Name: "basic auth", Header: auth("Basic dGVzdDp0ZXN0"), Body: one, Status: 401, Code: api.CodeUnauthorized},
		{Name: "auth on status", Method: "GET", Path: "/v1/jobs/" + seedJob, Header: auth(""), Status: 401, Code: api.CodeUnauthorized},
		{Name: "auth on cancel", Method: "DELETE", Path: "/v1/jobs/" + seedJob, Header: auth(""), Status: 401, Code: api.CodeUnauthorized},
		{Name: "wrong key on cancel", Method: "DELETE", Path: "/v1/jobs/" + seedJob, Header: auth("Bearer test-key-3"),
			Status: 401, Code: api.CodeUnauthorized},
		{Name: "bad idempotency key", Header: idem("has spaces in it"), Body: one, Status: 400, Code: api.CodeInvalidIdempotency},
		{Name: "idempotency key not ASCII", Header: idem("clé"), Body: one, Status: 400, Code: api.CodeInvalidIdempotency},
		{Name: "idempotency key too long", Header: idem(strings.Repeat("k", 256)), Body: one,
			Status: 400, Code: api.CodeInvalidIdempotency},
		{Name: "reused idempotency key", Header: idem(reusedKey), Body: `{"items":[{"id":"other","text":"x"}]}`,
			Status: 422, Code: api.CodeIdempotencyReused},
		{Name: "unknown job", Method: "GET", Path: "/v1/jobs/0123456789abcdef0123456789abcdef", Status: 404, Code: api.CodeNotFound},
		{Name: "not a job id", Method: "GET", Path: "/v1/jobs/..%2Fjobs%2Fx", Status: 404, Code: api.CodeNotFound},
		{Name: "bad page size", Method: "GET", Path: "/v1/jobs/" + seedJob + "?page_size=0", Status: 400, Code: api.CodeInvalidParameter},
		{Name: "bad page token", Method: "GET", Path: "/v1/jobs/" + seedJob + "?page_token=zz",
			Status: 400, Code: api.CodeInvalidParameter},
		{Name: "page token past the end", Method: "GET", Path: "/v1/jobs/" + seedJob + "?page_token=99",
			Status: 400, Code: api.CodeInvalidParameter},
		{Name: "cancel unknown job", Method: "DELETE", Path: "/v1/jobs/0123456789abcdef0123456789abcdef",
			Status: 404, Code: api.CodeNotFound},
		{Name: "cancel not a job id", Method: "DELETE", Path: "/v1/jobs/..%2Fjobs%2Fx", Status: 404, Code: api.CodeNotFound},
		{Name: "cancel without bucket", NoBucket: true, Method: "DELETE", Path: "/v1/jobs/" + seedJob,
			Status: 501, Code: api.CodeStatusUnavailable},
		{Name: "status without bucket", NoBucket: true, Method: "GET", Path: "/v1/jobs/" + seedJob,
			Status: 501, Code: api.CodeStatusUnavailable},
		{Name: "unknown path", Method: "GET", Path: "/v2/jobs", Status: 404, Code: api.CodeNotFound},
		{Name: "path not canonical", Method: "GET", Path: "/v1/jobs/../jobs/" + seedJob, Status: 404, Code: api.CodeNotFound},
		{Name: "echo: job id", Method: "GET", Path: "/v1/jobs/" + Canary, Status: 404, Code: api.CodeNotFound},
		{Name: "echo: path", Method: "GET", Path: "/" + Canary, Status: 404, Code: api.CodeNotFound},
		{Name: "echo: page size", Method: "GET", Path: "/v1/jobs/" + seedJob + "?page_size=" + Canary,
			Status: 400, Code: api.CodeInvalidParameter},
		{Name: "echo: content type", Header: ct("application/" + Canary), Body: one, Status: 415, Code: api.CodeUnsupportedMedia},
		{Name: "echo: field name", Body: `{"items":[{"id":"a","text":"x"}],"` + Canary + `":1}`, Status: 400, Code: api.CodeUnknownField},
		{Name: "echo: JSON syntax", Body: `{"items":` + Canary + `}`, Status: 400, Code: api.CodeMalformedJSON},
		{Name: "invalid UTF-8", Body: "{\"items\":[{\"id\":\"a\xff\",\"text\":\"x\"}]}", Status: 400, Code: api.CodeMalformedJSON},
		// Requests for a model server (issue 27, item 1).
		{Name: "unknown endpoint", Body: req("/v1/"+Canary, model, msgs), Status: 422, Code: api.CodeInvalidEndpoint},
		{Name: "body without endpoint", Body: `{"items":[{"id":"r","body":{` + model + `,` + msgs + `}}]}`,
			Status: 422, Code: api.CodeBodyWithoutEndpoint, Item: "r"},
		{Name: "text with endpoint", Body: `{"endpoint":"` + chat + `","items":[{"id":"r","text":"hi"}]}`,
			Status: 422, Code: api.CodeContentWithEndpoint, Item: "r"},
		{Name: "no body", Body: `{"endpoint":"` + chat + `","items":[{"id":"r"}]}`, Status: 422, Code: api.CodeMissingBody, Item: "r"},
		{Name: "body not an object", Body: `{"endpoint":"` + chat + `","items":[{"id":"r","body":["` + Canary + `"]}]}`,
			Status: 422, Code: api.CodeInvalidBody, Item: "r"},
		{Name: "body without model", Body: req(chat, msgs), Status: 422, Code: api.CodeInvalidBody, Item: "r"},
		{Name: "model not served", Body: req(chat, `"model":"`+Canary+`"`, msgs), Status: 422, Code: api.CodeModelNotAllowed, Item: "r"},
		{Name: "stream", Body: req(chat, model, msgs, `"stream":true`), Status: 422, Code: api.CodeStreamNotSupported, Item: "r"},
		{Name: "n over the limit", Body: req(chat, model, msgs, `"n":`+strconv.Itoa(MaxN+1)), Status: 422, Code: api.CodeInvalidN, Item: "r"},
		{Name: "max_tokens over the limit", Body: req(chat, model, msgs, `"max_tokens":`+strconv.Itoa(MaxOutputTokens+1)),
			Status: 422, Code: api.CodeInvalidMaxTokens, Item: "r"},
		{Name: "max_completion_tokens not a number", Body: req(chat, model, msgs, `"max_completion_tokens":"`+Canary+`"`),
			Status: 422, Code: api.CodeInvalidMaxTokens, Item: "r"},
		{Name: "chat without messages", Body: req(chat, model), Status: 422, Code: api.CodeInvalidBody, Item: "r"},
		{Name: "completions without prompt", Body: req("/v1/completions", model), Status: 422, Code: api.CodeInvalidBody, Item: "r"},
		{Name: "embeddings with empty input", Body: req(embed, model, `"input":[]`), Status: 422, Code: api.CodeInvalidBody, Item: "r"},
		{Name: "a key twice in a body", Body: req(chat, model, msgs, `"n":1`, `"n":99`), Status: 422, Code: api.CodeInvalidBody, Item: "r"},
		{Name: "request too large without bucket", NoBucket: true,
			Body:   req(embed, model, `"input":"`+strings.Repeat("x", 2*MaxMessageBytes)+`"`),
			Status: 413, Code: api.CodeItemTooLarge, Item: "r"},
	}
}

// Check checks an answer to c, whichever transport carried it: the status,
// a JSON error with c's code, item and a message, the JSON content type,
// and the header the status calls for (WWW-Authenticate on 401, Allow on 405).
func Check(t testing.TB, c Case, status int, header http.Header, body []byte) {
	t.Helper()
	var got struct {
		Error *api.Error `json:"error"`
	}
	if ct := header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if err := json.Unmarshal(body, &got); err != nil || got.Error == nil {
		t.Fatalf("%d %q is not a JSON error: %v", status, body, err)
	}
	if status != c.Status || got.Error.Code != c.Code || got.Error.Item != c.Item {
		t.Errorf("got %d %s item %q (%s), want %d %s item %q",
			status, got.Error.Code, got.Error.Item, got.Error.Message, c.Status, c.Code, c.Item)
	}
	if got.Error.Message == "" {
		t.Error("no message")
	}
	if m := strings.ToUpper(got.Error.Message); strings.Contains(m, Canary) || strings.Contains(m, "'Q'") {
		t.Errorf("the message quotes the request: %q", got.Error.Message)
	}
	if header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("X-Content-Type-Options %q", header.Get("X-Content-Type-Options"))
	}
	switch c.Status {
	case http.StatusUnauthorized:
		if !strings.HasPrefix(header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("WWW-Authenticate %q", header.Get("WWW-Authenticate"))
		}
	case http.StatusMethodNotAllowed:
		if header.Get("Allow") == "" {
			t.Error("no Allow header")
		}
	}
}
