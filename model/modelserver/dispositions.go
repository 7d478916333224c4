package modelserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"unicode/utf8"
)

// action is what the backend does with an answer.
type action int

const (
	// actOK: the answer is the item's result.
	actOK action = iota
	// actItem: the item's own fault; never retried. Its output is an
	// Error (request_refused) with the server's Response.
	actItem
	// actWait: a rate limit: wait as long as the server says, then send
	// again; the rate mirrors keep a wider margin.
	actWait
	// actOverloaded: the server has too much to do: wait (as it says, or
	// a growing backoff), halve the requests in flight, send again.
	actOverloaded
	// actOperator: nothing works until a person acts: Run returns an error
	// wrapping fault.ErrNeedsOperator.
	actOperator
	// actTransient: retried a bounded number of times with backoff, then
	// Run returns a plain error and the subscriber releases the message.
	actTransient
	// actTooLarge: the request is too large for the server: an embeddings
	// request is sent again in halves; one item alone is its own fault.
	actTooLarge
	// actOOM: the server ran out of memory: an embeddings request is sent
	// again in halves, one item alone returns gpu.ErrOutOfMemory (the
	// subscriber halves its batch); generation halves the requests in
	// flight and is retried as a transient failure.
	actOOM
)

var actionNames = [...]string{"ok", "item", "wait", "overloaded", "operator", "transient", "too_large", "oom"}

func (a action) String() string { return actionNames[a] }

// answer is what came back for one request.
type answer struct {
	ep     endpoint
	status int // 0 when err is set
	header http.Header
	body   []byte
	err    error // no answer: a refused or dropped connection, a timeout
	// cut, when not 0, is the bytes past which the body was not read:
	// body is nil then.
	cut int64

	// The error's fields, from whichever shape the server writes:
	// OpenAI's {"error":{"message","type","code"}}, TGI's
	// {"error","error_type"}, TEI's and old vLLM's {"message","type","code"}.
	errMessage, errType, errCode string
}

// disposition is one row of the table: the first row whose match takes an
// answer says what is done with it.
type disposition struct {
	name   string
	match  func(a *answer) bool
	action action
}

// dispositions is every answer's fate, one row per family, first match
// wins. The tests have one case per row (dispositions_test.go).
var dispositions = []disposition{
	// A reset connection, a dropped one, a timeout, a body cut short.
	{"no_answer", func(a *answer) bool { return a.err != nil }, actTransient},
	{"ok", func(a *answer) bool { return is2xx(a) && endpointJSON(a) }, actOK},
	// A 2xx whose body is not the endpoint's JSON (a proxy's page, a
	// server that answers something else): the item's error.
	{"ok_not_endpoint_json", is2xx, actItem},
	// OpenAI's 429 insufficient_quota: retrying never helps.
	{"insufficient_quota", func(a *answer) bool {
		return a.status == http.StatusTooManyRequests && (a.errCode == "insufficient_quota" || a.errType == "insufficient_quota")
	}, actOperator},
	// The key is refused, or not allowed this model.
	{"unauthorized", func(a *answer) bool {
		return a.status == http.StatusUnauthorized || a.status == http.StatusForbidden
	}, actOperator},
	// model_not_found, or a route the server does not have: the
	// configuration is wrong (the model names and the URL come from it).
	{"not_found", func(a *answer) bool { return a.status == http.StatusNotFound }, actOperator},
	// "CUDA out of memory" and its kin, whatever the status a server
	// wraps it in, but a client error's.
	{"out_of_memory", func(a *answer) bool {
		return (a.status >= 500 || a.status == http.StatusFailedDependency) && saysOutOfMemory(a)
	}, actOOM},
	// TEI's 413: a body past its payload limit (axum's plain text), or more
	// inputs than max_client_batch_size.
	{"payload_too_large", func(a *answer) bool { return a.status == http.StatusRequestEntityTooLarge }, actTooLarge},
	// OpenAI's 429 for a request larger than the tokens-per-minute limit
	// itself: waiting never lets it through.
	{"too_large_for_rate_limit", func(a *answer) bool {
		return a.status == http.StatusTooManyRequests && strings.HasPrefix(a.errMessage, "Request too large")
	}, actItem},
	// TGI's and TEI's 429 "Model is overloaded" (error_type overloaded).
	{"overloaded_429", func(a *answer) bool {
		return a.status == http.StatusTooManyRequests && (a.errType == "overloaded" || strings.Contains(a.errMessage, "overloaded"))
	}, actOverloaded},
	// OpenAI's 429 rate_limit_exceeded, and any other 429.
	{"rate_limited", func(a *answer) bool { return a.status == http.StatusTooManyRequests }, actWait},
	// vLLM's 503 past --max-num-queued-reqs, Triton's 503, Dynamo's 529.
	{"overloaded", func(a *answer) bool { return a.status == http.StatusServiceUnavailable || a.status == 529 }, actOverloaded},
	// A request timeout or a conflict: the SDKs retry these.
	{"retryable_4xx", func(a *answer) bool {
		return a.status == http.StatusRequestTimeout || a.status == http.StatusConflict
	}, actTransient},
	// 5xx and TGI's 424 (an error during generation): transient, whatever
	// their body.
	{"server_error", func(a *answer) bool { return a.status >= 500 || a.status == http.StatusFailedDependency }, actTransient},
	// 400 and 422 (context length, invalid request) and the other client
	// errors: the item's own.
	{"refused", func(a *answer) bool { return a.status >= 400 && a.status < 500 }, actItem},
	// A status no server should answer (1xx, 3xx): the item's error.
	{"unexpected", func(*answer) bool { return true }, actItem},
}

