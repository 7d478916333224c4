package job

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Issue 27, item 1: a work message may name an OpenAI-compatible endpoint,
// and then each item carries that request's body. The rule, one for the
// publisher and the subscriber: a known endpoint, and items of a job with
// one carry a JSON object (or a reference to it), never text or data; items
// of a job without one never carry a body.
func TestDecodeWorkEndpoint(t *testing.T) {
	good := `{"v":1,"job_id":"j1","chunk":0,"endpoint":"/v1/chat/completions","items":[` +
		`{"id":"a","body":{"model":"m","messages":[{"role":"user","content":"hi"}]}},` +
		`{"id":"b","ref":{"bucket":"b","key":"k","size":1,"sha256":"` + zeroSHA + `"}}]}`
	w, err := DecodeWork([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if w.Endpoint != EndpointChatCompletions || string(w.Items[0].Body) != `{"model":"m","messages":[{"role":"user","content":"hi"}]}` {
		t.Errorf("decoded endpoint %q, body %s", w.Endpoint, w.Items[0].Body)
	}
	for _, e := range []string{EndpointChatCompletions, EndpointCompletions, EndpointEmbeddings} {
		body := `{"v":1,"job_id":"j","chunk":0,"endpoint":"` + e + `","items":[{"id":"a","body":{}}]}`
		if _, err := DecodeWork([]byte(body)); err != nil {
			t.Errorf("endpoint %s: %v", e, err)
		}
	}

	for _, tc := range []struct {
		name, body string
		want       error
	}{
		{"unknown endpoint", `{"v":1,"job_id":"j","chunk":0,"endpoint":"/v1/images/generations","items":[{"id":"a","body":{}}]}`, ErrUnknownEndpoint},
		{"endpoint without slash", `{"v":1,"job_id":"j","chunk":0,"endpoint":"v1/embeddings","items":[{"id":"a","body":{}}]}`, ErrUnknownEndpoint},
		{"body without endpoint", `{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a","body":{"model":"m"}}]}`, ErrBodyWithoutEndpoint},
		{"body and text without endpoint", `{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a","text":"t","body":{}}]}`, ErrBodyWithoutEndpoint},
		{"text with endpoint", `{"v":1,"job_id":"j","chunk":0,"endpoint":"/v1/embeddings","items":[{"id":"a","text":"t"}]}`, ErrInlineWithEndpoint},
		{"data with endpoint", `{"v":1,"job_id":"j","chunk":0,"endpoint":"/v1/embeddings","items":[{"id":"a","body":{},"data":"AA=="}]}`, ErrInlineWithEndpoint},
		{"no body", `{"v":1,"job_id":"j","chunk":0,"endpoint":"/v1/embeddings","items":[{"id":"a"}]}`, ErrNoBody},
		{"null body", `{"v":1,"job_id":"j","chunk":0,"endpoint":"/v1/embeddings","items":[{"id":"a","body":null}]}`, ErrBodyNotObject},
		{"array body", `{"v":1,"job_id":"j","chunk":0,"endpoint":"/v1/embeddings","items":[{"id":"a","body":[1]}]}`, ErrBodyNotObject},
		{"string body", `{"v":1,"job_id":"j","chunk":0,"endpoint":"/v1/embeddings","items":[{"id":"a","body":"{}"}]}`, ErrBodyNotObject},
		{"body and ref", `{"v":1,"job_id":"j","chunk":0,"endpoint":"/v1/embeddings","items":[{"id":"a","body":{},` +
			`"ref":{"bucket":"b","key":"k","size":1,"sha256":"` + zeroSHA + `"}}]}`, ErrMixedItem},
	} {
		_, err := DecodeWork([]byte(tc.body))
		if !errors.Is(err, tc.want) || !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeWork = %v; want %v wrapped with ErrMalformed", tc.name, err, tc.want)
		}
		// The reason never quotes the endpoint: the sender chose it.
		if err != nil && strings.Contains(err.Error(), "images") {
			t.Errorf("%s: the reason quotes the endpoint: %v", tc.name, err)
		}
	}
}

// CheckFor is the rule for one item, as the subscriber applies it to an item
// fetched from S3; Check is CheckFor without an endpoint.
func TestItemCheckFor(t *testing.T) {
	ref := &PayloadRef{Bucket: "b", Key: "k", Size: 1, SHA256: zeroSHA}
	obj := json.RawMessage(`{"input":"x"}`)
	for _, tc := range []struct {
		it       Item
		endpoint string
		want     error
	}{
		{Item{ID: "a", Body: obj}, EndpointEmbeddings, nil},
		{Item{ID: "a", Body: json.RawMessage(" \n{}")}, EndpointEmbeddings, nil},
		{Item{ID: "a", Ref: ref}, EndpointEmbeddings, nil},
		{Item{ID: "a", Body: obj}, "", ErrBodyWithoutEndpoint},
		{Item{ID: "a", Body: obj}, "/v1/other", ErrUnknownEndpoint},
		{Item{ID: "a", Text: "t"}, EndpointEmbeddings, ErrInlineWithEndpoint},
		{Item{ID: "a"}, EndpointCompletions, ErrNoBody},
		{Item{ID: "a", Body: json.RawMessage(`{"a":`)}, EndpointCompletions, ErrBodyNotObject},
		{Item{ID: "a", Body: json.RawMessage(`{} {}`)}, EndpointCompletions, ErrBodyNotObject},
		{Item{ID: "a", Body: json.RawMessage(`7`)}, EndpointCompletions, ErrBodyNotObject},
		{Item{ID: "", Body: obj}, EndpointCompletions, ErrEmptyID},
	} {
		err := tc.it.CheckFor(tc.endpoint)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) || (err != nil && !errors.Is(err, ErrMalformed)) {
			t.Errorf("%+v.CheckFor(%q) = %v; want %v wrapped with ErrMalformed", tc.it, tc.endpoint, err, tc.want)
		}
	}
	if err := (&Item{ID: "a", Body: obj}).Check(); !errors.Is(err, ErrBodyWithoutEndpoint) {
		t.Errorf("Check of a body item = %v; want %v", err, ErrBodyWithoutEndpoint)
	}
}

