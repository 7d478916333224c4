package modelserver

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

// paths records the paths of the requests a client sends.
type paths struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (p *paths) RoundTrip(r *http.Request) (*http.Response, error) {
	p.mu.Lock()
	p.seen = append(p.seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("anthropic-version"))
	p.mu.Unlock()
	return p.next.RoundTrip(r)
}

// message is the Anthropic Message an answer must be.
type message struct {
	ID           string  `json:"id"`
	Type         string  `json:"type"`
	Role         string  `json:"role"`
	Model        string  `json:"model"`
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Content      []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	Usage struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
}

// A Messages item goes to the server's /v1/messages with MessagesNative,
// and to /v1/chat/completions with MessagesChat (the default); either way
// its answer is an Anthropic Message, with usage, and a ceiling that cuts
// it is stop_reason max_tokens. A request the translation cannot carry
// (tools) is refused without a request in chat mode and sent as it is in
// native mode.
func TestMessagesNativeAndTranslated(t *testing.T) {
	body := func(text string, maxTokens int, extra string) job.Item {
		b := `{"model":"fake-model","max_tokens":` + itoa(maxTokens) + `,"system":[{"type":"text","text":"be brief"}],` +
			`"messages":[{"role":"user","content":[{"type":"text","text":` + quote(text) + `},` +
			`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}]` + extra + `}`
		return job.Item{ID: text, Body: json.RawMessage(b)}
	}
	for _, c := range []struct {
		mode, path string
		toolsOK    bool
	}{{"", "POST /v1/chat/completions ", false}, {MessagesNative, "POST /v1/messages 2023-06-01", true}} {
		t.Run("mode "+c.mode, func(t *testing.T) {
			s := fakeoai.New(fakeoai.Config{OutputTokens: func(string, int) int { return 6 }})
			defer s.Close()
			rec := &paths{next: s.Client().Transport}
			m, err := Open(t.Context(), Config{BaseURL: s.URL(), Models: []string{"fake-model"}, Messages: c.mode,
				HTTPClient: &http.Client{Transport: rec}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			items := []job.Item{body("whole", 32, ""), body("cut", 3, ""),
				body("tools", 32, `,"tools":[{"name":"f","input_schema":{"type":"object"}}]`)}
			outs, err := m.Run(t.Context(), job.EndpointMessages, items)
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []string{"end_turn", "max_tokens", "end_turn"} {
				o := outs[i]
				if i == 2 && !c.toolsOK {
					if o.Error == nil || o.Error.Code != job.ItemInvalidInput || !strings.Contains(o.Error.Message, "tools") || o.Response != nil {
						t.Errorf("tools in chat mode: %+v", o)
					}
					continue
				}
				var msg message
				if o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 || json.Unmarshal(o.Response.Body, &msg) != nil {
					t.Fatalf("item %d: %+v", i, o)
				}
				if !strings.HasPrefix(msg.ID, "msg_") || msg.Type != "message" || msg.Role != "assistant" || msg.Model != "fake-model" ||
					msg.StopReason != want || len(msg.Content) != 1 || msg.Content[0].Type != "text" || msg.Content[0].Text == "" ||
					msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
					t.Errorf("item %d: %s", i, o.Response.Body)
				}
			}
			sent := len(items)
			if !c.toolsOK {
				sent--
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			var posts []string
			for _, p := range rec.seen {
				if strings.HasPrefix(p, "POST ") {
					posts = append(posts, p)
				}
			}
			if len(posts) != sent || posts[0] != c.path {
				t.Errorf("requests %q; want %d of %q", posts, sent, c.path)
			}
		})
	}
}

// The translation's mapping, both ways.
func TestMessagesTranslation(t *testing.T) {
	in := `{"model":"m","max_tokens":8,"system":"sys","temperature":0.5,"top_p":0.9,"stop_sequences":["END"],"metadata":{"user_id":"u1"},` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"look","cache_control":{"type":"ephemeral"}},` +
		`{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]},` +
		`{"role":"assistant","content":[{"type":"text","text":"a "},{"type":"text","text":"cat"}]},{"role":"user","content":"and?"}]}`
	got, stops, err := toChat([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	var g, w any
	want := `{"model":"m","max_tokens":8,"temperature":0.5,"top_p":0.9,"stop":["END"],"user":"u1","messages":[` +
		`{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"look"},` +
		`{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]},{"role":"assistant","content":"a cat"},{"role":"user","content":"and?"}]}`
	_ = json.Unmarshal(got, &g)
	_ = json.Unmarshal([]byte(want), &w)
	if d := cmp.Diff(w, g); d != "" || len(stops) != 1 {
		t.Errorf("toChat (-want +got):\n%s", d)
	}
	for _, bad := range []string{
		`{"model":"m","max_tokens":8,"thinking":{"type":"enabled"},"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","data":"x"}}]}]}`,
		`{"model":"m","max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`,
		`{"model":"m","max_tokens":8,"system":[{"type":"image"}],"messages":[{"role":"user","content":"x"}]}`,
	} {
		if _, _, err := toChat([]byte(bad)); err == nil {
			t.Errorf("toChat(%s) carried it", bad)
		}
	}
	for _, c := range []struct{ finish, stopReason, want, seq string }{
		{"stop", `null`, "end_turn", ""}, {"length", `null`, "max_tokens", ""}, {"content_filter", `null`, "refusal", ""},
		{"stop", `"END"`, "stop_sequence", "END"}, {"stop", `"OTHER"`, "end_turn", ""}, {"stop", `151643`, "end_turn", ""},
	} {
		chat := `{"id":"chatcmpl-7","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"` + c.finish +
			`","stop_reason":` + c.stopReason + `}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`
		var msg message
		if err := json.Unmarshal(fromChat([]byte(chat), []string{"END"}), &msg); err != nil {
			t.Fatal(err)
		}
		seq := ""
		if msg.StopSequence != nil {
			seq = *msg.StopSequence
		}
		if msg.ID != "msg_7" || msg.StopReason != c.want || seq != c.seq || msg.Usage.InputTokens != 5 || msg.Usage.OutputTokens != 2 ||
			len(msg.Content) != 1 || msg.Content[0].Text != "hi" {
			t.Errorf("%s/%s: %+v", c.finish, c.stopReason, msg)
		}
	}
}

func itoa(n int) string     { b, _ := json.Marshal(n); return string(b) }
func quote(s string) string { b, _ := json.Marshal(s); return string(b) }
