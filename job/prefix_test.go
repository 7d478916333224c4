package job

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func chat(model, system string, turns ...string) []byte {
	msgs := []string{fmt.Sprintf(`{"role":"system","content":%q}`, system)}
	for _, t := range turns {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":%q}`, t))
	}
	return []byte(fmt.Sprintf(`{"model":%q,"messages":[%s]}`, model, strings.Join(msgs, ",")))
}

func TestPrefixKey(t *testing.T) {
	doc := strings.Repeat("word ", PrefixBytes/5+10)
	cases := []struct {
		name     string
		ep       string
		a, b     []byte
		same     bool
		emptyKey bool // a's key is ""
	}{
		{"chat, same system prompt, last turn differs", EndpointChatCompletions,
			chat("m", "be brief", "q1"), chat("m", "be brief", "q2"), true, false},
		{"chat, same leading turns", EndpointChatCompletions,
			chat("m", "s", "t1", "q1"), chat("m", "s", "t1", "q2"), true, false},
		{"chat, white space inside the JSON does not count", EndpointChatCompletions,
			[]byte(`{"model":"m","messages":[{"role":"system", "content":"s"},{"role":"user","content":"a"}]}`),
			chat("m", "s", "b"), true, false},
		{"chat, other system prompt", EndpointChatCompletions,
			chat("m", "be brief", "q"), chat("m", "be long", "q"), false, false},
		{"chat, other model", EndpointChatCompletions,
			chat("m1", "s", "q"), chat("m2", "s", "q"), false, false},
		{"chat of one message", EndpointChatCompletions,
			[]byte(`{"model":"m","messages":[{"role":"user","content":"q"}]}`), nil, false, true},
		{"completion, shared document", EndpointCompletions,
			[]byte(fmt.Sprintf(`{"model":"m","prompt":%q}`, doc+"question one")),
			[]byte(fmt.Sprintf(`{"model":"m","prompt":%q}`, doc+"question two")), true, false},
		{"completion, other document", EndpointCompletions,
			[]byte(fmt.Sprintf(`{"model":"m","prompt":%q}`, doc+"q")),
			[]byte(fmt.Sprintf(`{"model":"m","prompt":%q}`, "x"+doc+"q")), false, false},
		{"completion, short prompt", EndpointCompletions,
			[]byte(`{"model":"m","prompt":"short"}`), nil, false, true},
		{"embedding", EndpointEmbeddings,
			[]byte(fmt.Sprintf(`{"model":"m","input":%q}`, doc)), nil, false, true},
		{"not JSON", EndpointChatCompletions, []byte(`{"model":`), nil, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ka := PrefixKey(c.ep, c.a)
			if (ka == "") != c.emptyKey {
				t.Fatalf("key %q, want empty: %v", ka, c.emptyKey)
			}
			if c.b == nil {
				return
			}
			if kb := PrefixKey(c.ep, c.b); (ka == kb) != c.same {
				t.Errorf("keys %q and %q: same %v, want %v", ka, kb, ka == kb, c.same)
			}
		})
	}
}

func TestPrefixOrder(t *testing.T) {
	keys := []string{"a", "b", "", "a", "c", "b", "", "a"}
	got := PrefixOrder(keys)
	want := []int{0, 3, 7, 1, 5, 2, 4, 6}
	if !slices.Equal(got, want) {
		t.Errorf("PrefixOrder(%q) = %v, want %v", keys, got, want)
	}
}
