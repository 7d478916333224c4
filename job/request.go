package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The one rule for the request body of an item of a job with an endpoint.
// The publisher checks a job's items with it (and a batch's lines); the
// subscriber checks every item it takes from the queue again with it,
// which it does not trust, and forwards the canonical body the rule
// returns, never the bytes it received: what reaches the server is what
// was checked.
//
// The shapes are those of OpenAI's API reference
// (https://platform.openai.com/docs/api-reference/chat/create, .../completions/create,
// .../embeddings/create; the OpenAPI document behind them is
// github.com/openai/openai-openapi, openapi.yaml, schemas
// CreateChatCompletionRequest, CreateCompletionRequest and
// CreateEmbeddingRequest):
//   - every endpoint requires model, a string;
//   - chat requires messages, an array of at least one message; n is an
//     integer from 1 to 128 (default 1); max_completion_tokens an integer;
//     max_tokens an integer, deprecated in favour of max_completion_tokens;
//     stream a boolean (default false);
//   - completions require prompt: a string, an array of strings, an array of
//     token ids (at least one) or an array of token-id arrays (at least one
//     each); max_tokens is an integer (default 16); n 1 to 128; best_of (the
//     completions generated on the server, of which the best n return; it
//     must not be below n) 0 to 20; stream a boolean;
//   - embeddings require input: a string that is not empty, or an array of
//     1 to 2048 strings, of token ids, or of token-id arrays (at least one
//     each).
//
// What the rule adds, and why:
//   - n, best_of, max_tokens, max_completion_tokens and stream are nullable
//     there, a null meaning the default. The canonical body drops such a
//     null: a server that reads the last of two keys, or that takes a null
//     ceiling as none (vLLM generates up to the context length), never sees
//     one.
//   - A field the rule bounds must be an integer literal or a boolean: a
//     lenient server (vLLM's, through pydantic's lax mode) reads "8", 8.0
//     and "true" as 8 and true, values that would not have been bounded.
//   - No key may appear twice, nor two keys that differ only in case, nor
//     a key that is one the rule reads but in another case ("MODEL",
//     "Max_Tokens"): servers differ in which of two they read, and Go's
//     encoding/json (Ollama's gin binding) matches keys without regard to
//     case, so "MAX_TOKENS" would pass the ceiling unseen. The same holds
//     inside the messages and content parts the rule reads.
//   - best_of is counted: the server generates max(n, best_of) sequences.
//   - A content part that names a URL (image_url, and vLLM's audio_url and
//     video_url) may carry only a data: URL unless remote URLs are allowed:
//     a multimodal server fetches any other, and a message must not choose
//     what it fetches.
//   - The canonical body of a chat or completions request always names its
//     ceiling: max_tokens is added, at RequestLimits.MaxOutputTokens (16 for
//     completions, that API's default), when the body names none.

// RequestLimits are the bounds a request body is checked against.
type RequestLimits struct {
	// Models a body may name; none: any.
	Models []string
	// MaxN bounds n and best_of.
	MaxN int
	// MaxOutputTokens bounds max_tokens and max_completion_tokens, and is
	// what a chat request without either is sent with.
	MaxOutputTokens int
	// AllowRemoteURLs lets content parts name URLs other than data: ones.
	AllowRemoteURLs bool
}

// Request is a body the rule accepted.
type Request struct {
	Endpoint string
	Model    string
	// N is n (1 when not given), BestOf best_of (0 when not given).
	N, BestOf int64
	// MaxOut is the most tokens one sequence may generate: the body's
	// ceiling, or the one its canonical body is sent with.
	MaxOut int64
	// Messages, Prompt and Input are the endpoint's required field, as
	// JSON; only the endpoint's own is set.
	Messages, Prompt, Input json.RawMessage
	// Body is the canonical body: the members in the order given, each
	// compacted, without the nulls of bounded fields, with max_tokens
	// added where a generation names no ceiling.
	Body []byte
}

// Sequences is what one prompt of r generates at once: max(n, best_of).
func (r *Request) Sequences() int64 { return max(r.N, r.BestOf) }

// MaxEmbeddingInputs is the most inputs one embeddings request may hold:
// OpenAI's bound (CreateEmbeddingRequest's maxItems).
const MaxEmbeddingInputs = 2048

// CompletionsDefaultMaxTokens is what /v1/completions generates when a body
// names no max_tokens (OpenAI's and vLLM's default), so sending it is a
// true bound that changes nothing.
const CompletionsDefaultMaxTokens = 16

