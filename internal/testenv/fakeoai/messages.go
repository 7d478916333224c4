package fakeoai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// POST /v1/messages is Anthropic's Messages API, as vLLM, SGLang and
// llama.cpp serve it beside OpenAI's routes. Its shapes are Anthropic's API
// reference, read through the search tool: "Create a Message"
// (https://docs.anthropic.com/en/api/messages): model, max_tokens (required,
// at least 1), messages (content a string or an array of blocks), system (a
// string or text blocks), stop_sequences, stream; the answer a Message
// {id "msg_…", type "message", role "assistant", model, content [{type
// "text", text}], stop_reason end_turn | max_tokens | stop_sequence,
// stop_sequence, usage {input_tokens, output_tokens}}; and "Errors"
// (https://docs.anthropic.com/en/api/errors): {"type": "error", "error":
// {"type": "invalid_request_error" | "not_found_error" | …, "message"}}. The
// request runs on the same scheduler as a chat completion; the rate
// limiter's and the scheduler's refusals keep the shapes of the provider
// the double is configured as (RateLimits.Kind), as on every route.

type messagesRequest struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	Messages      []chatMessage   `json:"messages"`
	System        json.RawMessage `json:"system"`
	StopSequences []string        `json:"stop_sequences"`
	Stream        bool            `json:"stream"`
}

type anthropicMessage struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []anthropicText `json:"content"`
	StopReason   string          `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        anthropicUsage  `json:"usage"`
}

type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// writeAnthropic answers Anthropic's error shape.
func writeAnthropic(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

// anthropicType is the error type Anthropic's "Errors" page gives status.
func anthropicType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// parseMessages reads a Messages request into wk.
func parseMessages(wk *work, body []byte) (*int, bool, *badRequest) {
	bad := func(format string, a ...any) *badRequest {
		return &badRequest{status: http.StatusBadRequest, format: "anthropic", msg: fmt.Sprintf(format, a...)}
	}
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, false, bad("Invalid request body: %v", err)
	}
	if req.MaxTokens == nil {
		return nil, false, bad("max_tokens: Field required")
	}
	if len(req.Messages) == 0 {
		return nil, false, bad("messages: at least one message is required")
	}
	msgs := make([]Message, 0, len(req.Messages)+1)
	if len(req.System) > 0 && string(req.System) != "null" {
		text, err := messageText(req.System)
		if err != nil {
			return nil, false, bad("system: %v", err)
		}
		msgs = append(msgs, Message{Role: "system", Content: text})
	}
	texts := make([]string, 0, len(req.Messages))
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, false, bad("messages.%d.role: Input should be 'user' or 'assistant'", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, false, bad("messages.%d.content: %v", i, err)
		}
		msgs = append(msgs, Message{Role: m.Role, Content: text})
		texts = append(texts, text)
	}
	wk.model = req.Model
	wk.stops = req.StopSequences
	wk.prompt = ChatPromptTokens(msgs)
	wk.inputs = []input{{text: strings.Join(texts, "\n"), tokens: wk.prompt}}
	return req.MaxTokens, req.Stream, nil
}

// renderMessage is the 200 answer of /v1/messages: the first sequence's
// text. A stop sequence that the text would have held ends it there.
func renderMessage(wk *work, g *group, id uint64, completionTokens int) anthropicMessage {
	j := g.jobs[0]
	m := anthropicMessage{ID: fmt.Sprintf("msg_fakeoai%012d", id), Type: "message", Role: "assistant", Model: wk.model,
		StopReason: "end_turn", Usage: anthropicUsage{InputTokens: wk.prompt, OutputTokens: completionTokens}}
	text := outputText(wk.inputs[0].text, 0, j.length)
	for _, s := range wk.stops {
		if i := strings.Index(text, s); s != "" && i >= 0 {
			text, m.StopReason, m.StopSequence = text[:i], "stop_sequence", &s
			break
		}
	}
	if m.StopSequence == nil && j.finishReason() == "length" {
		m.StopReason = "max_tokens"
	}
	m.Content = []anthropicText{{Type: "text", Text: text}}
	return m
}
