package modelserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Anthropic's Messages API (job.EndpointMessages), the requests of the
// publisher's Message Batches. vLLM, SGLang and llama.cpp serve it at
// /v1/messages, and a request goes there as it is (Config.Messages
// MessagesNative). Other servers (TGI, Ollama, OpenAI) have only
// /v1/chat/completions: the request is translated to a chat completion and
// the answer back to an Anthropic Message (MessagesChat, the default).
//
// The shapes are Anthropic's API reference ("Create a Message",
// https://docs.anthropic.com/en/api/messages) and OpenAI's
// (CreateChatCompletionRequest, CreateChatCompletionResponse). The
// translation carries model, max_tokens, system (a string, or text
// blocks, joined by blank lines into one system message), messages (text
// blocks, and image blocks whose source is base64 or a URL, as image_url
// parts), stop_sequences (as stop), temperature, top_p, and
// metadata.user_id (as user); it drops cache_control and citations, which
// change no answer. Anything else (tools, tool_choice, thinking, top_k,
// documents, tool_use and tool_result blocks, images in an assistant's
// message) it cannot carry: such a request is refused as the item's own
// error (invalid_input), never sent without what it asked for. Back, the
// answer's first choice becomes the Message's one text block; finish_reason
// stop is stop_reason end_turn, or stop_sequence with the sequence when the
// server names which one matched (vLLM's choice.stop_reason), length is
// max_tokens, content_filter is refusal; usage's prompt_tokens and
// completion_tokens are input_tokens and output_tokens.

// How a Messages request reaches the server (Config.Messages).
const (
	MessagesChat   = "chat"   // translated to /v1/chat/completions and back
	MessagesNative = "native" // sent to the server's own /v1/messages
)

// anthropicVersion is the anthropic-version header sent with a native
// request: the version whose shapes this file reads.
const anthropicVersion = "2023-06-01"

// carried are the keys of a Messages body the translation carries.
var carried = []string{"model", "max_tokens", "system", "messages", "stop_sequences", "temperature", "top_p", "metadata", "stream"}

type chatMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"` // a string, or parts
}

