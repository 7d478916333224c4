package jobs

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// JobRequest is the body of POST /v1/jobs.
type JobRequest struct {
	// Endpoint, when set, makes the job one of requests for a model
	// server: one of job.Endpoints, and every item then carries that
	// endpoint's request JSON in Body (checkBody says what is checked).
	// Empty, the items are text and data for an in-process model.
	Endpoint string        `json:"endpoint,omitempty"`
	Items    []RequestItem `json:"items"`
	Options  *JobOptions   `json:"options,omitempty"`
}

// RequestItem is one item of a job as a client sends it: job.Item without
// the payload reference, which only the publisher may set.
type RequestItem struct {
	ID   string `json:"id"`
	Text string `json:"text,omitempty"`
	Data []byte `json:"data,omitempty"` // base64 in JSON
	// Body is the request for the job's endpoint, kept as the client sent
	// it; the work message carries it compacted (chunk.go).
	Body json.RawMessage `json:"body,omitempty"`
}

// JobOptions tune one job within the publisher's limits.
type JobOptions struct {
	// ChunkItems is the most items per work message, from 1 to the
	// publisher's MaxChunkItems; 0 means the publisher's default. Smaller
	// chunks spread a job over more subscribers; larger ones cost fewer
	// messages.
	ChunkItems int `json:"chunk_items,omitempty"`
	// GroupPrefixes cuts the items of a job for a model server so that
	// those sharing a prefix (job.PrefixKey) travel together; their
	// outputs then come back grouped so (plannedItems).
	GroupPrefixes bool `json:"group_prefixes,omitempty"`
}

// MaxItemIDBytes bounds an item id: the grammar's bound (job.CheckItemID),
// which the subscriber checks too.
const MaxItemIDBytes = job.MaxItemIDBytes

// CodeInvalidItemID (422) answers an item id outside the grammar
// (job.CheckItemID) other than by its length: a control character.
const CodeInvalidItemID = "invalid_item_id"

// RequestLimits are the bounds DecodeJobRequest checks.
type RequestLimits struct {
	MaxItems      int // most items in one job
	MaxChunkItems int // largest options.chunk_items accepted
	// The bounds of a job of requests for a model server: the models a
	// body may name (none: any), its largest n (and best_of), and its
	// largest max_tokens and max_completion_tokens.
	Models          []string
	MaxN            int
	MaxOutputTokens int
	// AllowRemoteURLs lets a chat body's content parts name URLs other
	// than data: ones (job.RequestLimits).
	AllowRemoteURLs bool
	// Endpoints are those the deployment's model servers serve
	// (Config.ServedEndpoints); none: DefaultServedEndpoints.
	Endpoints []string
}

// DecodeJobRequest parses and validates a POST /v1/jobs body, reporting the
// first problem as an *api.Error: 400 for what is not a job request at all
// (malformed JSON, unknown fields, trailing data), 422 for a request that
// parses but breaks a rule. Item sizes are checked later, against the
// message size, by the chunk planner.
func DecodeJobRequest(body []byte, lim RequestLimits) (*JobRequest, *api.Error) {
	var req JobRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "the request body is empty; want a JSON object with \"items\"")
	}
	// encoding/json would replace each invalid byte with U+FFFD, and the
	// job would run on, and answer with, ids and text the client never sent.
	if !utf8.Valid(body) {
		return nil, api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "the request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, DecodeError(err)
	}
	// Anything after the object is refused: a client that concatenated two
	// jobs, or a proxy that mangled the body, must not get half a job.
	if _, err := dec.Token(); err != io.EOF {
		return nil, api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "unexpected data after the JSON object")
	}
	if err := req.validate(lim); err != nil {
		return nil, err
	}
	return &req, nil
}

// DecodeError turns the decoder's error into a 400 with a fixed message. The
// decoder's own text quotes the body (a character, an unknown field's name),
// so it is not passed on; a byte offset is, and for a wrong type, the
// schema's name of the field, which is the API's, not the client's.
func DecodeError(err error) *api.Error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var b64 base64.CorruptInputError
	switch {
	case errors.As(err, &syn):
		return api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "malformed JSON at byte %d", syn.Offset)
	case errors.As(err, &typ) && knownField(typ.Field):
		return api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "%s has the wrong type (at byte %d)", typ.Field, typ.Offset)
	case errors.As(err, &typ):
		return api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "a value has the wrong type (at byte %d)", typ.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "the JSON ends too early")
	case errors.As(err, &b64):
		return api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "an item's data is not valid base64")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return api.Err(http.StatusBadRequest, api.CodeUnknownField, "the request has a field this API does not define")
	}
	return api.Err(http.StatusBadRequest, api.CodeMalformedJSON, "the body is not a JSON job request")
}

// knownField reports whether a decoder's field path is one of the request's
// own fields, and so safe to name in an error.
func knownField(f string) bool {
	switch f {
	case "", "endpoint", "items", "items.id", "items.text", "items.data", "items.body", "options", "options.chunk_items", "options.group_prefixes":
		return f != ""
	}
	return false
}