// The fields issue 27 adds are part of the schema: their names must not
// drift, and a body is carried as it is.
func TestEndpointSchema(t *testing.T) {
	w := Work{V: Version, JobID: "j", Chunk: 0, Chunks: 1, Endpoint: EndpointEmbeddings,
		Items: []Item{{ID: "a", Body: json.RawMessage(`{"model":"m","input":["x"]}`)}}}
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	const wantWork = `{"v":1,"job_id":"j","chunk":0,"chunks":1,"endpoint":"/v1/embeddings","items":[{"id":"a","body":{"model":"m","input":["x"]}}]}`
	if string(b) != wantWork {
		t.Errorf("work JSON\n got %s\nwant %s", b, wantWork)
	}
	r := Result{V: Version, JobID: "j", Model: "m", ItemsFailed: 1, Outputs: []Output{
		{ID: "a", Response: &Response{StatusCode: 200, Body: json.RawMessage(`{"object":"list"}`)}},
		{ID: "b", Error: NewItemError(ItemRequestRefused, "400: context length exceeded"),
			Response: &Response{StatusCode: 400, Body: json.RawMessage(`{"error":{"message":"too long"}}`)}},
	}}
	b, err = json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	const wantResult = `{"v":1,"job_id":"j","chunk":0,"model":"m","outputs":[` +
		`{"id":"a","response":{"status_code":200,"body":{"object":"list"}}},` +
		`{"id":"b","error":{"code":"request_refused","message":"400: context length exceeded"},` +
		`"response":{"status_code":400,"body":{"error":{"message":"too long"}}}}],"items_failed":1,"attempt":0,"worker_ms":0}`
	if string(b) != wantResult {
		t.Errorf("result JSON\n got %s\nwant %s", b, wantResult)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(r, back); d != "" {
		t.Errorf("result round trip (-want +got):\n%s", d)
	}
}
