package api

import (
	"fmt"
	"net/http"
)

// Error codes of the API, as they appear in {"error":{"code":...}}. Each has
// one HTTP status; docs/api.md lists them all. Clients branch on the code, so
// a code never changes meaning once published.
const (
	CodeUnauthorized        = "unauthorized"            // 401
	CodeNotFound            = "not_found"               // 404
	CodeMethodNotAllowed    = "method_not_allowed"      // 405
	CodeUnsupportedMedia    = "unsupported_media_type"  // 415
	CodeBodyTooLarge        = "body_too_large"          // 413
	CodeItemTooLarge        = "item_too_large"          // 413
	CodeMalformedJSON       = "malformed_json"          // 400
	CodeUnknownField        = "unknown_field"           // 400
	CodeInvalidParameter    = "invalid_parameter"       // 400
	CodeNoItems             = "no_items"                // 422
	CodeTooManyItems        = "too_many_items"          // 422
	CodeMissingItemID       = "missing_item_id"         // 422
	CodeItemIDTooLong       = "item_id_too_long"        // 422
	CodeDuplicateItemID     = "duplicate_item_id"       // 422
	CodeEmptyItem           = "empty_item"              // 422
	CodeInvalidOptions      = "invalid_options"         // 422
	CodeInvalidEndpoint     = "invalid_endpoint"        // 422
	CodeBodyWithoutEndpoint = "body_without_endpoint"   // 422
	CodeContentWithEndpoint = "content_with_endpoint"   // 422
	CodeMissingBody         = "missing_body"            // 422
	CodeInvalidBody         = "invalid_body"            // 422
	CodeModelNotAllowed     = "model_not_allowed"       // 422
	CodeStreamNotSupported  = "stream_not_supported"    // 422
	CodeInvalidN            = "invalid_n"               // 422
	CodeInvalidMaxTokens    = "invalid_max_tokens"      // 422
	CodeIdempotencyReused   = "idempotency_key_reused"  // 422
	CodeIdempotencyBusy     = "idempotency_key_in_use"  // 409
	CodeRateLimited         = "rate_limited"            // 429
	CodeInvalidIdempotency  = "invalid_idempotency_key" // 400
	CodeInvalidTenant       = "invalid_tenant"          // 400
	CodeStatusUnavailable   = "status_unavailable"      // 501
	CodeEnqueueFailed       = "enqueue_failed"          // 503
	CodeStoreUnavailable    = "store_unavailable"       // 503
	CodeInternal            = "internal"                // 500
	CodeOverloaded          = "overloaded"              // 503
	CodeTooManyBodies       = "too_many_bodies"         // 429
	CodeTooManyResults      = "too_many_results"        // 429
	CodeBodyTooSlow         = "body_too_slow"           // 408
	CodeHeadersTooLarge     = "headers_too_large"       // 431
	CodeBadRequest          = "bad_request"             // 400, 417, 501, 505: a request net/http refuses before any handler
)

// Error is a client-facing error: an HTTP status and the JSON body
// {"error":{"code","message","item"}}. Message is for humans and is fixed
// text: it may state the publisher's own limits and a byte offset, never
// request content (paths, ids, query values, header values, field names,
// characters of the body, socket addresses), so an error is never a way to
// reflect a client's bytes back to it or to a browser (TestErrorsEchoNothing).
// Item names the item at fault by its id, the one piece of the request an
// error carries back, in its own field.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Item    string `json:"item,omitempty"` // the item id the error is about
	// Param names the request parameter at fault, on the OpenAI-compatible
	// routes, which send it as OpenAI's errors do (openai.go).
	Param string `json:"-"`
}

func (e *Error) Error() string {
	if e.Item != "" {
		return fmt.Sprintf("%d %s: %s (item %q)", e.Status, e.Code, e.Message, e.Item)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

func Err(status int, code, format string, a ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, a...)}
}

func ItemErr(status int, code, id, format string, a ...any) *Error {
	e := Err(status, code, format, a...)
	e.Item = id
	return e
}

// ErrorBody is the JSON of every error response. Sent and the job fields are
// set on a 503 after the job was given an id, so a client knows how much of it
// reached the queue.
type ErrorBody struct {
	Error  *Error `json:"error"`
	JobID  string `json:"job_id,omitempty"`
	Chunks int    `json:"chunks,omitempty"`
	Sent   *int   `json:"sent,omitempty"`
}

// FailWith is how a handler answers an error: it writes e and keeps its code
// for the request's log line and metrics (Observe).
func FailWith(w http.ResponseWriter, r *http.Request) func(*Error) {
	ri := Info(r)
	return func(e *Error) {
		ri.Code = e.Code
		WriteError(w, e)
	}
}

func WriteError(w http.ResponseWriter, e *Error) {
	if o, ok := w.(*openAIWriter); ok {
		o.writeError(e)
		return
	}
	if a, ok := w.(*anthropicWriter); ok {
		a.writeError(e)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	WriteJSON(w, e.Status, ErrorBody{Error: e})
}
