package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
)

// LambdaHandler runs h as an AWS Lambda function behind an API Gateway HTTP
// API (payload format 2.0) or a Lambda function URL; pass it to lambda.Start.
// The two services send the same event JSON (events.LambdaFunctionURLRequest
// is a subset of events.APIGatewayV2HTTPRequest) and read the same response
// JSON (function URLs ignore the extra multiValueHeaders field, which stays
// empty), so one handler serves both.
//
// Each event becomes one server-side *http.Request carrying the invocation's
// context (its deadline, and lambdacontext.FromContext for the request id)
// and the caller identity the event's authorizer gave (caller.go),
// and h's whole response is buffered: both services take a response in one
// piece, of at most 6 MB.
//
// An event that cannot be turned into a request (no method, a body that is
// not the base64 it claims to be) is answered 400 with the publisher's JSON
// error rather than a function error, which API Gateway would turn into a
// bare 500 with no explanation. A panic in h is answered 500 and the
// function keeps serving, as net/http's server keeps serving: otherwise the
// Lambda client exits the process and the next request pays a cold start.
func LambdaHandler(h http.Handler) func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	return func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		r, err := lambdaRequest(ctx, ev)
		if err != nil {
			return lambdaError(Err(http.StatusBadRequest, CodeInvalidEvent, "%s", err), ev.RequestContext.HTTP.Method), nil
		}
		w := &lambdaResponseWriter{header: http.Header{}}
		if !lambdaServe(h, w, r) {
			return lambdaError(Err(http.StatusInternalServerError, CodeInternal, "internal error"), r.Method), nil
		}
		out := w.event(r.Method)
		if n := lambdaResponseSize(out); n > lambdaMaxResponse {
			slog.ErrorContext(ctx, "response over Lambda's limit", "method", r.Method, "path", r.URL.Path, "status", out.StatusCode, "bytes", n)
			return lambdaError(Err(http.StatusInternalServerError, CodeInternal,
				"the response is larger than AWS Lambda's limit of %d bytes", lambdaMaxResponse), r.Method), nil
		}
		return out, nil
	}
}

// LambdaEventHandler runs h as an AWS Lambda function behind any of API
// Gateway's proxy integrations: an HTTP API or function URL (payload 2.0,
// LambdaHandler), or a REST API or an HTTP API on payload 1.0
// (LambdaProxyHandler); it tells them apart by the event's version field,
// which payload 2.0 always gives as "2.0". Pass it to lambda.Start.
func LambdaEventHandler(h http.Handler) func(context.Context, json.RawMessage) (any, error) {
	v2, v1 := LambdaHandler(h), LambdaProxyHandler(h)
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		var probe struct {
			Version string `json:"version"`
		}
		if err := json.Unmarshal(raw, &probe); err != nil {
			return lambdaError(Err(http.StatusBadRequest, CodeInvalidEvent, "the event is not a JSON object"), ""), nil
		}
		if probe.Version == "2.0" {
			var ev events.APIGatewayV2HTTPRequest
			if err := json.Unmarshal(raw, &ev); err != nil {
				return lambdaError(Err(http.StatusBadRequest, CodeInvalidEvent, "the event is not an API Gateway payload 2.0 event"), ""), nil
			}
			return v2(ctx, ev)
		}
		var ev events.APIGatewayProxyRequest
		if err := json.Unmarshal(raw, &ev); err != nil {
			return lambdaV1Response(lambdaError(Err(http.StatusBadRequest, CodeInvalidEvent, "the event is not an API Gateway proxy event"), "")), nil
		}
		return v1(ctx, ev)
	}
}