// classify is the row that takes a.
func classify(a *answer) *disposition {
	a.parseError()
	for i := range dispositions {
		if dispositions[i].match(a) {
			return &dispositions[i]
		}
	}
	panic("modelserver: no disposition takes the answer") // the last row takes every one
}

func is2xx(a *answer) bool { return a.err == nil && a.status >= 200 && a.status < 300 }

// endpointJSON reports whether a 2xx body is what the endpoint defines: an
// object with a choices array (chat, completions), a data array
// (embeddings), or a content array (Anthropic's messages).
func endpointJSON(a *answer) bool {
	var v map[string]json.RawMessage
	if json.Unmarshal(a.body, &v) != nil {
		return false
	}
	field := "choices"
	switch a.ep {
	case embeddings:
		field = "data"
	case messages:
		field = "content"
	}
	arr := bytes.TrimSpace(v[field])
	return len(arr) > 0 && arr[0] == '['
}

func saysOutOfMemory(a *answer) bool {
	for _, s := range []string{a.errMessage, a.errType, a.errCode} {
		s = strings.ToLower(s)
		if strings.Contains(s, "out of memory") || strings.Contains(s, "outofmemory") || strings.Contains(s, "out_of_memory") {
			return true
		}
	}
	return false
}

// parseError reads the error fields of a non-2xx JSON body.
func (a *answer) parseError() {
	if a.err != nil || is2xx(a) || len(a.body) == 0 {
		return
	}
	var top struct {
		Error     json.RawMessage `json:"error"`
		ErrorType string          `json:"error_type"`
		Message   string          `json:"message"`
		Type      string          `json:"type"`
		Code      json.RawMessage `json:"code"`
	}
	// Every string of the server's is cut here, once: they go on into item
	// errors, logs, the gate's reason and the operator's error that
	// /healthz shows, and a broken or hostile server may send megabytes.
	defer func() {
		a.errMessage, a.errType, a.errCode = clip(a.errMessage, maxServerMessage), clip(a.errType, maxServerString), clip(a.errCode, maxServerString)
	}()
	if json.Unmarshal(a.body, &top) != nil {
		a.errMessage = string(a.body) // plain text (axum's 413, a proxy's page)
		return
	}
	a.errMessage, a.errType, a.errCode = top.Message, top.Type, codeString(top.Code)
	var nested struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	var s string
	switch {
	case json.Unmarshal(top.Error, &nested) == nil && (nested.Message != "" || nested.Type != ""):
		a.errMessage, a.errType, a.errCode = nested.Message, nested.Type, codeString(nested.Code)
	case json.Unmarshal(top.Error, &s) == nil:
		a.errMessage, a.errType = s, top.ErrorType
	}
}

func codeString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// describe is the answer in a few words: its status, and with message the
// server's message, which may quote the request (an item error carries it,
// escaped and cut by job.NewItemError). Without message, for errors that
// reach logs, only the error's type and code: some servers quote part of a
// refused API key in the message.
func (a *answer) describe(message bool) string {
	if a.err != nil {
		return "no answer: " + clipErr(a.err).Error()
	}
	s := a.statusText()
	if a.errType != "" || a.errCode != "" {
		s += " (" + strings.Trim(a.errType+" "+a.errCode, " ") + ")"
	}
	msg := a.errMessage
	switch {
	case is2xx(a) && !json.Valid(a.body):
		msg = "the body is not JSON"
	case is2xx(a):
		msg = "the body is not the JSON " + a.ep.path() + " answers"
	case !message:
		return s
	}
	return s + ": " + clip(msg, 300)
}

// The most bytes of a server's string kept: an error's type or code, a
// status line, a model id; and an error's message.
const (
	maxServerString  = 128
	maxServerMessage = 1024
)

// clipErr is err, or its text clipped when longer than a server's message
// may be: a transport's error may quote what the server sent (a malformed
// status line of up to a megabyte).
func clipErr(err error) error {
	if len(err.Error()) <= maxServerMessage {
		return err
	}
	return errors.New(clip(err.Error(), maxServerMessage))
}

// clip is s, valid UTF-8, cut to at most n bytes and an ellipsis without
// splitting a character.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
