package job

import (
	"bytes"
	"encoding/json"
	"errors"
)

// The OpenAI-compatible endpoints a job may name (Work.Endpoint): an item of
// such a job carries, in Body, a request for that route as a client would
// send it to OpenAI, and the subscriber forwards it to the model server its
// configuration names. The route is a name for the request's kind, not a
// URL: the server's base URL never comes from a message.
const (
	EndpointChatCompletions = "/v1/chat/completions"
	EndpointCompletions     = "/v1/completions"
	EndpointEmbeddings      = "/v1/embeddings"
	// EndpointMessages is Anthropic's Messages API (the requests of the
	// publisher's Message Batches): the subscriber sends it to the
	// server's /v1/messages, or translates it to /v1/chat/completions and
	// back (model/modelserver/messages.go).
	EndpointMessages = "/v1/messages"
	// EndpointResponses and EndpointModerations are forwarded as they are;
	// not every server serves them (vLLM serves /v1/responses), so the
	// publisher takes batches for them only where its deployment lists
	// them as served (its ServedEndpoints).
	EndpointResponses   = "/v1/responses"
	EndpointModerations = "/v1/moderations"
)

// BatchEndpoints lists the endpoints a batch may name, as OpenAI's Batch
// API lists them (its API reference, "Create batch": endpoint).
var BatchEndpoints = []string{EndpointResponses, EndpointChatCompletions, EndpointCompletions, EndpointEmbeddings, EndpointModerations}

// Endpoints lists the endpoints a job may name. A subscriber's class for
// an endpoint is its index here, so new ones go at the end.
var Endpoints = []string{EndpointChatCompletions, EndpointCompletions, EndpointEmbeddings, EndpointMessages, EndpointResponses, EndpointModerations}

// ValidEndpoint reports whether e is one of Endpoints.
func ValidEndpoint(e string) bool {
	switch e {
	case EndpointChatCompletions, EndpointCompletions, EndpointEmbeddings, EndpointMessages, EndpointResponses, EndpointModerations:
		return true
	}
	return false
}

// Errors of the rule for items of a job with an endpoint (Item.CheckFor),
// wrapped with ErrMalformed.
var (
	ErrUnknownEndpoint     = errors.New("endpoint is not /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages, /v1/responses or /v1/moderations")
	ErrBodyWithoutEndpoint = errors.New("item has a request body, and the job names no endpoint")
	ErrInlineWithEndpoint  = errors.New("item has text or data, and the job names an endpoint: its content is a request body")
	ErrNoBody              = errors.New("item has no request body")
	ErrBodyNotObject       = errors.New("item's request body is not a JSON object")
)

// isJSONObject reports whether b is one JSON object, nothing before or after
// it but white space.
func isJSONObject(b []byte) bool {
	t := bytes.TrimLeft(b, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && json.Valid(b)
}