func (r *JobRequest) validate(lim RequestLimits) *api.Error {
	switch {
	case len(r.Items) == 0:
		return api.Err(http.StatusUnprocessableEntity, api.CodeNoItems, "the job has no items")
	case len(r.Items) > lim.MaxItems:
		return api.Err(http.StatusUnprocessableEntity, api.CodeTooManyItems,
			"the job has more than %d items, the most accepted in one job", lim.MaxItems)
	}
	if o := r.Options; o != nil && (o.ChunkItems < 0 || o.ChunkItems > lim.MaxChunkItems) {
		return api.Err(http.StatusUnprocessableEntity, api.CodeInvalidOptions,
			"options.chunk_items must be from 1 to %d (or left out for the default)", lim.MaxChunkItems)
	}
	if r.Endpoint != "" && !job.ValidEndpoint(r.Endpoint) {
		return api.Err(http.StatusUnprocessableEntity, api.CodeInvalidEndpoint,
			"endpoint must be one of %s (or left out for items of text and data)", strings.Join(job.Endpoints, ", "))
	}
	if r.Endpoint != "" && !lim.Serves(r.Endpoint) {
		return api.Err(http.StatusUnprocessableEntity, api.CodeInvalidEndpoint,
			"endpoint %s is not served by this deployment's model servers, which serve %s and /v1/messages", r.Endpoint, strings.Join(lim.ServedList(), ", "))
	}
	seen := make(map[string]struct{}, len(r.Items))
	for i := range r.Items {
		it := &r.Items[i]
		// "body": null is no body, as OpenAI reads a null as the field
		// left out; dropped so that it travels as no body.
		if string(it.Body) == "null" {
			it.Body = nil
		}
		// The rule the subscriber applies to every message (job.Item.CheckFor),
		// so nothing accepted here is dead-lettered there.
		ji := job.Item{ID: it.ID, Text: it.Text, Data: it.Data, Body: it.Body}
		switch err := ji.CheckFor(r.Endpoint); {
		case err == nil:
		case errors.Is(err, job.ErrEmptyID):
			return api.Err(http.StatusUnprocessableEntity, api.CodeMissingItemID, "item %d has no id", i)
		case errors.Is(err, job.ErrIDTooLong):
			return api.Err(http.StatusUnprocessableEntity, api.CodeItemIDTooLong, "item %d has an id over %d bytes", i, MaxItemIDBytes)
		case errors.Is(err, job.ErrIDChars):
			return api.Err(http.StatusUnprocessableEntity, CodeInvalidItemID, "item %d has an id with a control character", i)
		case errors.Is(err, job.ErrBodyWithoutEndpoint):
			return api.ItemErr(http.StatusUnprocessableEntity, api.CodeBodyWithoutEndpoint, it.ID,
				"the item has a body, and the job names no endpoint: items of text and data have text or data")
		case errors.Is(err, job.ErrInlineWithEndpoint):
			return api.ItemErr(http.StatusUnprocessableEntity, api.CodeContentWithEndpoint, it.ID,
				"the job names an endpoint: its items carry a request in body, not text or data")
		case errors.Is(err, job.ErrNoBody):
			return api.ItemErr(http.StatusUnprocessableEntity, api.CodeMissingBody, it.ID,
				"the job names an endpoint, and the item has no body: the request to send to it")
		case errors.Is(err, job.ErrBodyNotObject):
			return api.ItemErr(http.StatusUnprocessableEntity, api.CodeInvalidBody, it.ID, "the item's body is not a JSON object")
		default:
			return api.ItemErr(http.StatusUnprocessableEntity, api.CodeEmptyItem, it.ID, "the item has neither text nor data")
		}
		if _, dup := seen[it.ID]; dup {
			return api.ItemErr(http.StatusUnprocessableEntity, api.CodeDuplicateItemID, it.ID, "an item id appears more than once")
		}
		seen[it.ID] = struct{}{}
		if r.Endpoint != "" {
			if e := lim.CheckBody(r.Endpoint, it.Body); e != nil {
				e.Item = it.ID
				return e
			}
		}
	}
	return nil
}

// chunkItems is the items-per-chunk this request asks for, or def.
func (r *JobRequest) chunkItems(def int) int {
	if r.Options != nil && r.Options.ChunkItems > 0 {
		return r.Options.ChunkItems
	}
	return def
}

// CheckBody checks the body of an item of a job with this endpoint with the
// one rule for request bodies (job.CheckRequest, whose comment says what it
// checks and why), which the subscriber applies again to what it takes from
// the queue: what the publisher accepts, the subscriber does not refuse.
// The first problem is returned, without the item, which the caller sets.
func (lim RequestLimits) CheckBody(endpoint string, body json.RawMessage) *api.Error {
	_, err := job.CheckRequest(endpoint, body, job.RequestLimits{
		Models: lim.Models, MaxN: lim.MaxN, MaxOutputTokens: lim.MaxOutputTokens, AllowRemoteURLs: lim.AllowRemoteURLs,
	})
	if err == nil {
		return nil
	}
	code := api.CodeInvalidBody
	for kind, c := range map[error]string{job.ErrModelNotAllowed: api.CodeModelNotAllowed, job.ErrStream: api.CodeStreamNotSupported,
		job.ErrN: api.CodeInvalidN, job.ErrMaxTokens: api.CodeInvalidMaxTokens} {
		if errors.Is(err, kind) {
			code = c
		}
	}
	// The rule's messages are fixed text that names fields, never values.
	return api.Err(http.StatusUnprocessableEntity, code, "%s", err.Error())
}

// Present returns field's JSON when the object has it and it is not null.
func Present(fields map[string]json.RawMessage, field string) (json.RawMessage, bool) {
	v, ok := fields[field]
	v = bytes.TrimSpace(v)
	if !ok || string(v) == "null" {
		return nil, false
	}
	return v, true
}
