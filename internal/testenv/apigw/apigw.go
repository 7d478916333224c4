// Package apigw builds the API Gateway HTTP API events (payload 2.0) that
// tests hand the publisher's Lambda handler.
package apigw

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

// The API the events come through, and the client they come from.
const (
	Domain   = "r4nd0m1d.execute-api.us-east-1.amazonaws.com"
	SourceIP = "198.51.100.23"
)

// Event is a request to the $default stage as API Gateway sends it: header
// names in lower case, the Host and forwarding headers, a request context.
// target is the path, with the query after a '?'; headers add to those or
// replace them. A Content-Length comes with a body, and with a POST, PUT or
// PATCH without one, as an HTTP client sends it; headers may give another.
func Event(method, target string, headers map[string]string, body string) events.APIGatewayV2HTTPRequest {
	now := time.Now()
	h := map[string]string{
		"accept": "*/*", "host": Domain, "user-agent": "curl/8.5.0",
		"x-amzn-trace-id": "Root=1-65f0c0de-0123456789abcdef01234567", "x-forwarded-for": SourceIP,
		"x-forwarded-port": "443", "x-forwarded-proto": "https",
	}
	switch method {
	case "POST", "PUT", "PATCH":
		h["content-length"] = strconv.Itoa(len(body))
	default:
		if body != "" {
			h["content-length"] = strconv.Itoa(len(body))
		}
	}
	for k, v := range headers {
		h[k] = v
	}
	path, query, _ := strings.Cut(target, "?")
	return events.APIGatewayV2HTTPRequest{
		Version: "2.0", RouteKey: "$default", RawPath: path, RawQueryString: query, Headers: h, Body: body,
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			RouteKey: "$default", AccountID: "123456789012", Stage: "$default", RequestID: fmt.Sprintf("req-%d", now.UnixNano()),
			APIID: "r4nd0m1d", DomainName: Domain, DomainPrefix: "r4nd0m1d",
			Time: now.UTC().Format("02/Jan/2006:15:04:05 -0700"), TimeEpoch: now.UnixMilli(),
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: method, Path: path, Protocol: "HTTP/1.1",
				SourceIP: SourceIP, UserAgent: "curl/8.5.0"},
		},
	}
}

// RESTEvent is the request of Event as a REST API's proxy integration
// sends it (payload 1.0) through its stage "prod": headers both single-
// and multi-valued, the query as decoded parameters (null without one),
// the path without the stage, which requestContext.path keeps. A REST API
// keeps header names as the client sent them; these are canonical.
func RESTEvent(method, target string, headers map[string]string, body string) events.APIGatewayProxyRequest {
	v2 := Event(method, target, headers, body)
	h := map[string]string{}
	mh := map[string][]string{}
	for k, v := range v2.Headers {
		k = textproto.CanonicalMIMEHeaderKey(k)
		h[k] = v
		mh[k] = []string{v}
	}
	path, query, _ := strings.Cut(target, "?")
	var q map[string]string
	var mq map[string][]string
	if vs, err := url.ParseQuery(query); err == nil && len(vs) > 0 {
		q, mq = map[string]string{}, map[string][]string(vs)
		for k, v := range vs {
			q[k] = v[len(v)-1] // the last value, as API Gateway documents
		}
	}
	rc := v2.RequestContext
	return events.APIGatewayProxyRequest{
		Resource: "/{proxy+}", Path: path, HTTPMethod: method, Headers: h, MultiValueHeaders: mh,
		QueryStringParameters: q, MultiValueQueryStringParameters: mq, Body: body,
		RequestContext: events.APIGatewayProxyRequestContext{
			AccountID: rc.AccountID, Stage: "prod", DomainName: rc.DomainName, DomainPrefix: rc.DomainPrefix,
			RequestID: rc.RequestID, Protocol: "HTTP/1.1", ResourcePath: "/{proxy+}", Path: "/prod" + path,
			HTTPMethod: method, RequestTimeEpoch: rc.TimeEpoch, APIID: rc.APIID,
			Identity: events.APIGatewayRequestIdentity{SourceIP: SourceIP, UserAgent: "curl/8.5.0"},
		},
	}
}

// Handler is an HTTP API in front of the Lambda function fn, for a test's
// HTTP clients: each request becomes the event Event makes of it, its
// headers in lower case and joined with commas, its body base64-encoded (as
// API Gateway sends a body it does not take for text), and fn's response
// becomes the HTTP response. A function error is 500 {"message":"Internal
// Server Error"}, as an HTTP API answers one.
func Handler(fn func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		headers := map[string]string{}
		for k, vs := range r.Header {
			headers[strings.ToLower(k)] = strings.Join(vs, ",")
		}
		ev := Event(r.Method, r.URL.RequestURI(), headers, "")
		if len(body) > 0 {
			ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
		}
		out, err := fn(r.Context(), ev)
		if err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"message":"Internal Server Error"}`)
			return
		}
		for k, v := range out.Headers {
			w.Header().Set(k, v)
		}
		for _, c := range out.Cookies {
			w.Header().Add("Set-Cookie", c)
		}
		b := []byte(out.Body)
		if out.IsBase64Encoded {
			if b, err = base64.StdEncoding.DecodeString(out.Body); err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
		}
		if w.Header().Get("Content-Length") == "" || r.Method != http.MethodHead {
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		}
		w.WriteHeader(out.StatusCode)
		_, _ = w.Write(b)
	})
}
