package job

import (
	"errors"
	"testing"
)

func TestCheckRequestResponsesAndModerations(t *testing.T) {
	lim := RequestLimits{MaxN: 4, MaxOutputTokens: 100}
	cases := []struct {
		name, endpoint, body string
		kind                 error  // nil: accepted
		want                 string // the canonical body, when accepted
		maxOut               int64
	}{
		{"response of a string, ceiling added", EndpointResponses, `{"model":"m","input":"hi"}`, nil,
			`{"model":"m","input":"hi","max_output_tokens":100}`, 100},
		{"response of items, its own ceiling", EndpointResponses,
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":7}`, nil,
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":7}`, 7},
		{"response ceiling null is the default", EndpointResponses, `{"model":"m","input":"hi","max_output_tokens":null}`, nil,
			`{"model":"m","input":"hi","max_output_tokens":100}`, 100},
		{"response ceiling past the bound", EndpointResponses, `{"model":"m","input":"hi","max_output_tokens":101}`, ErrMaxTokens, "", 0},
		{"response ceiling as a string", EndpointResponses, `{"model":"m","input":"hi","max_output_tokens":"7"}`, ErrMaxTokens, "", 0},
		{"response ceiling in another case", EndpointResponses, `{"model":"m","input":"hi","MAX_OUTPUT_TOKENS":1000}`, ErrBodyInvalid, "", 0},
		{"response in the background", EndpointResponses, `{"model":"m","input":"hi","background":true}`, ErrBodyInvalid, "", 0},
		{"response streamed", EndpointResponses, `{"model":"m","input":"hi","stream":true}`, ErrStream, "", 0},
		{"response without input", EndpointResponses, `{"model":"m"}`, ErrBodyInvalid, "", 0},
		{"response of an empty string", EndpointResponses, `{"model":"m","input":""}`, ErrBodyInvalid, "", 0},
		{"response with a remote image", EndpointResponses,
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://x/y.png"}]}]}`, ErrRemoteURL, "", 0},
		{"response with a data image", EndpointResponses,
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}]}`, nil,
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}],"max_output_tokens":100}`, 100},
		{"moderation of a string", EndpointModerations, `{"model":"m","input":"hi"}`, nil, `{"model":"m","input":"hi"}`, 0},
		{"moderation of strings", EndpointModerations, `{"model":"m","input":["a","b"]}`, nil, `{"model":"m","input":["a","b"]}`, 0},
		{"moderation of parts", EndpointModerations, `{"model":"m","input":[{"type":"text","text":"a"}]}`, nil,
			`{"model":"m","input":[{"type":"text","text":"a"}]}`, 0},
		{"moderation with a remote image", EndpointModerations,
			`{"model":"m","input":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}`, ErrRemoteURL, "", 0},
		{"moderation of token ids", EndpointModerations, `{"model":"m","input":[1,2]}`, ErrBodyInvalid, "", 0},
		{"moderation of nothing", EndpointModerations, `{"model":"m","input":[]}`, ErrBodyInvalid, "", 0},
		{"moderation without a model", EndpointModerations, `{"input":"hi"}`, ErrBodyInvalid, "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := CheckRequest(c.endpoint, []byte(c.body), lim)
			if c.kind != nil {
				if !errors.Is(err, c.kind) {
					t.Fatalf("CheckRequest = %v, want an error of kind %v", err, c.kind)
				}
				return
			}
			if err != nil {
				t.Fatalf("CheckRequest: %v", err)
			}
			if string(r.Body) != c.want || r.MaxOut != c.maxOut {
				t.Errorf("CheckRequest = %s (max out %d), want %s (%d)", r.Body, r.MaxOut, c.want, c.maxOut)
			}
		})
	}
}