// The kinds of a refused body (BodyError.Kind); each caller maps them to
// its own answer.
var (
	ErrBodyInvalid     = errors.New("invalid request body")
	ErrModelNotAllowed = errors.New("model not allowed")
	ErrStream          = errors.New("stream not supported")
	ErrN               = errors.New("invalid n or best_of")
	ErrMaxTokens       = errors.New("invalid max_tokens")
	ErrRemoteURL       = errors.New("remote URL not allowed")
)

// BodyError is a refused body: its kind, and a message of fixed text that
// names fields, never values, so that it may be shown to anyone.
type BodyError struct {
	Kind error
	Msg  string
}

func (e *BodyError) Error() string { return e.Msg }
func (e *BodyError) Unwrap() error { return e.Kind }

func bodyErr(kind error, format string, a ...any) *BodyError {
	return &BodyError{Kind: kind, Msg: fmt.Sprintf(format, a...)}
}

// The fields the rule reads at the top of a body: a key that equals one of
// them but for case is refused.
var ruleFields = []string{"model", "messages", "prompt", "input", "n", "best_of", "max_tokens", "max_completion_tokens", "stream"}

// nullable are the bounded fields whose null means the default: dropped
// from the canonical body.
var nullable = []string{"n", "best_of", "max_tokens", "max_completion_tokens", "stream"}

