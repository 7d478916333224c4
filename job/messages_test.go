package job

import (
	"errors"
	"testing"
)

// Anthropic's Messages bodies: max_tokens is required and bounded (no
// ceiling is added), stream refused, and a content block's source of type
// url refused unless remote URLs are allowed, inside a tool_result too.
func TestCheckMessagesRequest(t *testing.T) {
	lim := RequestLimits{MaxOutputTokens: 100}
	remote := `{"type":"image","source":{"type":"url","url":"https://example.com/cat.png"}}`
	for _, c := range []struct {
		name, body string
		want       error
	}{
		{"plain", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"system and blocks", `{"model":"m","max_tokens":10,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hi"},` +
			`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}]}`, nil},
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, ErrMaxTokens},
		{"max_tokens over", `{"model":"m","max_tokens":101,"messages":[{"role":"user","content":"hi"}]}`, ErrMaxTokens},
		{"max_tokens as string", `{"model":"m","max_tokens":"10","messages":[{"role":"user","content":"hi"}]}`, ErrMaxTokens},
		{"stream", `{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, ErrStream},
		{"no messages", `{"model":"m","max_tokens":10,"messages":[]}`, ErrBodyInvalid},
		{"remote image", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[` + remote + `]}]}`, ErrRemoteURL},
		{"remote image in a tool result", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t",` +
			`"content":[` + remote + `]}]}]}`, ErrRemoteURL},
		{"source url in two cases", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","URL":"x","url":"y"}}]}]}`, ErrBodyInvalid},
	} {
		r, err := CheckRequest(EndpointMessages, []byte(c.body), lim)
		if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
			t.Errorf("%s: %v; want %v", c.name, err, c.want)
			continue
		}
		if err == nil && (r.MaxOut != 10 || r.N != 1 || string(r.Body) != c.body) {
			t.Errorf("%s: %+v", c.name, r)
		}
	}
	allowed := lim
	allowed.AllowRemoteURLs = true
	if _, err := CheckRequest(EndpointMessages, []byte(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[`+remote+`]}]}`), allowed); err != nil {
		t.Errorf("remote image allowed: %v", err)
	}
}