type chatPart struct {
	Type     string    `json:"type"`
	Text     *string   `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL string `json:"url"`
}

// anthropicBlock is a content block of Anthropic's, as far as the
// translation reads it.
type anthropicBlock struct {
	Type   string `json:"type"`
	Text   string `json:"text"`
	Source *struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
}

// toChat translates body, a Messages request the rule accepted, to a chat
// completions request, and returns it with the request's stop sequences;
// the error says what it cannot carry.
func toChat(body []byte) ([]byte, []string, error) {
	var in map[string]json.RawMessage
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, nil, fmt.Errorf("the body is not a JSON object")
	}
	var extra []string
	for k := range in {
		if !slices.Contains(carried, k) {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		return nil, nil, fmt.Errorf("the translation to /v1/chat/completions cannot carry %s: send it to a server with /v1/messages "+
			"(-model-server-messages native)", strings.Join(extra, ", "))
	}
	out := map[string]any{"model": in["model"], "max_tokens": in["max_tokens"]}
	for _, k := range []string{"temperature", "top_p", "stream"} {
		if v, ok := in[k]; ok {
			out[k] = v
		}
	}
	var stops []string
	if v, ok := in["stop_sequences"]; ok && string(v) != "null" {
		if json.Unmarshal(v, &stops) != nil {
			return nil, nil, fmt.Errorf("stop_sequences is not an array of strings")
		}
		out["stop"] = stops
	}
	if v, ok := in["metadata"]; ok && string(v) != "null" {
		var md struct {
			UserID string `json:"user_id"`
		}
		if json.Unmarshal(v, &md) != nil {
			return nil, nil, fmt.Errorf("metadata is not an object")
		}
		if md.UserID != "" {
			out["user"] = md.UserID
		}
	}
	var msgs []chatMessage
	if v, ok := in["system"]; ok && string(v) != "null" {
		text, err := systemText(v)
		if err != nil {
			return nil, nil, err
		}
		msgs = append(msgs, chatMessage{Role: "system", Content: text})
	}
	var raw []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(in["messages"], &raw); err != nil {
		return nil, nil, fmt.Errorf("messages is not an array of messages")
	}
	for i, m := range raw {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, nil, fmt.Errorf("messages[%d].role must be user or assistant", i)
		}
		c, err := chatContent(m.Role, m.Content)
		if err != nil {
			return nil, nil, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		msgs = append(msgs, chatMessage{Role: m.Role, Content: c})
	}
	out["messages"] = msgs
	b, err := json.Marshal(out)
	return b, stops, err
}

// systemText is a system prompt's text: a string, or text blocks joined by
// blank lines.
func systemText(v json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s, nil
	}
	var blocks []anthropicBlock
	if json.Unmarshal(v, &blocks) != nil {
		return "", fmt.Errorf("system must be a string or an array of text blocks")
	}
	texts := make([]string, len(blocks))
	for i, b := range blocks {
		if b.Type != "text" {
			return "", fmt.Errorf("the translation to /v1/chat/completions carries only text blocks in system, not %q", b.Type)
		}
		texts[i] = b.Text
	}
	return strings.Join(texts, "\n\n"), nil
}

// chatContent is a message's content as chat's: a string as it is; blocks
// as parts, text and images (a user's), or one string (an assistant's,
// whose content chat takes as text only).
func chatContent(role string, v json.RawMessage) (any, error) {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s, nil
	}
	var blocks []anthropicBlock
	if json.Unmarshal(v, &blocks) != nil {
		return nil, fmt.Errorf("must be a string or an array of content blocks")
	}
	parts := make([]chatPart, 0, len(blocks))
	var texts []string
	for _, b := range blocks {
		switch {
		case b.Type == "text":
			t := b.Text
			parts = append(parts, chatPart{Type: "text", Text: &t})
			texts = append(texts, t)
		case b.Type == "image" && role == "user" && b.Source != nil && b.Source.Type == "base64":
			parts = append(parts, chatPart{Type: "image_url", ImageURL: &imageURL{URL: "data:" + b.Source.MediaType + ";base64," + b.Source.Data}})
		case b.Type == "image" && role == "user" && b.Source != nil && b.Source.Type == "url":
			parts = append(parts, chatPart{Type: "image_url", ImageURL: &imageURL{URL: b.Source.URL}})
		default:
			return nil, fmt.Errorf("the translation to /v1/chat/completions cannot carry a %s block in a %s message: send it to a server "+
				"with /v1/messages (-model-server-messages native)", clip(b.Type, 40), role)
		}
	}
	if role == "assistant" {
		return strings.Join(texts, ""), nil
	}
	return parts, nil
}

// anthropicMessage is Anthropic's Message, as the translation answers it.
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
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// fromChat translates a chat completion (a 2xx body that has choices) to
// Anthropic's Message; stops are the request's stop sequences. A body it
// cannot read is returned as it is: the item's answer is the server's.
func fromChat(body []byte, stops []string) []byte {
	var cc struct {
		ID      string `json:"id"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Content *string `json:"content"`
			} `json:"message"`
			FinishReason string          `json:"finish_reason"`
			StopReason   json.RawMessage `json:"stop_reason"` // vLLM's: the stop string that matched, or a token id
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if json.Unmarshal(body, &cc) != nil || len(cc.Choices) == 0 {
		return body
	}
	ch := cc.Choices[0]
	m := anthropicMessage{ID: "msg_" + strings.TrimPrefix(cc.ID, "chatcmpl-"), Type: "message", Role: "assistant", Model: cc.Model,
		Content: []anthropicText{}, StopReason: "end_turn",
		Usage: anthropicUsage{InputTokens: cc.Usage.PromptTokens, OutputTokens: cc.Usage.CompletionTokens}}
	if ch.Message.Content != nil && *ch.Message.Content != "" {
		m.Content = append(m.Content, anthropicText{Type: "text", Text: *ch.Message.Content})
	}
	switch ch.FinishReason {
	case "length":
		m.StopReason = "max_tokens"
	case "content_filter":
		m.StopReason = "refusal"
	case "stop":
		var s string
		if json.Unmarshal(ch.StopReason, &s) == nil && slices.Contains(stops, s) {
			m.StopReason, m.StopSequence = "stop_sequence", &s
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(m) != nil {
		return body
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}