// CheckRequest checks body, a request for endpoint (one of Endpoints), and
// returns it with its canonical body, or a *BodyError.
func CheckRequest(endpoint string, body []byte, lim RequestLimits) (*Request, error) {
	if !ValidEndpoint(endpoint) {
		return nil, bodyErr(ErrBodyInvalid, "the endpoint is not one of %s", strings.Join(Endpoints, ", "))
	}
	members, err := objectMembers(body, ruleFields)
	if err != nil {
		return nil, err
	}
	fields := make(map[string]json.RawMessage, len(members))
	for _, m := range members {
		fields[m.key] = m.value
	}
	r := &Request{Endpoint: endpoint, N: 1}
	if v, ok := present(fields, "model"); !ok || json.Unmarshal(v, &r.Model) != nil || r.Model == "" {
		return nil, bodyErr(ErrBodyInvalid, "the body's model must be a string that is not empty: the model that is to answer")
	}
	if len(lim.Models) > 0 && !slices.Contains(lim.Models, r.Model) {
		return nil, bodyErr(ErrModelNotAllowed, "the body's model is not one served here: %s", strings.Join(lim.Models, ", "))
	}
	if v, ok := present(fields, "stream"); ok && string(v) != "false" {
		return nil, bodyErr(ErrStream, "stream must be false or left out: an output is the server's whole answer, never a stream of events")
	}
	if endpoint == EndpointMessages {
		return checkMessagesRequest(r, members, fields, lim)
	}
	// whole reads field as an integer from 1 to most; 0 when absent.
	whole := func(field string, kind error, most int) (int64, error) {
		v, ok := present(fields, field)
		if !ok {
			return 0, nil
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < 1 || n > int64(most) {
			return 0, bodyErr(kind, "the body's %s must be a whole number from 1 to %d, or left out", field, most)
		}
		return n, nil
	}
	if endpoint == EndpointEmbeddings {
		v, ok := present(fields, "input")
		if !ok || !textsOrTokens(v, true, MaxEmbeddingInputs) {
			return nil, bodyErr(ErrBodyInvalid, "the body's input must be a string that is not empty, or an array of 1 to %d strings "+
				"that are not empty, of token ids or of token-id arrays", MaxEmbeddingInputs)
		}
		r.Input = v
		r.Body = canonical(members, "", "")
		return r, nil
	}
	if r.N, err = whole("n", ErrN, lim.MaxN); err != nil {
		return nil, err
	}
	r.N = max(r.N, 1)
	if r.BestOf, err = whole("best_of", ErrN, lim.MaxN); err != nil {
		return nil, err
	}
	if r.BestOf > 0 && r.BestOf < r.N {
		return nil, bodyErr(ErrN, "the body's best_of must not be below its n: the server generates best_of and returns the best n")
	}
	// Both ceilings are bounded on both endpoints. Chat's server reads one
	// or the other (vLLM the first that is set of max_completion_tokens
	// and max_tokens), so the larger bounds it; completions have only
	// max_tokens (a max_completion_tokens there is not read).
	mt, err := whole("max_tokens", ErrMaxTokens, lim.MaxOutputTokens)
	if err != nil {
		return nil, err
	}
	mct, err := whole("max_completion_tokens", ErrMaxTokens, lim.MaxOutputTokens)
	if err != nil {
		return nil, err
	}
	r.MaxOut = mt
	if endpoint == EndpointChatCompletions {
		r.MaxOut = max(mt, mct)
	}
	addMax := ""
	if r.MaxOut == 0 {
		r.MaxOut = int64(lim.MaxOutputTokens)
		if endpoint == EndpointCompletions {
			r.MaxOut = CompletionsDefaultMaxTokens
		}
		addMax = strconv.FormatInt(r.MaxOut, 10)
	}
	switch endpoint {
	case EndpointChatCompletions:
		v, ok := present(fields, "messages")
		if !ok {
			return nil, bodyErr(ErrBodyInvalid, "the body's messages must be an array of at least one message")
		}
		if err := checkMessages(v, lim.AllowRemoteURLs, checkPart); err != nil {
			return nil, err
		}
		r.Messages = v
	case EndpointCompletions:
		v, ok := present(fields, "prompt")
		if !ok || !textsOrTokens(v, false, 0) {
			return nil, bodyErr(ErrBodyInvalid, "the body's prompt must be a string, or an array of strings, of token ids or of token-id arrays")
		}
		r.Prompt = v
	}
	r.Body = canonical(members, "max_tokens", addMax)
	return r, nil
}

// member is one key and its value, compacted.
type member struct {
	key   string
	value json.RawMessage
}

// errNotObject is objectMembers' answer to what is not one JSON object.
var errNotObject = bodyErr(ErrBodyInvalid, "the item's body is not a JSON object")

// Members returns the members of the JSON object b by key, each value
// compacted, refusing a key given twice or in two cases (servers differ in
// which one they read), as CheckRequest does a body's: for the objects
// around a body, such as a batch file's lines.
func Members(b []byte) (map[string]json.RawMessage, error) {
	ms, err := objectMembers(b, nil)
	if err != nil {
		return nil, err
	}
	out := make(map[string]json.RawMessage, len(ms))
	for _, m := range ms {
		out[m.key] = m.value
	}
	return out, nil
}

// objectMembers returns the members of JSON object b in order, each value
// compacted, refusing a key given twice, two keys equal but for case, and
// a key equal but for case to one of known.
func objectMembers(b []byte, known []string) ([]member, error) {
	notObject := errNotObject
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, notObject
	}
	var out []member
	for dec.More() {
		t, err := dec.Token()
		k, ok := t.(string)
		if err != nil || !ok {
			return nil, notObject
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, notObject
		}
		for _, m := range out {
			if strings.EqualFold(m.key, k) {
				return nil, bodyErr(ErrBodyInvalid, "the item's body has a key more than once, or in two cases: servers differ in which one they read")
			}
		}
		for _, f := range known {
			if k != f && strings.EqualFold(k, f) {
				return nil, bodyErr(ErrBodyInvalid, "the item's body has a key that is %s in another case: some servers read keys without regard to case", f)
			}
		}
		var c bytes.Buffer
		if err := json.Compact(&c, v); err != nil {
			return nil, notObject
		}
		out = append(out, member{k, c.Bytes()})
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, notObject
	}
	if _, err := dec.Token(); err == nil {
		return nil, notObject // something after the object
	}
	return out, nil
}

