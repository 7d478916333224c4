package jobs

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// endpointLimits are testLimits with the model-server bounds: two models,
// n up to 4, 1000 output tokens.
var endpointLimits = RequestLimits{MaxItems: 5, MaxChunkItems: 100, Models: []string{"llama", "bge"}, MaxN: 4, MaxOutputTokens: 1000}

// endpointJob is a job of one item with this endpoint and body.
func endpointJob(endpoint, body string) string {
	return `{"endpoint":"` + endpoint + `","items":[{"id":"x","body":` + body + `}]}`
}

// Issue 27, item 1: every refusal of a job of requests for a model server,
// with its status, code and the item it names.
func TestDecodeEndpointRequestRefusals(t *testing.T) {
	const (
		chat   = job.EndpointChatCompletions
		compl  = job.EndpointCompletions
		embed  = job.EndpointEmbeddings
		msgs   = `"messages":[{"role":"user","content":"hi"}]`
		model  = `"model":"llama"`
		prompt = `"prompt":"Once"`
		input  = `"input":"text"`
	)
	c := func(fields ...string) string { return "{" + strings.Join(fields, ",") + "}" }
	tooMany := make([]string, 2049)
	for i := range tooMany {
		tooMany[i] = `"t"`
	}
	for _, tc := range []struct {
		name   string
		body   string
		status int
		code   string
		item   string
	}{
		// The job and its items.
		{"unknown endpoint", endpointJob("/v1/images/generations", c(model)), 422, api.CodeInvalidEndpoint, ""},
		{"endpoint not a route", endpointJob("chat", c(model, msgs)), 422, api.CodeInvalidEndpoint, ""},
		{"endpoint not a string", `{"endpoint":1,"items":[{"id":"x","text":"t"}]}`, 400, api.CodeMalformedJSON, ""},
		{"text on a request item", `{"endpoint":"` + chat + `","items":[{"id":"x","text":"hi"}]}`, 422, api.CodeContentWithEndpoint, "x"},
		{"data on a request item", `{"endpoint":"` + chat + `","items":[{"id":"x","body":` + c(model, msgs) + `,"data":"AA=="}]}`, 422, api.CodeContentWithEndpoint, "x"},
		{"body without endpoint", `{"items":[{"id":"x","body":` + c(model, msgs) + `}]}`, 422, api.CodeBodyWithoutEndpoint, "x"},
		{"body and text without endpoint", `{"items":[{"id":"x","text":"t","body":{}}]}`, 422, api.CodeBodyWithoutEndpoint, "x"},
		{"no body", `{"endpoint":"` + chat + `","items":[{"id":"x"}]}`, 422, api.CodeMissingBody, "x"},
		{"null body", `{"endpoint":"` + chat + `","items":[{"id":"x","body":null}]}`, 422, api.CodeMissingBody, "x"},
		{"missing id", `{"endpoint":"` + chat + `","items":[{"body":` + c(model, msgs) + `}]}`, 422, api.CodeMissingItemID, ""},
		{"duplicate ids", `{"endpoint":"` + embed + `","items":[{"id":"x","body":` + c(model, input) + `},{"id":"x","body":` + c(model, input) + `}]}`,
			422, api.CodeDuplicateItemID, "x"},

		// The body as JSON.
		{"body an array", endpointJob(chat, `[`+c(model, msgs)+`]`), 422, api.CodeInvalidBody, "x"},
		{"body a string", endpointJob(chat, `"{}"`), 422, api.CodeInvalidBody, "x"},
		{"body a number", endpointJob(embed, `1`), 422, api.CodeInvalidBody, "x"},
		{"duplicate key", endpointJob(chat, c(model, msgs, `"max_tokens":10`, `"max_tokens":100000`)), 422, api.CodeInvalidBody, "x"},
		{"duplicate key, escaped", endpointJob(chat, c(model, msgs, `"stream":false`, `"str\u0065am":true`)), 422, api.CodeInvalidBody, "x"},

		// model.
		{"no model", endpointJob(chat, c(msgs)), 422, api.CodeInvalidBody, "x"},
		{"null model", endpointJob(chat, c(`"model":null`, msgs)), 422, api.CodeInvalidBody, "x"},
		{"empty model", endpointJob(chat, c(`"model":""`, msgs)), 422, api.CodeInvalidBody, "x"},
		{"model not a string", endpointJob(embed, c(`"model":7`, input)), 422, api.CodeInvalidBody, "x"},
		{"model not served", endpointJob(chat, c(`"model":"gpt-4o"`, msgs)), 422, api.CodeModelNotAllowed, "x"},
		{"model of another case", endpointJob(chat, c(`"model":"Llama"`, msgs)), 422, api.CodeModelNotAllowed, "x"},

		// stream: only absent, null or false. A lenient server (pydantic's
		// lax mode) reads "true" and 1 as true.
		{"stream", endpointJob(chat, c(model, msgs, `"stream":true`)), 422, api.CodeStreamNotSupported, "x"},
		{"stream on completions", endpointJob(compl, c(model, prompt, `"stream":true`)), 422, api.CodeStreamNotSupported, "x"},
		{"stream as a string", endpointJob(chat, c(model, msgs, `"stream":"true"`)), 422, api.CodeStreamNotSupported, "x"},
		{"stream as a number", endpointJob(chat, c(model, msgs, `"stream":1`)), 422, api.CodeStreamNotSupported, "x"},

		// n and best_of: whole numbers from 1 to MaxN.
		{"n zero", endpointJob(chat, c(model, msgs, `"n":0`)), 422, api.CodeInvalidN, "x"},
		{"n over", endpointJob(chat, c(model, msgs, `"n":5`)), 422, api.CodeInvalidN, "x"},
		{"n huge", endpointJob(chat, c(model, msgs, `"n":99999999999999999999999`)), 422, api.CodeInvalidN, "x"},
		{"n negative", endpointJob(compl, c(model, prompt, `"n":-1`)), 422, api.CodeInvalidN, "x"},
		{"n fraction", endpointJob(chat, c(model, msgs, `"n":1.5`)), 422, api.CodeInvalidN, "x"},
		{"n with exponent", endpointJob(chat, c(model, msgs, `"n":1e1`)), 422, api.CodeInvalidN, "x"},
		{"n as a string", endpointJob(chat, c(model, msgs, `"n":"2"`)), 422, api.CodeInvalidN, "x"},
		{"n over on completions", endpointJob(compl, c(model, prompt, `"n":5`)), 422, api.CodeInvalidN, "x"},
		{"best_of over", endpointJob(compl, c(model, prompt, `"best_of":5`)), 422, api.CodeInvalidN, "x"},

		// max_tokens and max_completion_tokens: whole numbers from 1 to MaxOutputTokens.
		{"max_tokens over", endpointJob(chat, c(model, msgs, `"max_tokens":1001`)), 422, api.CodeInvalidMaxTokens, "x"},
		{"max_tokens zero", endpointJob(chat, c(model, msgs, `"max_tokens":0`)), 422, api.CodeInvalidMaxTokens, "x"},
		{"max_tokens fraction", endpointJob(chat, c(model, msgs, `"max_tokens":10.5`)), 422, api.CodeInvalidMaxTokens, "x"},
		{"max_tokens as a string", endpointJob(chat, c(model, msgs, `"max_tokens":"10"`)), 422, api.CodeInvalidMaxTokens, "x"},
		{"max_completion_tokens over", endpointJob(chat, c(model, msgs, `"max_completion_tokens":1001`)), 422, api.CodeInvalidMaxTokens, "x"},
		{"max_completion_tokens negative", endpointJob(chat, c(model, msgs, `"max_completion_tokens":-5`)), 422, api.CodeInvalidMaxTokens, "x"},
		{"one of the two over", endpointJob(chat, c(model, msgs, `"max_tokens":10`, `"max_completion_tokens":2000`)), 422, api.CodeInvalidMaxTokens, "x"},
		{"completions max_tokens over", endpointJob(compl, c(model, prompt, `"max_tokens":1001`)), 422, api.CodeInvalidMaxTokens, "x"},

		// What each endpoint requires.
		{"chat without messages", endpointJob(chat, c(model)), 422, api.CodeInvalidBody, "x"},
		{"chat with empty messages", endpointJob(chat, c(model, `"messages":[]`)), 422, api.CodeInvalidBody, "x"},
		{"chat with null messages", endpointJob(chat, c(model, `"messages":null`)), 422, api.CodeInvalidBody, "x"},
		{"chat with messages an object", endpointJob(chat, c(model, `"messages":{"role":"user"}`)), 422, api.CodeInvalidBody, "x"},
		{"completions without prompt", endpointJob(compl, c(model)), 422, api.CodeInvalidBody, "x"},
		{"completions with null prompt", endpointJob(compl, c(model, `"prompt":null`)), 422, api.CodeInvalidBody, "x"},
		{"completions with empty prompt array", endpointJob(compl, c(model, `"prompt":[]`)), 422, api.CodeInvalidBody, "x"},
		{"completions with prompt an object", endpointJob(compl, c(model, `"prompt":{}`)), 422, api.CodeInvalidBody, "x"},
		{"completions with mixed prompt", endpointJob(compl, c(model, `"prompt":["a",1]`)), 422, api.CodeInvalidBody, "x"},
		{"embeddings without input", endpointJob(embed, c(model)), 422, api.CodeInvalidBody, "x"},
		{"embeddings with empty input", endpointJob(embed, c(model, `"input":""`)), 422, api.CodeInvalidBody, "x"},
		{"embeddings with empty input array", endpointJob(embed, c(model, `"input":[]`)), 422, api.CodeInvalidBody, "x"},
		{"embeddings with an empty string", endpointJob(embed, c(model, `"input":["a",""]`)), 422, api.CodeInvalidBody, "x"},
		{"embeddings with an empty token array", endpointJob(embed, c(model, `"input":[[1,2],[]]`)), 422, api.CodeInvalidBody, "x"},
		{"embeddings with a negative token", endpointJob(embed, c(model, `"input":[1,-2]`)), 422, api.CodeInvalidBody, "x"},
		{"embeddings with a fractional token", endpointJob(embed, c(model, `"input":[1,2.5]`)), 422, api.CodeInvalidBody, "x"},
		{"embeddings with mixed input", endpointJob(embed, c(model, `"input":["a",[1]]`)), 422, api.CodeInvalidBody, "x"},
		{"embeddings with input a number", endpointJob(embed, c(model, `"input":5`)), 422, api.CodeInvalidBody, "x"},
		{"embeddings over 2048 inputs", endpointJob(embed, c(model, `"input":[`+strings.Join(tooMany, ",")+`]`)), 422, api.CodeInvalidBody, "x"},

		// Issue 34, items 9 and 10: the one rule (job.CheckRequest) the
		// subscriber applies too. Keys that a case-insensitive reader (Go's
		// encoding/json: Ollama) takes for a bounded one; best_of below n
		// or on chat past MaxN; a remote URL a multimodal server fetches.
		{"MAX_TOKENS", endpointJob(chat, c(model, msgs, `"MAX_TOKENS":100000`)), 422, api.CodeInvalidBody, "x"},
		{"MODEL", endpointJob(chat, c(model, `"MODEL":"gpt-4o"`, msgs)), 422, api.CodeInvalidBody, "x"},
		{"N", endpointJob(compl, c(model, prompt, `"N":100000`)), 422, api.CodeInvalidBody, "x"},
		{"best_of below n", endpointJob(compl, c(model, prompt, `"n":3`, `"best_of":2`)), 422, api.CodeInvalidN, "x"},
		{"best_of on chat over", endpointJob(chat, c(model, msgs, `"best_of":100000`)), 422, api.CodeInvalidN, "x"},
		{"remote image_url", endpointJob(chat, c(model,
			`"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://images.internal/a.png"}}]}]`)), 422, api.CodeInvalidBody, "x"},

		// The second item is the one at fault.
		{"second item", `{"endpoint":"` + embed + `","items":[{"id":"a","body":` + c(model, input) + `},{"id":"b","body":` + c(model) + `}]}`,
			422, api.CodeInvalidBody, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, e := DecodeJobRequest([]byte(tc.body), endpointLimits)
			if e == nil {
				t.Fatalf("accepted %s", tc.body)
			}
			if e.Status != tc.status || e.Code != tc.code || e.Item != tc.item || e.Message == "" {
				t.Errorf("got %d %s item %q (%s), want %d %s item %q", e.Status, e.Code, e.Item, e.Message, tc.status, tc.code, tc.item)
			}
			// The message is fixed text: it names fields, never values.
			for _, v := range []string{"gpt-4o", "Llama", "images", "100000"} {
				if strings.Contains(e.Message, v) {
					t.Errorf("message %q quotes the request", e.Message)
				}
			}
		})
	}
}

