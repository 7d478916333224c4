package fakeoai_test

import (
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// prompt + max_tokens past max model len: TGI's 422 by default (OpenAI's
// 400 context_length_exceeded when asked: harness/sdkclients's
// TestContextLengthSDK, read by the SDK).
func TestContextLength(t *testing.T) {
	s := start(t, fakeoai.Config{MaxModelLen: 32})
	res, got := post(t, s, "/v1/completions", completionBody(strings.Repeat("w ", 10), 30))
	want := `{"error":"Input validation error: ` + "`inputs` tokens + `max_new_tokens` must be <= 32. Given: 10 `inputs` tokens and 30 `max_new_tokens`" + `","error_type":"validation"}`
	if res.StatusCode != http.StatusUnprocessableEntity || got != want {
		t.Errorf("%d %s", res.StatusCode, got)
	}
	if res, got := post(t, s, "/v1/completions", completionBody(strings.Repeat("w ", 10), 22)); res.StatusCode != http.StatusOK {
		t.Errorf("exactly max model len: %d %s", res.StatusCode, got)
	}
}

// Without max_tokens a chat may use the rest of the context, a completion 16
// tokens, and the TPM charge follows.
func TestDefaultMaxTokens(t *testing.T) {
	s := start(t, fakeoai.Config{MaxModelLen: 100, Limits: fakeoai.RateLimits{TPM: 1000}})
	post(t, s, "/v1/completions", `{"model":"fake-model","prompt":"a b"}`)
	post(t, s, "/v1/chat/completions", `{"model":"fake-model","messages":[{"role":"user","content":"a b"}]}`)
	// 2 + 16, then a chat prompt of 3+3+1+2 = 9 tokens + 91.
	if st := s.Stats(); st.AdmittedTokens != 18+100 {
		t.Errorf("admitted tokens %d", st.AdmittedTokens)
	}
}

// TEI's payload limit and max_client_batch_size are 413s.
func TestPayloadLimits(t *testing.T) {
	s := start(t, fakeoai.Config{PayloadLimit: 100, MaxClientBatch: 2})
	res, got := post(t, s, "/v1/embeddings", `{"model":"fake-model","input":"`+strings.Repeat("x", 200)+`"}`)
	if res.StatusCode != http.StatusRequestEntityTooLarge || got != "Failed to buffer the request body: length limit exceeded" {
		t.Errorf("payload: %d %s", res.StatusCode, got)
	}
	res, got = post(t, s, "/v1/embeddings", `{"model":"fake-model","input":["a","b","c"]}`)
	if res.StatusCode != http.StatusRequestEntityTooLarge || got != `{"message":"batch size 3 > maximum allowed batch size 2","code":413,"type":"validation"}` {
		t.Errorf("batch: %d %s", res.StatusCode, got)
	}
	if res, got := post(t, s, "/v1/embeddings", `{"model":"fake-model","input":["a","b"]}`); res.StatusCode != http.StatusOK {
		t.Errorf("within the limits: %d %s", res.StatusCode, got)
	}
}

func TestBadRequests(t *testing.T) {
	s := start(t, fakeoai.Config{})
	for _, c := range []struct {
		path, body string
		status     int
		param      string
	}{
		{"/v1/chat/completions", `{"model":`, 400, ""},
		{"/v1/chat/completions", `{"model":"fake-model","messages":[]}`, 400, `"messages"`},
		{"/v1/chat/completions", `{"model":"fake-model","messages":[{"role":"user","content":"x"}],"stream":true}`, 400, `"stream"`},
		{"/v1/chat/completions", `{"model":"fake-model","messages":[{"role":"user","content":"x"}],"n":0}`, 400, `"n"`},
		{"/v1/completions", `{"model":"fake-model","prompt":"x","max_tokens":0}`, 400, `"max_tokens"`},
		{"/v1/completions", `{"prompt":"x"}`, 400, `"model"`},
		{"/v1/embeddings", `{"model":"fake-model","input":[]}`, 400, `"input"`},
		{"/v1/embeddings", `{"model":"fake-model","input":"x","encoding_format":"int8"}`, 400, `"encoding_format"`},
		{"/v1/nothing", `{}`, 404, ""},
	} {
		res, got := post(t, s, c.path, c.body)
		if res.StatusCode != c.status || !strings.Contains(got, `"type":"invalid_request_error"`) ||
			(c.param != "" && !strings.Contains(got, `"param":`+c.param)) {
			t.Errorf("%s %s: %d %s", c.path, c.body, res.StatusCode, got)
		}
	}
}

// Chat content may come as text parts; token arrays are prompts too.
func TestInputShapes(t *testing.T) {
	s := start(t, fakeoai.Config{})
	_, got := post(t, s, "/v1/chat/completions",
		`{"model":"fake-model","messages":[{"role":"user","name":"ann","content":[{"type":"text","text":"a b c"}]}],"max_tokens":1}`)
	// 3 + 3 + user + "a b c" + ann + 1 = 12
	if !strings.Contains(got, `"prompt_tokens":12,`) {
		t.Errorf("content parts: %s", got)
	}
	_, got = post(t, s, "/v1/completions", `{"model":"fake-model","prompt":[[1,2,3],[4,5]],"max_tokens":1}`)
	if !strings.Contains(got, `"prompt_tokens":5,`) || strings.Count(got, `"text"`) != 2 {
		t.Errorf("token arrays: %s", got)
	}
}

func TestTokenizer(t *testing.T) {
	if n := fakeoai.CountTokens("  one two\tthree\nfour "); n != 4 {
		t.Errorf("CountTokens = %d", n)
	}
	msgs := []fakeoai.Message{{Role: "system", Content: "be brief"}, {Role: "user", Name: "ann", Content: "hi there"}}
	if n := fakeoai.ChatPromptTokens(msgs); n != 3+(3+1+2)+(3+1+2+1+1) {
		t.Errorf("ChatPromptTokens = %d", n)
	}
	if n := fakeoai.DefaultOutputTokens("x [[len=123]] y", 4); n != 123 {
		t.Errorf("directive: %d", n)
	}
	seen := map[int]bool{}
	for i := range 200 {
		n := fakeoai.DefaultOutputTokens("prompt", i)
		if n < 8 || n > 64 || n != fakeoai.DefaultOutputTokens("prompt", i) {
			t.Fatalf("choice %d: %d", i, n)
		}
		seen[n] = true
	}
	if len(seen) < 20 {
		t.Errorf("%d lengths over 200 choices", len(seen))
	}
}

func TestEmbed(t *testing.T) {
	a, b := fakeoai.Embed("text", 32), fakeoai.Embed("text", 32)
	var norm float64
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("not deterministic at %d", i)
		}
		norm += a[i] * a[i]
	}
	if math.Abs(norm-1) > 1e-6 {
		t.Errorf("norm² %v", norm)
	}
	if c := fakeoai.Embed("other", 32); c[0] == a[0] && c[1] == a[1] {
		t.Errorf("two texts, one embedding")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []fakeoai.Config{
		{Speed: -1},
		{ContextLengthStatus: 413},
		{MaxModelLen: 100, BlockSize: 16, NumGPUBlocks: 6},
		{Limits: fakeoai.RateLimits{TPM: -1}},
		{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultStatus}}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: valid", c)
		}
	}
	if err := (fakeoai.Config{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("New accepted an invalid config")
		}
	}()
	fakeoai.New(fakeoai.Config{Speed: -1})
}
