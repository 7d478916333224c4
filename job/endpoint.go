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
)

// The endpoints OpenAI's Batch API takes that no job may name: a model
// server's /v1/responses and /v1/moderations are not forwarded, so a batch
// for one is refused line by line (BatchEndpoints).
const (
	EndpointResponses   = "/v1/responses"
	EndpointModerations = "/v1/moderations"
)

// BatchEndpoints lists the endpoints a batch may name, as OpenAI's Batch
// API lists them (its API reference, "Create batch": endpoint): those of
// Endpoints run, the others are refused when the batch is validated, each
// line named.
var BatchEndpoints = []string{EndpointResponses, EndpointChatCompletions, EndpointCompletions, EndpointEmbeddings, EndpointModerations}

// Endpoints lists the endpoints a job may name, longest first.
var Endpoints = []string{EndpointChatCompletions, EndpointCompletions, EndpointEmbeddings, EndpointMessages}

// ValidEndpoint reports whether e is one of Endpoints.
func ValidEndpoint(e string) bool {
	switch e {
	case EndpointChatCompletions, EndpointCompletions, EndpointEmbeddings, EndpointMessages:
		return true
	}
	return false
}

// Errors of the rule for items of a job with an endpoint (Item.CheckFor),
// wrapped with ErrMalformed.
var (
	ErrUnknownEndpoint     = errors.New("endpoint is not /v1/chat/completions, /v1/completions, /v1/embeddings or /v1/messages")
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
