package modelserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
)

// Chat, completion and embedding items come back with the server's
// answers; embedding items share requests, and each gets its own vector.
func TestRunAnswersEachItem(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{EmbedBatch: 4}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		items := []job.Item{chatItem("c", "hello there", 8), completionItem("p", "once upon", 5)}
		emb := embedItems(6)
		items = append(items, emb...)
		outs, err := m.Run(t.Context(), "", items)
		if err != nil {
			t.Fatal(err)
		}
		wantOK(t, outs)
		var chat struct {
			Object  string `json:"object"`
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(outs[0].Response.Body, &chat); err != nil || chat.Object != "chat.completion" || len(chat.Choices) != 1 {
			t.Errorf("chat answer %s (%v)", outs[0].Response.Body, err)
		}
		if !strings.Contains(string(outs[1].Response.Body), `"object":"text_completion"`) {
			t.Errorf("completion answer %s", outs[1].Response.Body)
		}
		for i, it := range emb {
			var in struct{ Input string }
			_ = json.Unmarshal(it.Body, &in)
			if diff := cmp.Diff(fakeoai.Embed(in.Input, 16), embeddingOf(t, outs[2+i])); diff != "" {
				t.Errorf("item %s: not its own embedding (-want +got):\n%s", it.ID, diff)
			}
		}
		// 2 generation requests, and 6 embedding items in requests of 4 at most.
		if got := s.Stats().Requests; got != 4 {
			t.Errorf("%d requests; want 4", got)
		}
	})
}

// An item the subscriber refuses itself never reaches the server; the
// others of the batch run.
func TestRunRefusesBadItemsLocally(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{MaxOutputTokens: 100}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		items := []job.Item{
			{ID: "text", Text: "an item of a job without an endpoint"},
			{ID: "array", Body: json.RawMessage(`[1,2]`)},
			{ID: "other-model", Body: json.RawMessage(`{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}`)},
			{ID: "stream", Body: json.RawMessage(`{"model":"fake-model","stream":true,"messages":[{"role":"user","content":"x"}]}`)},
			{ID: "too-long", Body: json.RawMessage(`{"model":"fake-model","max_tokens":101,"messages":[{"role":"user","content":"x"}]}`)},
			{ID: "n", Body: json.RawMessage(`{"model":"fake-model","n":9,"messages":[{"role":"user","content":"x"}]}`)},
			{ID: "no-route", Body: json.RawMessage(`{"model":"fake-model"}`)},
			chatItem("good", "fine", 3),
		}
		outs, err := m.Run(t.Context(), "", items)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs[:len(outs)-1] {
			if o.Error == nil || o.Error.Code != job.ItemInvalidInput || o.Response != nil {
				t.Errorf("item %s: %+v; want an invalid_input error without a response", o.ID, o)
			}
		}
		wantOK(t, outs[len(outs)-1:])
		if got := s.Stats().Requests; got != 1 {
			t.Errorf("%d requests reached the server; want 1", got)
		}
	})
}

// A body without max_tokens is sent with the ceiling, so that what admission
// reserved is what the server may generate (the canonical body of
// job.CheckRequest).
func TestMaxTokensSetToTheCeiling(t *testing.T) {
	inBubble(t, fakeoai.Config{Limits: fakeoai.RateLimits{TPM: 100000}}, Config{MaxOutputTokens: 500},
		func(t *testing.T, s *fakeoai.Server, m *Model) {
			if _, err := m.Run(t.Context(), "", []job.Item{chatItem("c", "one two three", 0)}); err != nil {
				t.Fatal(err)
			}
			// The fake charges prompt + max_tokens: 3 + (3 + 1 + 3) prompt tokens.
			if got, want := s.Stats().AdmittedTokens, int64(10+500); got != want {
				t.Errorf("the server charged %d tokens; want %d (max_tokens 500 sent)", got, want)
			}
		})
}

// Cost is KV tokens: prompt bound plus max output × n.
func TestCostCountsPromptAndOutput(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{MaxOutputTokens: 1000}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		body := `{"model":"fake-model","n":2,"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`
		msgs := `[{"role":"user","content":"hi"}]`
		want := int64(len(msgs)) + templateTokens + 2*50
		if got := m.Cost("", []job.Item{{ID: "a", Body: json.RawMessage(body)}}); got != want {
			t.Errorf("Cost = %d, want %d", got, want)
		}
		emb := embedItem("e", "four bytes")
		if got, want := m.Cost("", []job.Item{emb}), int64(len("four bytes")+sequenceTokens); got != want {
			t.Errorf("embedding Cost = %d, want %d", got, want)
		}
		if got := m.Cost("", []job.Item{{ID: "t", Text: "no body"}}); got != 0 {
			t.Errorf("Cost of an item Run refuses = %d, want 0", got)
		}
	})
}