// LambdaProxyHandler runs h as an AWS Lambda function behind an API Gateway
// REST API's proxy integration, or an HTTP API on payload format 1.0. The
// event is read as the payload 2.0 event it stands for, and served as
// LambdaHandler serves one: multi-value headers joined with commas, the
// query string rebuilt from its parameters (API Gateway gives them decoded),
// the path as API Gateway gives it (without the stage), and the caller's
// identity from the request context's identity (IAM) or authorizer claims
// (JWT). Set-Cookie goes back in multiValueHeaders. A REST API passes a
// binary body (an upload, a file's content) base64-encoded only for the
// media types its binaryMediaTypes lists.
func LambdaProxyHandler(h http.Handler) func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
	v2 := LambdaHandler(h)
	return func(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		if ev.HTTPMethod == "" {
			return lambdaV1Response(lambdaError(Err(http.StatusBadRequest, CodeInvalidEvent,
				"the event has no httpMethod: not an API Gateway proxy event"), "")), nil
		}
		headers := make(map[string]string, len(ev.Headers)+len(ev.MultiValueHeaders))
		for k, v := range ev.Headers {
			headers[k] = v
		}
		for k, vs := range ev.MultiValueHeaders {
			if len(vs) > 0 {
				headers[k] = strings.Join(vs, ", ")
			}
		}
		query := url.Values{}
		for k, vs := range ev.MultiValueQueryStringParameters {
			query[k] = vs
		}
		for k, v := range ev.QueryStringParameters {
			if _, ok := query[k]; !ok {
				query.Set(k, v)
			}
		}
		rc := ev.RequestContext
		out, err := v2(withCaller(ctx, v1Identity(&rc)), events.APIGatewayV2HTTPRequest{
			Version: "1.0", RawPath: ev.Path, RawQueryString: query.Encode(), Headers: headers,
			Body: ev.Body, IsBase64Encoded: ev.IsBase64Encoded,
			RequestContext: events.APIGatewayV2HTTPRequestContext{
				DomainName: rc.DomainName, RequestID: rc.RequestID,
				HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: ev.HTTPMethod, Path: ev.Path,
					Protocol: rc.Protocol, SourceIP: rc.Identity.SourceIP},
			},
		})
		return lambdaV1Response(out), err
	}
}

// lambdaV1Response is out in payload 1.0's shape.
func lambdaV1Response(out events.APIGatewayV2HTTPResponse) events.APIGatewayProxyResponse {
	r := events.APIGatewayProxyResponse{StatusCode: out.StatusCode, Headers: out.Headers, Body: out.Body, IsBase64Encoded: out.IsBase64Encoded}
	if len(out.Cookies) > 0 {
		r.MultiValueHeaders = map[string][]string{"Set-Cookie": out.Cookies}
	}
	return r
}

// lambdaMaxResponse is Lambda's limit on a synchronous response, the JSON
// document included. Lambda refuses a larger one, and aws-lambda-go then
// exits the process: better a clear 500 from a function that stays warm.
const lambdaMaxResponse = 6 << 20

// lambdaResponseSize is the size of out as the Lambda client encodes it (JSON
// without HTML escaping). It is only measured when the body could bring it
// near the limit: escaping control characters (\u0001) can multiply a text
// body's size by six.
func lambdaResponseSize(out events.APIGatewayV2HTTPResponse) int {
	if len(out.Body) < lambdaMaxResponse/6-64<<10 {
		return 0
	}
	var n lambdaCounter
	enc := json.NewEncoder(&n)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return 0 // the Lambda client fails on the same error and reports it
	}
	return int(n)
}

// lambdaMaxBody is the largest body sure to fit in a response under
// lambdaMaxResponse: base64 (a binary body is sent so) makes 4 bytes of
// 3, and 64 KiB is left for the headers and the JSON around them.
const lambdaMaxBody = (lambdaMaxResponse - 64<<10) / 4 * 3

type lambdaKey struct{}

// MaxResponseBody is the largest response body r may be answered with:
// lambdaMaxBody when it came through the Lambda adapter, which sends a
// response in one piece; -1, no limit, when the server streams it.
func MaxResponseBody(r *http.Request) int64 {
	if in, _ := r.Context().Value(lambdaKey{}).(bool); in {
		return lambdaMaxBody
	}
	return -1
}

type lambdaCounter int

func (c *lambdaCounter) Write(p []byte) (int, error) {
	*c += lambdaCounter(len(p))
	return len(p), nil
}

