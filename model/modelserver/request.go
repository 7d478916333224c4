package modelserver

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/vramq/vramq/job"
)

// endpoint is one of the OpenAI-compatible routes an item's body is for.
type endpoint int

const (
	chat endpoint = iota
	completions
	embeddings
	messages // Anthropic's (messages.go)
)

func (e endpoint) path() string {
	return [...]string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/messages"}[e]
}

// request is one item's request, parsed and checked.
type request struct {
	idx   int // the item's index in Run's items
	id    string
	ep    endpoint
	model string
	body  []byte // as sent: the canonical body job.CheckRequest returned
	// maxOut × choices is the most tokens the answer may generate:
	// max_tokens times n (times the prompts of a completions array).
	maxOut, choices int64
	prompt          estimate

	// Embeddings only: the inputs, each as its JSON, with their estimates,
	// and what a request must share to carry them with other items'.
	inputs   []json.RawMessage
	inputEst []estimate
	key      string

	// Messages only, translated (messages.go): the chat completions
	// request sent instead, and the stop sequences to name in the answer.
	chat  []byte
	stops []string
}

// kind names the requests whose token ratio is learned together.
func (r *request) kind() string { return r.ep.path() + " " + r.model }

// refuse is an item the subscriber refuses itself, before any request.
func refuse(format string, a ...any) *job.ItemError {
	return job.NewItemError(job.ItemInvalidInput, fmt.Sprintf(format, a...))
}

// endpointOf tells an item's endpoint from its body, for Run and Cost,
// which see items only: it reads the field each endpoint requires:
// messages (chat), prompt (completions), input (embeddings), in that order.
// The subscriber calls RunEndpoint and CostEndpoint with the job's
// endpoint (job.Work.Endpoint) instead, so a chat body that also carries
// an input field is still a chat request there.
func endpointOf(obj map[string]json.RawMessage) (endpoint, bool) {
	for _, c := range []struct {
		field string
		ep    endpoint
	}{{"messages", chat}, {"prompt", completions}, {"input", embeddings}} {
		if _, ok := obj[c.field]; ok {
			return c.ep, true
		}
	}
	return 0, false
}

// endpointNamed is the endpoint of a job's path (job.Endpoints).
func endpointNamed(path string) (endpoint, bool) {
	for _, e := range []endpoint{chat, completions, embeddings, messages} {
		if e.path() == path {
			return e, true
		}
	}
	return 0, false
}

// parse checks an item's body with the rule the publisher applies
// (job.CheckRequest: the queue is not trusted) and prepares what is sent,
// the canonical body the rule returns. path is the job's endpoint; "" tells
// it from the body.
func (m *Model) parse(path string, it job.Item) (*request, *job.ItemError) {
	if len(it.Body) == 0 {
		return nil, refuse("the item has no request body: this subscriber sends requests to a model server (%s)", m.dev.name)
	}
	ep, ok := endpointNamed(path)
	if path == "" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(it.Body, &obj); err != nil || obj == nil {
			return nil, refuse("the body is not a JSON object")
		}
		if ep, ok = endpointOf(obj); !ok {
			return nil, refuse("the body has none of messages, prompt or input")
		}
	} else if !ok {
		return nil, refuse("endpoint %q is not one this subscriber serves", path)
	}
	q, err := job.CheckRequest(ep.path(), it.Body, m.limits)
	if err != nil {
		return nil, refuse("%v", err)
	}
	r := &request{id: it.ID, ep: ep, model: q.Model, body: q.Body, maxOut: q.MaxOut, choices: q.Sequences()}
	switch ep {
	case embeddings:
		return r, m.parseEmbeddings(r, q.Input)
	case chat:
		r.prompt = estimate{bound: int64(len(q.Messages)) + templateTokens}
		return r, nil
	case messages:
		// The system prompt is outside messages: the whole body bounds both.
		r.prompt = estimate{bound: int64(len(q.Body)) + templateTokens}
		if m.cfg.Messages == MessagesNative {
			return r, nil
		}
		var err error
		if r.chat, r.stops, err = toChat(q.Body); err != nil {
			return nil, refuse("%v", err)
		}
		return r, nil
	}
	prompts, est, perr := m.textInputs(q.Prompt, false)
	if perr != nil {
		return nil, refuse("prompt: %v", perr)
	}
	r.prompt = est
	r.choices *= int64(len(prompts))
	return r, nil
}

func (m *Model) parseEmbeddings(r *request, input json.RawMessage) *job.ItemError {
	inputs, _, err := m.textInputs(input, true)
	if err != nil {
		return refuse("input: %v", err)
	}
	r.inputs = inputs
	r.inputEst = make([]estimate, len(inputs))
	for i, in := range inputs {
		r.inputEst[i] = m.inputEstimate(in)
		r.prompt = r.prompt.add(r.inputEst[i])
	}
	// Items can share a request when everything but their input is the
	// same, and their inputs are of one kind (the API takes an array of
	// strings or an array of token arrays, not both).
	var obj map[string]json.RawMessage
	_ = json.Unmarshal(r.body, &obj) // the canonical body: compact, one of each key
	rest := make(map[string]json.RawMessage, len(obj))
	for k, v := range obj {
		if k != "input" {
			rest[k] = v
		}
	}
	key, _ := json.Marshal(rest) // sorted keys
	kind := "text"
	if inputs[0][0] == '[' {
		kind = "tokens"
	}
	r.key = kind + " " + string(key)
	return nil
}

// textInputs splits a prompt or an input into its texts or token arrays,
// each as JSON: a string, an array of strings, an array of token ids, or an
// array of token arrays, not empty.
func (m *Model) textInputs(raw json.RawMessage, exactOK bool) ([]json.RawMessage, estimate, error) {
	raw = bytes.TrimSpace(raw)
	var est estimate
	bad := fmt.Errorf("want a string, an array of strings, or token arrays, not empty")
	if len(raw) == 0 {
		return nil, est, bad
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, est, bad
		}
		return []json.RawMessage{raw}, m.counter.textEstimate(s, exactOK), nil
	}
	var elems []json.RawMessage
	if json.Unmarshal(raw, &elems) != nil || len(elems) == 0 {
		return nil, est, bad
	}
	switch first := bytes.TrimSpace(elems[0]); {
	case len(first) > 0 && first[0] == '"':
		for i, e := range elems {
			var s string
			if json.Unmarshal(e, &s) != nil {
				return nil, est, bad
			}
			elems[i] = bytes.TrimSpace(e)
			est = est.add(m.counter.textEstimate(s, exactOK))
		}
		return elems, est, nil
	case len(first) > 0 && first[0] == '[':
		for i, e := range elems {
			var ids []int64
			if json.Unmarshal(e, &ids) != nil || len(ids) == 0 {
				return nil, est, bad
			}
			elems[i] = bytes.TrimSpace(e)
			est.exact += int64(len(ids))
		}
		return elems, est, nil
	default:
		var ids []int64
		if json.Unmarshal(raw, &ids) != nil {
			return nil, est, bad
		}
		return []json.RawMessage{raw}, estimate{exact: int64(len(ids))}, nil
	}
}

// inputEstimate is one embedding input's tokens.
func (m *Model) inputEstimate(in json.RawMessage) estimate {
	if in[0] == '"' {
		var s string
		_ = json.Unmarshal(in, &s)
		return m.counter.textEstimate(s, true)
	}
	var ids []int64
	_ = json.Unmarshal(in, &ids)
	return estimate{exact: int64(len(ids))}
}