// Token estimates start at the byte bound and tighten to what usage shows,
// with a margin, never below the highest ratio seen.
func TestEstimatesTightenFromUsage(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		text := strings.Repeat("word ", 40) // 200 bytes, 40 tokens at the fake
		item := embedItem("e", text)
		before := m.Cost("", []job.Item{item})
		for range ratioSamples {
			if _, err := m.Run(t.Context(), "", []job.Item{item}); err != nil {
				t.Fatal(err)
			}
		}
		after := m.Cost("", []job.Item{item})
		if after >= before/3 || after < 40 {
			t.Errorf("Cost %d before, %d after %d answers of 40 prompt tokens; want it tightened towards 40 and not below", before, after, ratioSamples)
		}
	})
}

// The backend's own endpoint inference follows the field each route requires.
func TestEndpointOf(t *testing.T) {
	for body, want := range map[string]endpoint{
		`{"messages":[],"prompt":"x"}`: chat, `{"prompt":"x","input":"y"}`: completions, `{"input":"y"}`: embeddings,
	} {
		var obj map[string]json.RawMessage
		_ = json.Unmarshal([]byte(body), &obj)
		if got, ok := endpointOf(obj); !ok || got != want {
			t.Errorf("endpointOf(%s) = %v, %v; want %v", body, got, ok, want)
		}
	}
	if !slices.Contains(actionNames[:], "oom") {
		t.Error("action names")
	}
}

// Run with an endpoint sends each item to the job's endpoint, not to the one its
// body's fields suggest, and refuses an item whose body lacks what that
// endpoint requires.
func TestRunEndpointUsesTheJobsEndpoint(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		// Told from its body, this would be a completion (prompt comes
		// before input).
		both := job.Item{ID: "both", Body: json.RawMessage(`{"model":"fake-model","input":"a document","prompt":"x"}`)}
		chatOnly := chatItem("chat", "hello", 4)
		if m.Cost(job.EndpointEmbeddings, []job.Item{chatOnly}) != 0 {
			t.Error("a chat body costs something as an embedding request; want 0 (refused)")
		}
		outs, err := m.Run(t.Context(), job.EndpointEmbeddings, []job.Item{both, chatOnly})
		if err != nil {
			t.Fatal(err)
		}
		if outs[0].Error != nil || outs[0].Response == nil || !strings.Contains(string(outs[0].Response.Body), `"object":"list"`) {
			t.Errorf("item both: %+v %s; want an embeddings answer", outs[0].Error, outs[0].Response.Body)
		}
		if outs[1].Error == nil || outs[1].Error.Code != job.ItemInvalidInput || outs[1].Response != nil {
			t.Errorf("item chat: %+v; want invalid_input, refused before any request", outs[1])
		}
		if got := s.Stats().Requests; got != 1 {
			t.Errorf("%d requests; want 1", got)
		}
	})
}

// A body that names no max_tokens is bounded by what its API generates
// without one: a chat request by the configured ceiling (set in the body),
// a completions request by 16, that API's default, not by the ceiling, so
// admission reserves what the server may generate and no more (docs/api.md).
func TestMaxTokensLeftOutIsBoundedByTheAPIsDefault(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{MaxOutputTokens: 1000}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		cost := func(body string) int64 { return m.Cost("", []job.Item{{ID: "a", Body: json.RawMessage(body)}}) }
		const prompt, chat = `"prompt":"hi"`, `"messages":[{"role":"user","content":"hi"}]`
		for _, tc := range []struct{ without, with string }{
			{`{"model":"fake-model",` + prompt + `}`, `{"model":"fake-model",` + prompt + `,"max_tokens":16}`},
			{`{"model":"fake-model",` + chat + `}`, `{"model":"fake-model",` + chat + `,"max_tokens":1000}`},
		} {
			if got, want := cost(tc.without), cost(tc.with); got != want || got == 0 {
				t.Errorf("Cost(%s) = %d; want %d, the Cost of %s", tc.without, got, want, tc.with)
			}
		}
	})
}

