package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

var testRequestLimits = RequestLimits{Models: []string{"llama"}, MaxN: 4, MaxOutputTokens: 1000}

const testMessages = `"messages":[{"role":"user","content":"hi"}]`

func body(fields ...string) string { return "{" + strings.Join(fields, ",") + "}" }

// Issue 34, item 9: the canonical body is what is sent. A null ceiling is
// dropped and the default ceiling named, so that no server reads a null
// (vLLM: no ceiling but the context) or the last of two keys.
func TestCheckRequestCanonicalBody(t *testing.T) {
	for _, tc := range []struct {
		name, endpoint, body, want string
		maxOut, seqs               int64
	}{
		{"chat without a ceiling", EndpointChatCompletions, body(`"model":"llama"`, testMessages),
			`{"model":"llama",` + testMessages + `,"max_tokens":1000}`, 1000, 1},
		{"chat with null ceilings", EndpointChatCompletions,
			body(`"model":"llama"`, `"max_tokens":null`, `"max_completion_tokens":null`, `"n":null`, `"stream":null`, testMessages),
			`{"model":"llama",` + testMessages + `,"max_tokens":1000}`, 1000, 1},
		{"chat with max_completion_tokens", EndpointChatCompletions, body(`"model":"llama"`, testMessages, `"max_completion_tokens":7`),
			`{"model":"llama",` + testMessages + `,"max_completion_tokens":7}`, 7, 1},
		{"chat with both, the larger counted", EndpointChatCompletions,
			body(`"model":"llama"`, testMessages, `"max_completion_tokens":7`, `"max_tokens":9`),
			`{"model":"llama",` + testMessages + `,"max_completion_tokens":7,"max_tokens":9}`, 9, 1},
		{"completions default", EndpointCompletions, body(`"model":"llama"`, `"prompt":"x"`, `"max_tokens":null`),
			`{"model":"llama","prompt":"x","max_tokens":16}`, 16, 1},
		{"best_of counted", EndpointCompletions, body(`"model":"llama"`, `"prompt":"x"`, `"n":2`, `"best_of":3`, `"max_tokens":5`),
			`{"model":"llama","prompt":"x","n":2,"best_of":3,"max_tokens":5}`, 5, 3},
		{"white space compacted", EndpointEmbeddings, "{ \"model\" : \"llama\" ,\n \"input\" : [ \"a\" , \"b\" ] }",
			`{"model":"llama","input":["a","b"]}`, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := CheckRequest(tc.endpoint, []byte(tc.body), testRequestLimits)
			if err != nil {
				t.Fatal(err)
			}
			if string(r.Body) != tc.want || r.MaxOut != tc.maxOut || r.Sequences() != tc.seqs {
				t.Errorf("body %s, max out %d, sequences %d; want %s, %d, %d", r.Body, r.MaxOut, r.Sequences(), tc.want, tc.maxOut, tc.seqs)
			}
		})
	}
}

