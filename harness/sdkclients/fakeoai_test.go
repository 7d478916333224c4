package sdkclients

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// The official SDK (openai-go v3.98.0) decodes every answer of the double:
// a wrong field name or type would leave its respjson field invalid.

func oaiSDK(s *fakeoai.Server, opts ...option.RequestOption) *openai.Client {
	c := openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(s.URL() + "/v1/"),
		option.WithAPIKey("sk-test"),
		option.WithHTTPClient(s.Client()),
		option.WithMaxRetries(0),
	}, opts...)...)
	return &c
}

func TestSDKChatCompletion(t *testing.T) {
	s := startFake(t, fakeoai.Config{Models: []string{"llama"}, APIKey: "sk-test"})
	prompt := "summarise this short note [[len=7]]"
	c, err := oaiSDK(s).Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:     "llama",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage(prompt)},
		MaxTokens: openai.Int(5),
		N:         openai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]bool{"id": c.JSON.ID.Valid(), "object": c.JSON.Object.Valid(), "created": c.JSON.Created.Valid(),
		"model": c.JSON.Model.Valid(), "choices": c.JSON.Choices.Valid(), "usage": c.JSON.Usage.Valid()} {
		if !f {
			t.Errorf("field %s missing or of the wrong type in %s", name, c.RawJSON())
		}
	}
	if !strings.HasPrefix(c.ID, "chatcmpl-") || c.Model != "llama" || c.Created == 0 {
		t.Errorf("id %q, model %q, created %d", c.ID, c.Model, c.Created)
	}
	wantPrompt := fakeoai.ChatPromptTokens([]fakeoai.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: prompt}})
	got := []int64{c.Usage.PromptTokens, c.Usage.CompletionTokens, c.Usage.TotalTokens}
	if diff := cmp.Diff([]int64{int64(wantPrompt), 10, int64(wantPrompt) + 10}, got); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
	if len(c.Choices) != 2 {
		t.Fatalf("%d choices, want n=2", len(c.Choices))
	}
	for i, ch := range c.Choices {
		// The prompt asks for 7 tokens; max_tokens 5 cuts it.
		if ch.Index != int64(i) || ch.FinishReason != "length" || ch.Message.Role != "assistant" || fakeoai.CountTokens(ch.Message.Content) != 5 {
			t.Errorf("choice %d: index %d, finish %q, role %q, content %q", i, ch.Index, ch.FinishReason, ch.Message.Role, ch.Message.Content)
		}
	}

	c, err = oaiSDK(s).Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "llama", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxCompletionTokens: openai.Int(100),
	})
	if err != nil {
		t.Fatal(err)
	}
	if ch := c.Choices[0]; ch.FinishReason != "stop" || c.Usage.CompletionTokens != 7 || fakeoai.CountTokens(ch.Message.Content) != 7 {
		t.Errorf("uncut choice: finish %q, %d completion tokens, content %q", ch.FinishReason, c.Usage.CompletionTokens, ch.Message.Content)
	}
}

func TestSDKCompletion(t *testing.T) {
	s := startFake(t, fakeoai.Config{})
	c, err := oaiSDK(s).Completions.New(context.Background(), openai.CompletionNewParams{
		Model:     "fake-model",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"one two three", "four five"}},
		MaxTokens: openai.Int(3),
		N:         openai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !c.JSON.Object.Valid() || !strings.HasPrefix(c.ID, "cmpl-") || c.Model != "fake-model" {
		t.Errorf("object %q, id %q, model %q", c.Object, c.ID, c.Model)
	}
	// Two prompts × n=2: four choices, indexed prompt-major as OpenAI does.
	if len(c.Choices) != 4 || c.Usage.PromptTokens != 5 || c.Usage.CompletionTokens != 12 || c.Usage.TotalTokens != 17 {
		t.Fatalf("%d choices, usage %+v", len(c.Choices), c.Usage)
	}
	for i, ch := range c.Choices {
		if ch.Index != int64(i) || ch.FinishReason != "length" || fakeoai.CountTokens(ch.Text) != 3 {
			t.Errorf("choice %d: index %d, finish %q, text %q", i, ch.Index, ch.FinishReason, ch.Text)
		}
	}
	if c.Choices[0].Text == c.Choices[2].Text {
		t.Errorf("both prompts answered %q", c.Choices[0].Text)
	}
}