// Issue 34, item 9: the backend checks each item with the publisher's rule
// (job.CheckRequest) and sends the canonical body it checked, not the bytes
// it received. Before, "max_tokens": null was sent after the ceiling the
// backend prepended (the server read the null: no ceiling), and "MAX_TOKENS"
// reached a server that reads keys without regard to case (the fake, as
// Ollama, decodes with encoding/json), past the ceiling and the accounting.
func TestCanonicalBodyIsSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{TPM: 1_000_000}})
		defer s.Close()
		var mu sync.Mutex
		var sent []string
		capture := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				b, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(b))
				mu.Lock()
				sent = append(sent, string(b))
				mu.Unlock()
			}
			s.ServeHTTP(w, r)
		})
		m, err := Open(t.Context(), Config{BaseURL: s.URL(), HTTPClient: httpClient(handlerTransport{capture}),
			Models: []string{"fake-model"}, MaxOutputTokens: 500, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		msgs := `"messages":[{"role":"user","content":"one two three"}]`
		outs, err := m.Run(t.Context(), job.EndpointChatCompletions, []job.Item{
			{ID: "null", Body: json.RawMessage(`{"model":"fake-model","max_tokens":null,` + msgs + `}`)},
			{ID: "upper", Body: json.RawMessage(`{"model":"fake-model","MAX_TOKENS":100000,` + msgs + `}`)},
			{ID: "remote", Body: json.RawMessage(`{"model":"fake-model","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://10.0.0.1/"}}]}]}`)},
		})
		if err != nil {
			t.Fatal(err)
		}
		wantOK(t, outs[:1])
		for _, o := range outs[1:] {
			if o.Error == nil || o.Error.Code != job.ItemInvalidInput {
				t.Errorf("item %s: %+v; want invalid_input without a request", o.ID, o)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if want := `{"model":"fake-model",` + msgs + `,"max_tokens":500}`; len(sent) != 1 || sent[0] != want {
			t.Errorf("sent %q; want only %s", sent, want)
		}
		// The fake charges prompt + max_tokens: 10 + the ceiling.
		if got, want := s.Stats().AdmittedTokens, int64(10+500); got != want {
			t.Errorf("the server charged %d tokens; want %d (the ceiling, not the context)", got, want)
		}
	})
}

// best_of is counted: the server generates max(n, best_of) sequences, each
// up to max_tokens.
func TestCostCountsBestOf(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{MaxOutputTokens: 1000}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		one := m.Cost(job.EndpointCompletions, []job.Item{{ID: "a", Body: json.RawMessage(`{"model":"fake-model","prompt":"x","max_tokens":100}`)}})
		three := m.Cost(job.EndpointCompletions, []job.Item{{ID: "a", Body: json.RawMessage(`{"model":"fake-model","prompt":"x","max_tokens":100,"best_of":3}`)}})
		if three-one != 200 {
			t.Errorf("Cost %d with best_of 3, %d without; want 200 more (two more sequences of 100)", three, one)
		}
	})
}

// Embedding items share requests by their inputs, not their number: with 4
// inputs a request, items of 1, 2, 1, 3 and 1 inputs go as 1+2+1 and 3+1.
func TestEmbedRequestsBoundedByInputs(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{EmbedBatch: 4}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		var items []job.Item
		for i, n := range []int{1, 2, 1, 3, 1} {
			inputs := make([]string, n)
			for j := range inputs {
				inputs[j] = fmt.Sprintf("%q", fmt.Sprintf("item %d input %d", i, j))
			}
			body := `{"model":"fake-model","input":[` + strings.Join(inputs, ",") + `]}`
			items = append(items, job.Item{ID: fmt.Sprintf("e%d", i), Body: json.RawMessage(body)})
		}
		outs, err := m.Run(t.Context(), "", items)
		if err != nil {
			t.Fatal(err)
		}
		wantOK(t, outs)
		if got := s.Stats().Requests; got != 2 {
			t.Errorf("%d requests; want 2", got)
		}
	})
}

// A message needs a slot for each request its items make (one per chat
// item, one per EmbedBatch embedding inputs) and the rate tokens those
// requests reserve; an item refused without a request needs nothing.
func TestNeedsCountRequestsAndTheirTokens(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{EmbedBatch: 2}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		chats := []job.Item{chatItem("a", "hello", 16), chatItem("b", "there", 16)}
		embeds := embedItems(3)
		refused := job.Item{ID: "r", Body: json.RawMessage(`{"model":"not-served","messages":[]}`)}
		got := m.Needs("", append(append(slices.Clone(chats), embeds...), refused))
		if got[backend.Slots] != 2+2 {
			t.Errorf("%d slots; want 4: two chat requests, two of embeddings for three inputs", got[backend.Slots])
		}
		c, e := m.Needs("", chats), m.Needs("", embeds)
		if c[backend.RateTokens] < 2*16 || e[backend.RateTokens] <= 0 || got[backend.RateTokens] != c[backend.RateTokens]+e[backend.RateTokens] {
			t.Errorf("rate tokens %d for all, %d for the chats, %d for the embeddings; want the chats' max tokens at least, and the refused item's none",
				got[backend.RateTokens], c[backend.RateTokens], e[backend.RateTokens])
		}
	})
}
