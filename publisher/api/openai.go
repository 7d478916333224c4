package api

import (
	"net/http"
)

// The OpenAI-compatible routes (/v1/files) answer errors in the shape of
// OpenAI's API, which its SDKs parse into their error types:
//
//	{"error":{"message":"...","type":"invalid_request_error","param":"purpose","code":"invalid_parameter"}}
//
// with the status codes OpenAI uses. code is the publisher's own (the table
// of docs/api.md), so a client branches on the same codes on every route;
// type is OpenAI's coarse class, from the status; param names the parameter
// at fault, or is null. Every error a request to these routes meets, the
// auth and rate-limit refusals before its handler included, takes this
// shape: the route's handler chain starts with OpenAI, which marks the
// response, and WriteError writes a marked response's errors so.

// openAIErrorBody is the JSON of an error on an OpenAI-compatible route.
type openAIErrorBody struct {
	Error openAIError `json:"error"`
}

type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// OpenAI's error types, by status: what its API sends for the statuses the
// publisher answers.
const (
	openAIInvalidRequest = "invalid_request_error"
	openAIServerError    = "server_error"
)

// openAIWriter marks the response of an OpenAI-compatible route.
type openAIWriter struct{ http.ResponseWriter }

// Unwrap lets http.ResponseController reach the connection (read deadlines).
func (w *openAIWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *openAIWriter) writeError(e *Error) {
	typ := openAIInvalidRequest
	if e.Status >= 500 {
		typ = openAIServerError
	}
	body := openAIErrorBody{Error: openAIError{Message: e.Message, Type: typ, Code: e.Code}}
	if e.Param != "" {
		body.Error.Param = &e.Param
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	WriteJSON(w.ResponseWriter, e.Status, body)
}

// OpenAI makes next an OpenAI-compatible route: its errors take OpenAI's
// shape.
func OpenAI(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&openAIWriter{w}, r)
	})
}

// ParamErr is an error about the request parameter param.
func ParamErr(status int, code, param, format string, a ...any) *Error {
	e := Err(status, code, format, a...)
	e.Param = param
	return e
}