func TestSDKEmbeddings(t *testing.T) {
	s := startFake(t, fakeoai.Config{EmbedDim: 8})
	in := []string{"first text here", "second"}
	for _, format := range []openai.EmbeddingNewParamsEncodingFormat{"", openai.EmbeddingNewParamsEncodingFormatBase64} {
		e, err := oaiSDK(s).Embeddings.New(context.Background(), openai.EmbeddingNewParams{
			Model: "fake-model", Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: in}, EncodingFormat: format,
		})
		if err != nil {
			t.Fatal(err)
		}
		if e.Object != "list" || !e.JSON.Data.Valid() || e.Model != "fake-model" || e.Usage.PromptTokens != 4 || e.Usage.TotalTokens != 4 {
			t.Errorf("format %q: object %q, model %q, usage %+v", format, e.Object, e.Model, e.Usage)
		}
		if len(e.Data) != 2 {
			t.Fatalf("format %q: %d embeddings", format, len(e.Data))
		}
		for i, d := range e.Data {
			if d.Index != int64(i) || d.Object != "embedding" {
				t.Errorf("format %q: data[%d] index %d object %q", format, i, d.Index, d.Object)
			}
			if diff := cmp.Diff(fakeoai.Embed(in[i], 8), d.Embedding); diff != "" {
				t.Errorf("format %q: data[%d] (-want +got):\n%s", format, i, diff)
			}
		}
	}

	// One string, and the dimensions a request asks for.
	e, err := oaiSDK(s).Embeddings.New(context.Background(), openai.EmbeddingNewParams{
		Model: "fake-model", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("solo")}, Dimensions: openai.Int(3),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Data) != 1 || len(e.Data[0].Embedding) != 3 {
		t.Errorf("one input, 3 dimensions: %+v", e.Data)
	}
}