// Issue 34, items 9 and 10: what the rule refuses, and as what.
func TestCheckRequestRefusals(t *testing.T) {
	long := make([]string, MaxEmbeddingInputs+1)
	for i := range long {
		long[i] = `"t"`
	}
	part := func(p string) string {
		return `"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},` + p + `]}]`
	}
	for _, tc := range []struct {
		name, endpoint, body string
		kind                 error
	}{
		// Keys a case-insensitive reader (Go's encoding/json, Ollama's gin
		// binding) takes for the ones the rule bounds.
		{"MAX_TOKENS", EndpointChatCompletions, body(`"model":"llama"`, testMessages, `"MAX_TOKENS":100000`), ErrBodyInvalid},
		{"MODEL", EndpointChatCompletions, body(`"model":"llama"`, `"MODEL":"gpt-x"`, testMessages), ErrBodyInvalid},
		{"MODEL alone", EndpointChatCompletions, body(`"MODEL":"llama"`, testMessages), ErrBodyInvalid},
		{"N", EndpointCompletions, body(`"model":"llama"`, `"prompt":"x"`, `"N":100`), ErrBodyInvalid},
		{"Max_Completion_Tokens", EndpointChatCompletions, body(`"model":"llama"`, testMessages, `"Max_Completion_Tokens":9`), ErrBodyInvalid},
		{"two keys in two cases", EndpointChatCompletions, body(`"model":"llama"`, testMessages, `"seed":1`, `"SEED":2`), ErrBodyInvalid},
		{"a key twice", EndpointChatCompletions, body(`"model":"llama"`, testMessages, `"max_tokens":1`, `"max_tokens":null`), ErrBodyInvalid},
		{"a message's key twice", EndpointChatCompletions,
			body(`"model":"llama"`, `"messages":[{"role":"user","content":"a","content":[{"type":"image_url","image_url":{"url":"http://x"}}]}]`), ErrBodyInvalid},
		{"a message not an object", EndpointChatCompletions, body(`"model":"llama"`, `"messages":["hi"]`), ErrBodyInvalid},
		// best_of: bounded as n is, and not below n.
		{"best_of over", EndpointCompletions, body(`"model":"llama"`, `"prompt":"x"`, `"best_of":5`), ErrN},
		{"best_of below n", EndpointCompletions, body(`"model":"llama"`, `"prompt":"x"`, `"n":3`, `"best_of":2`), ErrN},
		{"best_of on chat", EndpointChatCompletions, body(`"model":"llama"`, testMessages, `"best_of":50`), ErrN},
		{"n as a float", EndpointChatCompletions, body(`"model":"llama"`, testMessages, `"n":2.0`), ErrN},
		{"max_completion_tokens over on completions", EndpointCompletions, body(`"model":"llama"`, `"prompt":"x"`, `"max_completion_tokens":100000`), ErrMaxTokens},
		{"max_tokens as a float", EndpointChatCompletions, body(`"model":"llama"`, testMessages, `"max_tokens":1e3`), ErrMaxTokens},
		{"embeddings past 2048 inputs", EndpointEmbeddings, body(`"model":"llama"`, `"input":[`+strings.Join(long, ",")+`]`), ErrBodyInvalid},
		{"a negative token", EndpointEmbeddings, body(`"model":"llama"`, `"input":[1,-1]`), ErrBodyInvalid},
		{"model not allowed", EndpointEmbeddings, body(`"model":"gpt-x"`, `"input":"x"`), ErrModelNotAllowed},
		{"stream", EndpointChatCompletions, body(`"model":"llama"`, testMessages, `"stream":true`), ErrStream},
		// Remote content: refused unless allowed.
		{"remote image_url", EndpointChatCompletions, body(`"model":"llama"`, part(`{"type":"image_url","image_url":{"url":"http://169.254.169.254/latest/meta-data/"}}`)), ErrRemoteURL},
		{"remote image_url as a string", EndpointChatCompletions, body(`"model":"llama"`, part(`{"type":"image_url","image_url":"https://example.com/a.png"}`)), ErrRemoteURL},
		{"remote audio_url", EndpointChatCompletions, body(`"model":"llama"`, part(`{"type":"audio_url","audio_url":{"url":"file:///etc/passwd"}}`)), ErrRemoteURL},
		{"remote url of another case", EndpointChatCompletions, body(`"model":"llama"`, part(`{"type":"image_url","IMAGE_URL":{"url":"http://x"}}`)), ErrBodyInvalid},
		{"a url twice", EndpointChatCompletions, body(`"model":"llama"`, part(`{"type":"image_url","image_url":{"url":"data:,x","url":"http://x"}}`)), ErrBodyInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CheckRequest(tc.endpoint, []byte(tc.body), testRequestLimits)
			var be *BodyError
			if !errors.Is(err, tc.kind) || !errors.As(err, &be) {
				t.Fatalf("CheckRequest: %v; want %v", err, tc.kind)
			}
			for _, v := range []string{"100000", "gpt-x", "169.254", "example.com", "passwd"} {
				if strings.Contains(err.Error(), v) {
					t.Errorf("message %q quotes the request", err)
				}
			}
		})
	}
}