// canonical is the object of members without the nulls of nullable fields,
// with add:value appended when add is not empty.
func canonical(members []member, add, value string) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	n := 0
	for _, m := range members {
		if string(m.value) == "null" && slices.Contains(nullable, m.key) {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		b.Write(m.value)
	}
	if add != "" && value != "" {
		if n > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(add)
		b.Write(k)
		b.WriteByte(':')
		b.WriteString(value)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// The keys the rule reads in a message, a content part and a URL object.
var (
	messageFields = []string{"role", "content"}
	partFields    = []string{"type", "url", "image_url", "audio_url", "video_url"}
)

// checkMessages checks messages: an array of at least one object, whose
// content, when it is an array of parts, names no remote URL unless allowed,
// each part checked by part (chat's checkPart, Anthropic's checkBlock).
func checkMessages(v json.RawMessage, allowRemote bool, part func(json.RawMessage, bool) error) error {
	bad := bodyErr(ErrBodyInvalid, "the body's messages must be an array of at least one message")
	var msgs []json.RawMessage
	if v[0] != '[' || json.Unmarshal(v, &msgs) != nil || len(msgs) == 0 {
		return bad
	}
	for _, raw := range msgs {
		members, err := objectMembers(raw, messageFields)
		switch {
		case errors.Is(err, errNotObject):
			return bad
		case err != nil:
			return bodyErr(ErrBodyInvalid, "a message of the body has a key more than once, or one the rule reads in another case")
		}
		for _, m := range members {
			if m.key != "content" || m.value[0] != '[' {
				continue
			}
			var parts []json.RawMessage
			if json.Unmarshal(m.value, &parts) != nil {
				return bad
			}
			for _, p := range parts {
				if err := part(p, allowRemote); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// checkPart checks one content part: an object whose URLs, wherever a
// server would read one (url, or any *_url as a string or an object with a
// url), are data: URLs unless remote ones are allowed.
func checkPart(p json.RawMessage, allowRemote bool) error {
	if len(p) == 0 || p[0] != '{' {
		return nil // not a part the rule reads; the server judges it
	}
	members, err := objectMembers(p, partFields)
	if err != nil {
		return bodyErr(ErrBodyInvalid, "a content part of the body has a key more than once, or one the rule reads in another case")
	}
	for _, m := range members {
		if m.key != "url" && !strings.HasSuffix(m.key, "_url") {
			continue
		}
		var urls []string
		switch m.value[0] {
		case '"':
			var u string
			_ = json.Unmarshal(m.value, &u) // compacted, so valid
			urls = append(urls, u)
		case '{':
			inner, err := objectMembers(m.value, []string{"url"})
			if err != nil {
				return bodyErr(ErrBodyInvalid, "a content part's %s has a key more than once, or url in another case", m.key)
			}
			for _, im := range inner {
				if im.key != "url" {
					continue
				}
				var u string
				if json.Unmarshal(im.value, &u) != nil {
					return bodyErr(ErrBodyInvalid, "a content part's %s.url is not a string", m.key)
				}
				urls = append(urls, u)
			}
		}
		for _, u := range urls {
			if !allowRemote && !isDataURL(u) {
				return bodyErr(ErrRemoteURL, "a content part names a URL that is not a data: URL, and remote URLs are not allowed here: "+
					"the server would fetch it (send the content as a data: URL)")
			}
		}
	}
	return nil
}

func isDataURL(u string) bool {
	return len(u) >= 5 && strings.EqualFold(u[:5], "data:")
}

// present returns field's JSON when the object has it and it is not null.
func present(fields map[string]json.RawMessage, field string) (json.RawMessage, bool) {
	v, ok := fields[field]
	if !ok || len(v) == 0 || string(v) == "null" {
		return nil, false
	}
	return v, true
}

// textsOrTokens reports whether v has one of the shapes of OpenAI's prompt
// and input: a string; or a non-empty array, of at most maxLen elements (0:
// any number), of strings, of token ids (whole numbers from 0), or of
// non-empty arrays of token ids. With nonEmpty, no string may be empty.
func textsOrTokens(v json.RawMessage, nonEmpty bool, maxLen int) bool {
	text := func(v json.RawMessage) bool {
		var s string
		return len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil && (!nonEmpty || s != "")
	}
	token := func(v json.RawMessage) bool {
		n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		return err == nil && n >= 0
	}
	tokens := func(v json.RawMessage) bool {
		var a []json.RawMessage
		v = bytes.TrimSpace(v)
		return len(v) > 0 && v[0] == '[' && json.Unmarshal(v, &a) == nil && len(a) > 0 && allOf(a, token)
	}
	if text(v) {
		return true
	}
	var a []json.RawMessage
	if len(v) == 0 || v[0] != '[' || json.Unmarshal(v, &a) != nil || len(a) == 0 || (maxLen > 0 && len(a) > maxLen) {
		return false
	}
	for i := range a {
		a[i] = bytes.TrimSpace(a[i])
	}
	return allOf(a, text) || allOf(a, token) || allOf(a, tokens)
}

func allOf(a []json.RawMessage, ok func(json.RawMessage) bool) bool {
	for _, v := range a {
		if !ok(v) {
			return false
		}
	}
	return true
}