func TestSDKModelsAndAuth(t *testing.T) {
	s := startFake(t, fakeoai.Config{Models: []string{"a", "b"}, APIKey: "sk-test"})
	page, err := oaiSDK(s).Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if diff := cmp.Diff([]string{"a", "b"}, ids); diff != "" {
		t.Errorf("models (-want +got):\n%s", diff)
	}

	_, err = oaiSDK(s, option.WithAPIKey("sk-wrong")).Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "a", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	wantOpenAIError(t, err, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key")

	_, err = oaiSDK(s).Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "gpt-unknown", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	wantOpenAIError(t, err, http.StatusNotFound, "invalid_request_error", "model_not_found")
}

// The SDK reads a 429's code and the rate-limit headers of every answer.
func TestSDKRateLimitError(t *testing.T) {
	s := startFake(t, fakeoai.Config{Limits: fakeoai.RateLimits{RPM: 60, TPM: 100}})
	var res *http.Response
	params := openai.ChatCompletionNewParams{Model: "fake-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}, MaxTokens: openai.Int(40)}
	// hello costs ChatPromptTokens = 3+3+1+1 = 8, plus 40: 48 of 100.
	if _, err := oaiSDK(s).Chat.Completions.New(context.Background(), params, option.WithResponseInto(&res)); err != nil {
		t.Fatal(err)
	}
	if got := res.Header.Get("x-ratelimit-limit-tokens"); got != "100" {
		t.Errorf("x-ratelimit-limit-tokens %q", got)
	}
	if got := res.Header.Get("x-ratelimit-limit-requests"); got != "60" {
		t.Errorf("x-ratelimit-limit-requests %q", got)
	}
	if rem, _ := strconv.Atoi(res.Header.Get("x-ratelimit-remaining-tokens")); rem < 52 || rem > 53 {
		t.Errorf("x-ratelimit-remaining-tokens %q, want 52 (53 if refilled)", res.Header.Get("x-ratelimit-remaining-tokens"))
	}
	if _, err := oaiSDK(s).Chat.Completions.New(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	_, err := oaiSDK(s).Chat.Completions.New(context.Background(), params, option.WithResponseInto(&res))
	apiErr := wantOpenAIError(t, err, http.StatusTooManyRequests, "tokens", "rate_limit_exceeded")
	if apiErr != nil && !strings.Contains(apiErr.Message, "Rate limit reached for fake-model") {
		t.Errorf("message %q", apiErr.Message)
	}
	for _, h := range []string{"retry-after-ms", "Retry-After", "x-ratelimit-reset-tokens", "x-ratelimit-remaining-requests"} {
		if res.Header.Get(h) == "" {
			t.Errorf("429 without %s", h)
		}
	}

	s.SetQuotaExhausted(true)
	_, err = oaiSDK(s).Chat.Completions.New(context.Background(), params)
	wantOpenAIError(t, err, http.StatusTooManyRequests, "insufficient_quota", "insufficient_quota")
}

func wantOpenAIError(t *testing.T, err error, status int, typ, code string) *openai.Error {
	t.Helper()
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Errorf("err %v: want an *openai.Error", err)
		return nil
	}
	if apiErr.StatusCode != status || apiErr.Type != typ || apiErr.Code != code {
		t.Errorf("status %d, type %q, code %q; want %d, %q, %q (%s)", apiErr.StatusCode, apiErr.Type, apiErr.Code, status, typ, code, apiErr.RawJSON())
	}
	return apiErr
}

// The SDK sees the injected 5xx as API errors with their status, and reads
// a retry hint when a fault has one.
func TestStatusFaultsSDK(t *testing.T) {
	s := startFake(t, fakeoai.Config{})
	msg := "CUDA out of memory. Tried to allocate 2.00 GiB"
	if err := s.SetFaults(fakeoai.Fault{Kind: fakeoai.FaultStatus, Status: 500, Message: msg, RetryAfter: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var res *http.Response
	_, err := oaiSDK(s).Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "fake-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	apiErr := wantOpenAIError(t, err, 500, "server_error", "")
	if apiErr != nil {
		res = apiErr.Response
		if apiErr.Message != msg || res.Header.Get("retry-after-ms") != "3000" || res.Header.Get("Retry-After") != "3" {
			t.Errorf("message %q, retry-after-ms %q", apiErr.Message, res.Header.Get("retry-after-ms"))
		}
	}
	if err := s.SetFaults(fakeoai.Fault{Kind: fakeoai.FaultStatus, Status: 529}); err != nil {
		t.Fatal(err)
	}
	_, err = oaiSDK(s).Embeddings.New(context.Background(), openai.EmbeddingNewParams{
		Model: "fake-model", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
	wantOpenAIError(t, err, 529, "overloaded_error", "")
}

// With ContextLengthStatus 400, prompt + max_tokens past max model len is
// OpenAI's 400 context_length_exceeded as the SDK reads it (the default,
// TGI's 422, is internal/testenv/fakeoai's TestContextLength).
func TestContextLengthSDK(t *testing.T) {
	s := startFake(t, fakeoai.Config{MaxModelLen: 32, ContextLengthStatus: http.StatusBadRequest})
	_, err := oaiSDK(s).Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "fake-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(30)})
	if e := wantOpenAIError(t, err, http.StatusBadRequest, "invalid_request_error", "context_length_exceeded"); e != nil &&
		!strings.HasPrefix(e.Message, "This model's maximum context length is 32 tokens. However, you requested 38 tokens") {
		t.Errorf("message %q", e.Message)
	}
	if st := s.Stats(); st.ContextLength != 1 || st.Admitted != 0 {
		t.Errorf("context length %d, admitted %d", st.ContextLength, st.Admitted)
	}
}

// startFake serves a double with cfg until the test ends.
func startFake(t *testing.T, cfg fakeoai.Config) *fakeoai.Server {
	t.Helper()
	s := fakeoai.New(cfg)
	t.Cleanup(s.Close)
	return s
}
