package api

import "net/http"

// AnthropicErrorBody is Anthropic's error: {"type": "error", "error":
// {"type", "message"}}, which its SDKs parse into their error types.
type AnthropicErrorBody struct {
	Type  string         `json:"type"`
	Error AnthropicError `json:"error"`
}

type AnthropicError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// AnthropicErrorType is the type Anthropic's "Errors" page gives a status.
// Anthropic answers overload with 529; the publisher's 503s (a store or a
// queue unavailable, too busy) keep their status and take its type.
func AnthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// anthropicWriter marks the response of an Anthropic route: WriteError
// writes its errors in Anthropic's shape.
type anthropicWriter struct{ http.ResponseWriter }

// Unwrap lets http.ResponseController reach the connection.
func (w *anthropicWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *anthropicWriter) writeError(e *Error) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	WriteJSON(w.ResponseWriter, e.Status, AnthropicErrorBody{Type: "error",
		Error: AnthropicError{Type: AnthropicErrorType(e.Status), Message: e.Message}})
}

// Anthropic makes next an Anthropic route: its errors take Anthropic's
// shape, x-api-key is the API key (Authorization: Bearer is taken too, as
// on every route), and anthropic-version is required, as Anthropic
// requires it; any version is taken, since the routes have one shape.
func Anthropic(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		aw := &anthropicWriter{w}
		if r.Header.Get("anthropic-version") == "" {
			Info(r).Code = CodeInvalidParameter
			WriteError(aw, Err(http.StatusBadRequest, CodeInvalidParameter, "anthropic-version: header is required"))
			return
		}
		if k := r.Header.Get("x-api-key"); k != "" && r.Header.Get("Authorization") == "" {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+k)
		}
		next.ServeHTTP(aw, r)
	})
}

// AnthropicErrors answers next's errors in Anthropic's shape, as OpenAI
// does in OpenAI's: for the routes that Anthropic would answer with its
// own 404 or 405, where no Anthropic check is due.
func AnthropicErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&anthropicWriter{w}, r)
	})
}
