package fakeoai

import (
	"encoding/json"
	"fmt"
	"strings"
)

// POST /v1/responses and POST /v1/moderations, in the shapes of OpenAI's API
// reference, read through the search tool: "Create a model response"
// (https://platform.openai.com/docs/api-reference/responses/create) takes
// model, input (a string, or an array of items: messages whose content is
// a string or parts of type input_text), instructions, max_output_tokens,
// stream, and answers a Response {id "resp_…", object "response",
// created_at, status completed | incomplete, incomplete_details {reason
// "max_output_tokens"} or null, error null, model, output [{type
// "message", id "msg_…", status, role "assistant", content [{type
// "output_text", text, annotations []}]}], usage {input_tokens,
// input_tokens_details {cached_tokens}, output_tokens,
// output_tokens_details {reasoning_tokens}, total_tokens}}; vLLM serves the
// route ("Online Serving", https://docs.vllm.ai/en/stable/serving/online_serving.html,
// lists /v1/responses and no /v1/moderations). "Create moderation"
// (.../moderations/create) takes input (a string, an array of strings, or
// an array of parts of type text or image_url) and model, and answers
// {id "modr-…", model, results [{flagged, categories, category_scores,
// category_applied_input_types}]}: a
// result per string of an array of strings, one for an array of parts. The
// double flags a text that holds "attack" as violence, and nothing else;
// its scores are 0.9 for a flagged category and 0.001 otherwise.

type responsesRequest struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    string          `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
}

type response struct {
	ID                string           `json:"id"`
	Object            string           `json:"object"`
	CreatedAt         int64            `json:"created_at"`
	Status            string           `json:"status"`
	IncompleteDetails *incomplete      `json:"incomplete_details"`
	Error             *json.RawMessage `json:"error"`
	Model             string           `json:"model"`
	Output            []responseOutput `json:"output"`
	Usage             responseUsage    `json:"usage"`
}

type incomplete struct {
	Reason string `json:"reason"`
}

type responseOutput struct {
	Type    string        `json:"type"`
	ID      string        `json:"id"`
	Status  string        `json:"status"`
	Role    string        `json:"role"`
	Content []outputTextP `json:"content"`
}

type outputTextP struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type responseUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

// parseResponses reads a Responses request into wk: instructions as a
// system message, then the input's messages.
func parseResponses(wk *work, body []byte) (*int, bool, *badRequest) {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, false, invalid("", "Invalid request body: %v", err)
	}
	var msgs []Message
	if req.Instructions != "" {
		msgs = append(msgs, Message{Role: "system", Content: req.Instructions})
	}
	var s string
	var items []chatMessage
	switch {
	case json.Unmarshal(req.Input, &s) == nil:
		msgs = append(msgs, Message{Role: "user", Content: s})
	case json.Unmarshal(req.Input, &items) == nil && len(items) > 0:
		for i, m := range items {
			text, err := partsText(m.Content, "input_text", "output_text")
			if err != nil {
				return nil, false, invalid(fmt.Sprintf("input[%d].content", i), "Invalid 'input[%d].content': %v.", i, err)
			}
			msgs = append(msgs, Message{Role: m.Role, Content: text})
		}
	default:
		return nil, false, &badRequest{status: 400, msg: "Missing required parameter: 'input'.", param: "input", code: "missing_required_parameter"}
	}
	texts := make([]string, len(msgs))
	for i, m := range msgs {
		texts[i] = m.Content
	}
	wk.model = req.Model
	wk.prompt = ChatPromptTokens(msgs)
	wk.inputs = []input{{text: strings.Join(texts, "\n"), tokens: wk.prompt}}
	return req.MaxOutputTokens, req.Stream, nil
}

// renderResponse is the 200 answer of /v1/responses: the first sequence's
// text, incomplete where max_output_tokens cut it.
func renderResponse(wk *work, g *group, id uint64, created int64, completionTokens int) response {
	j := g.jobs[0]
	r := response{ID: fmt.Sprintf("resp_fakeoai%012d", id), Object: "response", CreatedAt: created, Status: "completed", Model: wk.model,
		Usage: responseUsage{InputTokens: wk.prompt, InputTokensDetails: map[string]int{"cached_tokens": 0}, OutputTokens: completionTokens,
			OutputTokensDetails: map[string]int{"reasoning_tokens": 0}, TotalTokens: wk.prompt + completionTokens}}
	status := "completed"
	if j.finishReason() == "length" {
		r.Status, status, r.IncompleteDetails = "incomplete", "incomplete", &incomplete{Reason: "max_output_tokens"}
	}
	r.Output = []responseOutput{{Type: "message", ID: fmt.Sprintf("msg_fakeoai%012d", id), Status: status, Role: "assistant",
		Content: []outputTextP{{Type: "output_text", Text: outputText(wk.inputs[0].text, 0, j.length), Annotations: []any{}}}}}
	return r
}

type moderationRequest struct {
	Model string          `json:"model"`
	Input json.RawMessage `json:"input"`
}

type moderation struct {
	ID      string             `json:"id"`
	Model   string             `json:"model"`
	Results []moderationResult `json:"results"`
}

type moderationResult struct {
	Flagged        bool               `json:"flagged"`
	Categories     map[string]bool    `json:"categories"`
	CategoryScores map[string]float64 `json:"category_scores"`
	// AppliedTo is every category's ["text"]: the double reads no image.
	AppliedTo map[string][]string `json:"category_applied_input_types"`
}

// moderationCategories are those of omni-moderation-latest.
var moderationCategories = []string{"harassment", "harassment/threatening", "hate", "hate/threatening", "illicit", "illicit/violent",
	"self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "sexual/minors", "violence", "violence/graphic"}

// parseModerations reads a moderation request into wk: an input per
// result.
func parseModerations(wk *work, body []byte) *badRequest {
	var req moderationRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return invalid("", "Invalid request body: %v", err)
	}
	var s string
	var ss []string
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	var texts []string
	switch {
	case json.Unmarshal(req.Input, &s) == nil:
		texts = []string{s}
	case json.Unmarshal(req.Input, &ss) == nil && len(ss) > 0:
		texts = ss
	case json.Unmarshal(req.Input, &parts) == nil && len(parts) > 0:
		var all []string
		for _, p := range parts {
			all = append(all, p.Text)
		}
		texts = []string{strings.Join(all, "\n")}
	default:
		return &badRequest{status: 400, msg: "Missing required parameter: 'input'.", param: "input", code: "missing_required_parameter"}
	}
	wk.model = req.Model
	for _, t := range texts {
		n := CountTokens(t)
		wk.inputs = append(wk.inputs, input{text: t, tokens: n})
		wk.prompt += n
	}
	return nil
}

// renderModeration is the 200 answer of /v1/moderations.
func renderModeration(wk *work, id uint64) moderation {
	m := moderation{ID: fmt.Sprintf("modr-fakeoai%012d", id), Model: wk.model}
	for _, in := range wk.inputs {
		r := moderationResult{Categories: map[string]bool{}, CategoryScores: map[string]float64{}, AppliedTo: map[string][]string{}}
		for _, c := range moderationCategories {
			r.AppliedTo[c] = []string{"text"}
			flagged := c == "violence" && strings.Contains(in.text, "attack")
			r.Categories[c], r.CategoryScores[c] = flagged, 0.001
			if flagged {
				r.Flagged, r.CategoryScores[c] = true, 0.9
			}
		}
		m.Results = append(m.Results, r)
	}
	return m
}