// What OpenAI's API reference accepts, within the limits, is accepted, and
// the body is kept as sent (compacted at most).
func TestDecodeEndpointRequestValid(t *testing.T) {
	c := func(fields ...string) string { return "{" + strings.Join(fields, ",") + "}" }
	for _, tc := range []struct {
		name, endpoint, body string
	}{
		{"chat", job.EndpointChatCompletions, c(`"model":"llama"`, `"messages":[{"role":"user","content":"hi"}]`)},
		{"chat with every bound at its limit", job.EndpointChatCompletions, c(`"model":"llama"`, `"messages":[{"role":"user","content":"hi"}]`,
			`"n":4`, `"max_tokens":1000`, `"max_completion_tokens":1000`, `"stream":false`, `"temperature":0.2`, `"tools":[]`)},
		{"chat with nulls", job.EndpointChatCompletions, c(`"model":"llama"`, `"messages":[{"role":"user","content":"hi"}]`,
			`"n":null`, `"max_tokens":null`, `"max_completion_tokens":null`, `"stream":null`)},
		{"chat with white space", job.EndpointChatCompletions, "{ \"model\" : \"llama\",\n  \"messages\" : [ {\"role\":\"user\", \"content\":\"a < b & c\"} ] }"},
		{"completions", job.EndpointCompletions, c(`"model":"llama"`, `"prompt":"Once upon"`, `"max_tokens":16`, `"n":2`, `"best_of":3`)},
		{"completions with an empty prompt", job.EndpointCompletions, c(`"model":"llama"`, `"prompt":""`)},
		{"completions with prompts", job.EndpointCompletions, c(`"model":"llama"`, `"prompt":["a","b"]`)},
		{"completions with tokens", job.EndpointCompletions, c(`"model":"llama"`, `"prompt":[1,2,3]`)},
		{"completions with token arrays", job.EndpointCompletions, c(`"model":"llama"`, `"prompt":[[1,2],[3]]`)},
		{"embeddings", job.EndpointEmbeddings, c(`"model":"bge"`, `"input":"text"`)},
		{"embeddings of strings", job.EndpointEmbeddings, c(`"model":"bge"`, `"input":["a","b"]`, `"encoding_format":"float"`)},
		{"embeddings of tokens", job.EndpointEmbeddings, c(`"model":"bge"`, `"input":[0,1,2]`)},
		{"embeddings of token arrays", job.EndpointEmbeddings, c(`"model":"bge"`, `"input":[[1],[2,3]]`, `"dimensions":256`)},
		{"embeddings with max_tokens, which is not theirs", job.EndpointEmbeddings, c(`"model":"bge"`, `"input":"x"`, `"max_tokens":"any"`)},
		{"chat with a data: image", job.EndpointChatCompletions, c(`"model":"llama"`,
			`"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, e := DecodeJobRequest([]byte(endpointJob(tc.endpoint, tc.body)), endpointLimits)
			if e != nil {
				t.Fatal(e)
			}
			if req.Endpoint != tc.endpoint || len(req.Items) != 1 || string(req.Items[0].Body) != tc.body {
				t.Errorf("decoded %+v", req)
			}
		})
	}
	// With -allow-remote-urls, a remote image is taken.
	remote := endpointJob(job.EndpointChatCompletions,
		`{"model":"llama","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`)
	lim := endpointLimits
	lim.AllowRemoteURLs = true
	if _, e := DecodeJobRequest([]byte(remote), lim); e != nil {
		t.Errorf("a remote URL, allowed: %v", e)
	}
	// Without -models, any model is taken.
	lim = endpointLimits
	lim.Models = nil
	if _, e := DecodeJobRequest([]byte(endpointJob(job.EndpointEmbeddings, `{"model":"any/model:v2","input":"x"}`)), lim); e != nil {
		t.Errorf("without a model list: %v", e)
	}
	// "body": null on a text item is no body, as OpenAI reads a null as
	// the field left out.
	req, e := DecodeJobRequest([]byte(`{"items":[{"id":"a","text":"t","body":null}],"endpoint":null}`), endpointLimits)
	if e != nil {
		t.Fatal(e)
	}
	if d := cmp.Diff(&JobRequest{Items: []RequestItem{{ID: "a", Text: "t"}}}, req); d != "" {
		t.Errorf("decoded (-want +got):\n%s", d)
	}
}

// Bodies travel in the work message as sent, compacted at most, and a body
// too large for a message goes through S3 like a large text.
func TestPlanEndpointItems(t *testing.T) {
	const max = 8 << 10
	pl := &Planner{MaxMessageBytes: max, MaxItemBytes: maxInlineItem(max), Bucket: "payloads"}
	big := `{"model":"bge","input":"` + strings.Repeat("w ", max) + `"}`
	items := []RequestItem{
		{ID: "a", Body: json.RawMessage("{ \"model\": \"llama\",\n \"messages\": [{\"role\": \"user\", \"content\": \"a < b & \U0001F600\"}] }")},
		{ID: "big", Body: json.RawMessage(big)},
	}
	for i := range 40 {
		items = append(items, RequestItem{ID: "i" + strconv.Itoa(i), Body: json.RawMessage(`{"model":"llama","messages":[{"role":"user","content":"` + strings.Repeat("x", 400) + `"}]}`)})
	}
	p, e := pl.PlanFor("0123456789abcdef0123456789abcdef", job.EndpointChatCompletions, items, 32)
	if e != nil {
		t.Fatal(e)
	}
	if len(p.Chunks) < 2 || len(p.Claims) != 1 || p.Claims[0].ID != "big" {
		t.Fatalf("%d chunks, claims %+v", len(p.Chunks), p.Claims)
	}
	var got []job.Item
	for _, c := range p.Chunks {
		if n := job.MessageSize(c.Body, attributes("0123456789abcdef0123456789abcdef", c.Index, longestTenant)); n > max {
			t.Errorf("chunk %d is %d bytes as SQS counts it", c.Index, n)
		}
		w, err := job.DecodeWork([]byte(c.Body))
		if err != nil {
			t.Fatalf("chunk %d: %v", c.Index, err)
		}
		if w.Endpoint != job.EndpointChatCompletions {
			t.Errorf("chunk %d has endpoint %q", c.Index, w.Endpoint)
		}
		got = append(got, w.Items...)
	}
	// Compacted, and the emoji escaped for SQS; nothing else changed.
	if want := `{"model":"llama","messages":[{"role":"user","content":"a < b & \ud83d\ude00"}]}`; string(got[0].Body) != want {
		t.Errorf("body on the queue\n got %s\nwant %s", got[0].Body, want)
	}
	if got[1].Ref == nil || got[1].Body != nil {
		t.Fatalf("large body not claim-checked: %+v", got[1])
	}
	var stored job.Item
	if err := json.Unmarshal(p.Claims[0].Body, &stored); err != nil || stored.ID != "big" || string(stored.Body) != big {
		t.Errorf("claim-checked object holds %.80s (%v)", p.Claims[0].Body, err)
	}
	for i, it := range got[2:] {
		if string(it.Body) != string(items[i+2].Body) {
			t.Errorf("item %s changed", it.ID)
		}
	}
	// The envelope is longer by the endpoint: an item that fits it travels
	// inline, alone; one byte more goes through S3, or is refused without a
	// bucket.
	id := strings.Repeat("f", 32)
	budget := max - overhead(id, job.EndpointChatCompletions)
	if budget >= pl.MaxItemBytes {
		t.Fatalf("budget %d, item limit %d: the test needs a smaller budget", budget, pl.MaxItemBytes)
	}
	at := func(n int) RequestItem {
		return RequestItem{ID: "z", Body: json.RawMessage(`{"model":"m","input":"` + strings.Repeat("y", n-len(`{"id":"z","body":{"model":"m","input":""}}`)) + `"}`)}
	}
	p, e = pl.PlanFor(id, job.EndpointChatCompletions, []RequestItem{at(budget), {ID: "b", Body: json.RawMessage(`{}`)}}, 32)
	if e != nil || len(p.Claims) != 0 || len(p.Chunks) != 2 {
		t.Errorf("a body at the budget: %v, %d claims, %d chunks; want inline, alone", e, len(p.Claims), len(p.Chunks))
	}
	p, e = pl.PlanFor(id, job.EndpointChatCompletions, []RequestItem{at(budget + 1)}, 32)
	if e != nil || len(p.Claims) != 1 {
		t.Errorf("a body a byte over the budget: %v, %d claims; want it claim-checked", e, len(p.Claims))
	}
	pl.Bucket = ""
	if _, e = pl.PlanFor(id, job.EndpointChatCompletions, []RequestItem{at(budget + 1)}, 32); e == nil || e.Code != api.CodeItemTooLarge || e.Item != "z" {
		t.Errorf("a body a byte over the budget without a bucket: %v; want 413 item_too_large", e)
	}
}