// data: URLs are content, not an address: always taken; remote ones when
// the operator allows them.
func TestCheckRequestURLs(t *testing.T) {
	data := body(`"model":"llama"`, `"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"DATA:image/png;base64,iVBORw0KGgo="}}]}]`)
	if _, err := CheckRequest(EndpointChatCompletions, []byte(data), testRequestLimits); err != nil {
		t.Errorf("a data: URL: %v", err)
	}
	remote := body(`"model":"llama"`, `"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]`)
	lim := testRequestLimits
	lim.AllowRemoteURLs = true
	if _, err := CheckRequest(EndpointChatCompletions, []byte(remote), lim); err != nil {
		t.Errorf("a remote URL, allowed: %v", err)
	}
}

// FuzzCheckRequest feeds arbitrary bodies to the rule. Invariants: a
// refusal is a *BodyError of one of the kinds; an accepted body's canonical
// form is valid JSON, holds no null ceiling, names its ceiling for a
// generation, and is accepted again as itself, with the same facts: what
// the subscriber sends is what the rule would accept from the queue.
func FuzzCheckRequest(f *testing.F) {
	f.Add(EndpointChatCompletions, []byte(body(`"model":"llama"`, testMessages, `"max_tokens":null`)))
	f.Add(EndpointCompletions, []byte(body(`"model":"llama"`, `"prompt":["a","b"]`, `"n":2`, `"best_of":3`)))
	f.Add(EndpointEmbeddings, []byte(body(`"model":"llama"`, `"input":[[1,2],[3]]`)))
	f.Add(EndpointChatCompletions, []byte(body(`"model":"llama"`, `"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,x"}}]}]`)))
	f.Fuzz(func(t *testing.T, endpoint string, b []byte) {
		r, err := CheckRequest(endpoint, b, testRequestLimits)
		if err != nil {
			var be *BodyError
			kinds := []error{ErrBodyInvalid, ErrModelNotAllowed, ErrStream, ErrN, ErrMaxTokens, ErrRemoteURL}
			if r != nil || !errors.As(err, &be) || !slices.ContainsFunc(kinds, func(k error) bool { return errors.Is(err, k) }) {
				t.Fatalf("CheckRequest: %v, %v; want a *BodyError of a kind", r, err)
			}
			return
		}
		if !json.Valid(r.Body) || bytes.Contains(r.Body, []byte(`"max_tokens":null`)) {
			t.Fatalf("canonical body %s", r.Body)
		}
		if endpoint != EndpointEmbeddings && (r.MaxOut < 1 || r.MaxOut > int64(testRequestLimits.MaxOutputTokens)) {
			t.Fatalf("max out %d", r.MaxOut)
		}
		again, err := CheckRequest(endpoint, r.Body, testRequestLimits)
		if err != nil {
			t.Fatalf("the canonical body %s is refused: %v", r.Body, err)
		}
		if !bytes.Equal(again.Body, r.Body) || again.MaxOut != r.MaxOut || again.Sequences() != r.Sequences() || again.Model != r.Model {
			t.Fatalf("checked again: %+v; want %+v", again, r)
		}
	})
}

// Members reads an object around a body (a batch file's line) by the body
// rule's reading: a key given twice, or in two cases, is refused, as is
// anything but one object.
func TestMembers(t *testing.T) {
	m, err := Members([]byte(`{"custom_id":"a", "body": {"x" : 1}}`))
	if err != nil || string(m["custom_id"]) != `"a"` || string(m["body"]) != `{"x":1}` {
		t.Errorf("Members: %q, %v", m, err)
	}
	for _, bad := range []string{`{"a":1,"a":2}`, `{"custom_id":"a","CUSTOM_ID":"b"}`, `[1]`, `{"a":1} {}`, `{"a":`, ``} {
		if _, err := Members([]byte(bad)); !errors.Is(err, ErrBodyInvalid) {
			t.Errorf("Members(%q): %v; want ErrBodyInvalid", bad, err)
		}
	}
}
