package fakeoai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Requests, as much of them as the double reads.

type chatRequest struct {
	Model               string        `json:"model"`
	Messages            []chatMessage `json:"messages"`
	MaxTokens           *int          `json:"max_tokens"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	N                   *int          `json:"n"`
	Stream              bool          `json:"stream"`
	Priority            int           `json:"priority"` // vLLM's
}

type chatMessage struct {
	Role    string          `json:"role"`
	Name    string          `json:"name"`
	Content json.RawMessage `json:"content"`
}

type completionRequest struct {
	Model     string          `json:"model"`
	Prompt    json.RawMessage `json:"prompt"`
	MaxTokens *int            `json:"max_tokens"`
	N         *int            `json:"n"`
	BestOf    *int            `json:"best_of"`
	Stream    bool            `json:"stream"`
	Priority  int             `json:"priority"` // vLLM's
}

type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	Dimensions     *int            `json:"dimensions"`
	EncodingFormat string          `json:"encoding_format"`
}

// Answers, in OpenAI's wire format.

type usage struct {
	PromptTokens     int  `json:"prompt_tokens"`
	CompletionTokens *int `json:"completion_tokens,omitempty"` // absent in embeddings
	TotalTokens      int  `json:"total_tokens"`
}

type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	Usage             usage        `json:"usage"`
	ServiceTier       string       `json:"service_tier"`
	SystemFingerprint string       `json:"system_fingerprint"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      assistantOutput `json:"message"`
	Logprobs     *struct{}       `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

type assistantOutput struct {
	Role    string  `json:"role"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal"`
}

type completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []completionChoice `json:"choices"`
	Usage             usage              `json:"usage"`
	SystemFingerprint string             `json:"system_fingerprint"`
}

type completionChoice struct {
	Text         string    `json:"text"`
	Index        int       `json:"index"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason string    `json:"finish_reason"`
}

type embeddingList struct {
	Object string          `json:"object"`
	Data   []embeddingData `json:"data"`
	Model  string          `json:"model"`
	Usage  usage           `json:"usage"`
}

type embeddingData struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float64, or a base64 string of float32s
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// Error bodies.

type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// writeOpenAI answers {"error":{message,type,param,code}}, OpenAI's shape;
// empty param and code are null.
func writeOpenAI(w http.ResponseWriter, status int, msg, typ, param, code string) {
	e := openAIError{Message: msg, Type: typ}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	writeJSON(w, status, map[string]openAIError{"error": e})
}

// writeTGI answers TGI's ErrorResponse {"error": msg, "error_type": typ}.
func writeTGI(w http.ResponseWriter, status int, msg, typ string) {
	writeJSON(w, status, map[string]string{"error": msg, "error_type": typ})
}

// writeTEIOpenAI answers TEI's OpenAICompatErrorResponse on its /v1 routes.
func writeTEIOpenAI(w http.ResponseWriter, status int, msg, typ string) {
	writeJSON(w, status, struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
		Type    string `json:"type"`
	}{msg, status, typ})
}

func writePlain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprint(w, msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b := marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// Decoding the polymorphic fields.

// messageText reads a chat message's content: a string, an array of parts
// (the text ones count), or null.
func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or an array of content parts")
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// textInputs reads a prompt or an input: a string, an array of strings, an
// array of token ids or an array of arrays of them. Each is returned as text
// with its token count (a token array as its decimal join).
func textInputs(raw json.RawMessage) ([]input, error) {
	raw = bytes.TrimSpace(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []input{{text: s, tokens: CountTokens(s)}}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) > 0 {
		in := make([]input, len(ss))
		for i, s := range ss {
			in[i] = input{text: s, tokens: CountTokens(s)}
		}
		return in, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		return []input{tokenInput(ids)}, nil
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil && len(idss) > 0 {
		in := make([]input, len(idss))
		for i, ids := range idss {
			in[i] = tokenInput(ids)
		}
		return in, nil
	}
	return nil, errors.New("must be a string, an array of strings, or an array of token arrays, and not empty")
}

func tokenInput(ids []int64) input {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatInt(id, 10)
	}
	return input{text: strings.Join(parts, " "), tokens: len(ids)}
}

// marshal encodes v as the servers do, without escaping <, > and & (serde
// and Python's json do not).
func marshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err) // only the double's own types come here
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// heldAnswer records an answer made under the server's lock, to be written
// once it is released.
type heldAnswer struct {
	header http.Header
	status int
	body   []byte
}

func (h *heldAnswer) Header() http.Header { return h.header }
func (h *heldAnswer) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
}
func (h *heldAnswer) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	h.body = append(h.body, b...)
	return len(b), nil
}

func (h *heldAnswer) replay(w http.ResponseWriter) {
	for k, v := range h.header {
		w.Header()[k] = v
	}
	w.WriteHeader(h.status)
	w.Write(h.body)
}