// lambdaServe runs h, reporting false if it panicked.
func lambdaServe(h http.Handler, w http.ResponseWriter, r *http.Request) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			ok = false
			// http.ErrAbortHandler is net/http's way to abort a response on
			// purpose; it is not worth a stack trace there either.
			if v != http.ErrAbortHandler {
				slog.ErrorContext(r.Context(), "panic serving a Lambda event", "method", r.Method, "path", r.URL.Path,
					"panic", v, "stack", string(debug.Stack()))
			}
		}
	}()
	h.ServeHTTP(w, r)
	return true
}

// lambdaRequest builds the request net/http's server would have built had the
// client's request reached it directly.
func lambdaRequest(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (*http.Request, error) {
	method := ev.RequestContext.HTTP.Method
	if method == "" {
		return nil, errors.New("the event has no requestContext.http.method: not an API Gateway HTTP API (payload 2.0) or function URL event")
	}
	path := ev.RawPath
	if path == "" {
		path = ev.RequestContext.HTTP.Path
	}
	if path == "" {
		path = "/"
	}
	path = lambdaStripStage(path, ev.RequestContext.Stage, ev.RequestContext.DomainName)
	requestURI := path
	if ev.RawQueryString != "" {
		requestURI += "?" + ev.RawQueryString
	}
	// ParseRequestURI, not Parse: a path starting with "//" is a path here,
	// not a host, exactly as when net/http reads a request line.
	u, err := url.ParseRequestURI(requestURI)
	if err != nil {
		return nil, errors.New("the event's path and query are not a request URI")
	}

	var body []byte
	if ev.IsBase64Encoded {
		if body, err = base64.StdEncoding.DecodeString(ev.Body); err != nil {
			return nil, errors.New("the event's body is marked base64 but does not decode")
		}
	} else {
		body = []byte(ev.Body)
	}

	// NewRequestWithContext checks the method is a valid token; its URL,
	// parsed as a client's, is then replaced by the server-side one. The
	// caller's identity is the authorizer's, from the request context.
	ctx = context.WithValue(withCaller(ctx, v2Identity(&ev.RequestContext)), lambdaKey{}, true)
	r, err := http.NewRequestWithContext(ctx, method, "/", bytes.NewReader(body))
	if err != nil {
		return nil, errors.New("the event's method is not an HTTP method")
	}
	r.URL = u
	r.RequestURI = requestURI
	if proto := ev.RequestContext.HTTP.Protocol; proto != "" {
		if major, minor, ok := http.ParseHTTPVersion(proto); ok {
			r.Proto, r.ProtoMajor, r.ProtoMinor = proto, major, minor
		}
	}

	// Payload 2.0 joins repeated headers with commas, which is what a
	// list-valued header means anyway, so each arrives as one value; the
	// Cookie header is taken out and sent as the cookies list instead.
	for k, v := range ev.Headers {
		r.Header.Set(k, v)
	}
	if len(ev.Cookies) > 0 {
		r.Header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}
	// net/http's server keeps Host out of the header map, and the body is
	// already whole: a Transfer-Encoding or stale Content-Length would only
	// mislead h.
	r.Host = ev.RequestContext.DomainName
	if r.Host == "" {
		r.Host = r.Header.Get("Host")
	}
	r.Header.Del("Host")
	r.Header.Del("Transfer-Encoding")
	if r.Header.Get("Content-Length") != "" || len(body) > 0 {
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	if ip := ev.RequestContext.HTTP.SourceIP; ip != "" {
		// The port is not in the event; 0 keeps RemoteAddr parseable by
		// net.SplitHostPort, as handlers expect.
		r.RemoteAddr = net.JoinHostPort(ip, "0")
	}
	return r, nil
}

// lambdaStripStage removes a named stage's segment from path. API Gateway puts
// it there for requests to the execute-api endpoint
// (https://{api}.execute-api.{region}.amazonaws.com/{stage}/...), but not for
// the $default stage and not through a custom domain, whose mapping chooses the
// stage: stripping only in the first case keeps a route like /v1/... intact
// behind a custom domain whose stage happens to be called v1.
func lambdaStripStage(path, stage, domain string) string {
	if stage == "" || stage == "$default" || !strings.Contains(domain, ".execute-api.") {
		return path
	}
	prefix := "/" + stage
	switch {
	case path == prefix:
		return "/"
	case strings.HasPrefix(path, prefix+"/"):
		return path[len(prefix):]
	}
	return path
}

// lambdaResponseWriter buffers a response the way net/http's server would
// send it: headers fixed at WriteHeader, an implicit 200, a sniffed
// Content-Type, and no body where the status allows none.
type lambdaResponseWriter struct {
	header http.Header
	sent   http.Header // header as of WriteHeader
	status int
	body   bytes.Buffer
}

var _ http.Flusher = (*lambdaResponseWriter)(nil)

func (w *lambdaResponseWriter) Header() http.Header { return w.header }

func (w *lambdaResponseWriter) WriteHeader(code int) {
	// 1xx responses are interim, and API Gateway has no way to send them.
	if w.status != 0 || (code >= 100 && code < 200) {
		return
	}
	w.status = code
	w.sent = w.header.Clone()
}

func (w *lambdaResponseWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !lambdaBodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	return w.body.Write(p)
}

// Flush does nothing: the response leaves as a whole. It is here so that
// handlers and middleware that flush work unchanged.
func (w *lambdaResponseWriter) Flush() {}

func lambdaBodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified && (status < 100 || status >= 200)
}

// event converts the response to payload 2.0: repeated headers joined with
// commas (the format has one value per name), every Set-Cookie in cookies
// (where a joined value would be ambiguous, as cookies' dates hold commas),
// and a body that is text only when it is valid UTF-8 of a textual type,
// base64 otherwise, since the JSON string would alter anything else.
func (w *lambdaResponseWriter) event(method string) events.APIGatewayV2HTTPResponse {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	body := w.body.Bytes()
	if method == http.MethodHead {
		body = nil
	}
	header := w.sent
	_, haveType := header["Content-Type"]
	if !haveType && header.Get("Content-Encoding") == "" && len(body) > 0 {
		header.Set("Content-Type", http.DetectContentType(body))
	}
	out := events.APIGatewayV2HTTPResponse{StatusCode: w.status, Headers: map[string]string{}}
	for k, vs := range header {
		if len(vs) == 0 {
			continue
		}
		if k == "Set-Cookie" {
			out.Cookies = append(out.Cookies, vs...)
			continue
		}
		out.Headers[k] = strings.Join(vs, ", ")
	}
	switch {
	case len(body) == 0:
	case utf8.Valid(body) && lambdaTextual(header.Get("Content-Type")):
		out.Body = string(body)
	default:
		out.Body = base64.StdEncoding.EncodeToString(body)
		out.IsBase64Encoded = true
	}
	return out
}

// lambdaTextual reports whether a body of this content type is text that a
// JSON string carries unchanged once it is valid UTF-8.
func lambdaTextual(contentType string) bool {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "us-ascii") {
		return false
	}
	if strings.HasPrefix(mt, "text/") || strings.HasSuffix(mt, "+json") || strings.HasSuffix(mt, "+xml") {
		return true
	}
	switch mt {
	case "application/json", "application/x-ndjson", "application/xml", "application/javascript",
		"application/x-www-form-urlencoded", "application/yaml":
		return true
	}
	return false
}

// CodeInvalidEvent is the error code of a Lambda event that is not an HTTP
// request (400); only the Lambda function answers it.
const CodeInvalidEvent = "invalid_event"

// lambdaError answers a problem found before h could run, through the
// publisher's own error writer so that the format is the one clients know.
func lambdaError(e *Error, method string) events.APIGatewayV2HTTPResponse {
	w := &lambdaResponseWriter{header: http.Header{}}
	WriteError(w, e)
	return w.event(method)
}
