package publisher_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/testenv/apigw"
	"github.com/vramq/vramq/publisher/api"
)

// lambdaSeen is what a handler saw of the request the adapter built.
type lambdaSeen struct {
	Method, RequestURI, Path, RawQuery, Host, RemoteAddr, Proto string
	Header                                                      http.Header
	ContentLength                                               int64
	Body                                                        string
}

// lambdaCapture returns a handler that records its request into seen and
// answers 204.
func lambdaCapture(t *testing.T, seen *lambdaSeen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("reading the body: %v", err)
		}
		*seen = lambdaSeen{r.Method, r.RequestURI, r.URL.Path, r.URL.RawQuery, r.Host, r.RemoteAddr, r.Proto, r.Header,
			r.ContentLength, string(b)}
		w.WriteHeader(http.StatusNoContent)
	})
}

// base64Event is ev with its body marked as base64, as API Gateway sends a
// body that is not UTF-8.
func base64Event(ev events.APIGatewayV2HTTPRequest) events.APIGatewayV2HTTPRequest {
	ev.IsBase64Encoded = true
	return ev
}

func TestLambdaRequest(t *testing.T) {
	binary := []byte{0x00, 0xff, 0xfe, 'x', 0x80}
	stage := apigw.Event("GET", "/prod/v1/jobs/j-1", nil, "")
	stage.RequestContext.Stage = "prod"
	customDomain := apigw.Event("GET", "/v1/jobs/j-1", nil, "")
	customDomain.RequestContext.Stage = "v1"
	customDomain.RequestContext.DomainName = "api.example.com"

	for _, tc := range []struct {
		name string
		ev   events.APIGatewayV2HTTPRequest
		want func(*lambdaSeen)
	}{
		{"json post", apigw.Event("POST", "/v1/jobs", map[string]string{"content-type": "application/json", "content-length": "13", "idempotency-key": "k-1"}, `{"items":[1]}`),
			func(s *lambdaSeen) {
				s.Method, s.RequestURI, s.Path, s.Body, s.ContentLength = "POST", "/v1/jobs", "/v1/jobs", `{"items":[1]}`, 13
				s.Header.Set("Content-Type", "application/json")
				s.Header.Set("Content-Length", "13")
				s.Header.Set("Idempotency-Key", "k-1")
			}},
		{"query and escaped path", apigw.Event("GET", "/v1/jobs/a%2Fb?page=2&limit=10&q=a%20b", nil, ""),
			func(s *lambdaSeen) {
				s.Method, s.RequestURI, s.Path, s.RawQuery = "GET", "/v1/jobs/a%2Fb?page=2&limit=10&q=a%20b", "/v1/jobs/a/b", "page=2&limit=10&q=a%20b"
			}},
		{"base64 body", base64Event(apigw.Event("POST", "/v1/jobs", map[string]string{"content-type": "application/octet-stream"}, base64.StdEncoding.EncodeToString(binary))),
			func(s *lambdaSeen) {
				s.Method, s.RequestURI, s.Path, s.Body, s.ContentLength = "POST", "/v1/jobs", "/v1/jobs", string(binary), int64(len(binary))
				s.Header.Set("Content-Type", "application/octet-stream")
				s.Header.Set("Content-Length", "5")
			}},
		{"multi-value header stays joined", apigw.Event("GET", "/healthz", map[string]string{"accept": "application/json,text/plain", "authorization": "Bearer k"}, ""),
			func(s *lambdaSeen) {
				s.Method, s.RequestURI, s.Path = "GET", "/healthz", "/healthz"
				s.Header.Set("Accept", "application/json,text/plain")
				s.Header.Set("Authorization", "Bearer k")
			}},
		{"named stage stripped", stage, func(s *lambdaSeen) { s.Method, s.RequestURI, s.Path = "GET", "/v1/jobs/j-1", "/v1/jobs/j-1" }},
		{"custom domain keeps its path", customDomain, func(s *lambdaSeen) {
			s.Method, s.RequestURI, s.Path, s.Host = "GET", "/v1/jobs/j-1", "/v1/jobs/j-1", "api.example.com"
		}},
		{"double slash is a path", apigw.Event("GET", "//evil.example/x", nil, ""), func(s *lambdaSeen) {
			s.Method, s.RequestURI, s.Path = "GET", "//evil.example/x", "//evil.example/x"
		}},
		{"no rawPath falls back to http.path", func() events.APIGatewayV2HTTPRequest {
			ev := apigw.Event("GET", "/metrics", nil, "")
			ev.RawPath = ""
			return ev
		}(), func(s *lambdaSeen) { s.Method, s.RequestURI, s.Path = "GET", "/metrics", "/metrics" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got lambdaSeen
			resp, err := api.LambdaHandler(lambdaCapture(t, &got))(t.Context(), tc.ev)
			if err != nil || resp.StatusCode != http.StatusNoContent {
				t.Fatalf("got %d, %v; want 204 from the handler", resp.StatusCode, err)
			}
			want := lambdaSeen{Host: apigw.Domain, RemoteAddr: apigw.SourceIP + ":0", Proto: "HTTP/1.1", Header: http.Header{
				"Accept": {"*/*"}, "User-Agent": {"curl/8.5.0"}, "X-Amzn-Trace-Id": {"Root=1-65f0c0de-0123456789abcdef01234567"},
				"X-Forwarded-Proto": {"https"}, "X-Forwarded-For": {apigw.SourceIP}, "X-Forwarded-Port": {"443"}}}
			tc.want(&want)
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("request (-want +got):\n%s", d)
			}
		})
	}
}

func TestLambdaRequestCookiesAndContext(t *testing.T) {
	ev := apigw.Event("GET", "/v1/jobs/j-1", nil, "")
	ev.Cookies = []string{"session=abc", "theme=dark"}
	deadline := time.Now().Add(time.Minute)
	ctx, cancel := context.WithDeadline(lambdacontext.NewContext(t.Context(), &lambdacontext.LambdaContext{AwsRequestID: "req-1"}), deadline)
	defer cancel()

	var cookies []*http.Cookie
	var requestID string
	var gotDeadline time.Time
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cookies = r.Cookies()
		if lc, ok := lambdacontext.FromContext(r.Context()); ok {
			requestID = lc.AwsRequestID
		}
		gotDeadline, _ = r.Context().Deadline()
	})
	if _, err := api.LambdaHandler(h)(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if len(cookies) != 2 || cookies[0].String() != "session=abc" || cookies[1].String() != "theme=dark" {
		t.Errorf("cookies %v; want session=abc and theme=dark", cookies)
	}
	if requestID != "req-1" || !gotDeadline.Equal(deadline) {
		t.Errorf("the handler saw request id %q and deadline %v; want the invocation's (req-1, %v)", requestID, gotDeadline, deadline)
	}
}

func TestLambdaResponse(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	for _, tc := range []struct {
		name   string
		method string
		h      http.HandlerFunc
		want   events.APIGatewayV2HTTPResponse
	}{
		{"json", "POST", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, `{"job_id":"j-1","chunks":3}`)
		}, events.APIGatewayV2HTTPResponse{StatusCode: 202, Headers: map[string]string{"Content-Type": "application/json"},
			Body: `{"job_id":"j-1","chunks":3}`}},
		{"implicit 200, sniffed type", "GET", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "ok\n")
		}, events.APIGatewayV2HTTPResponse{StatusCode: 200, Headers: map[string]string{"Content-Type": "text/plain; charset=utf-8"},
			Body: "ok\n"}},
		{"multi-value headers joined, cookies apart", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("Vary", "Accept")
			w.Header().Add("Vary", "Authorization")
			http.SetCookie(w, &http.Cookie{Name: "a", Value: "1", Expires: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)})
			http.SetCookie(w, &http.Cookie{Name: "b", Value: "2", HttpOnly: true})
			w.WriteHeader(http.StatusOK)
		}, events.APIGatewayV2HTTPResponse{StatusCode: 200, Headers: map[string]string{"Vary": "Accept, Authorization"},
			Cookies: []string{"a=1; Expires=Wed, 02 Jan 2030 03:04:05 GMT", "b=2; HttpOnly"}}},
		{"binary body is base64", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(png)
		}, events.APIGatewayV2HTTPResponse{StatusCode: 200, Headers: map[string]string{"Content-Type": "image/png"},
			Body: base64.StdEncoding.EncodeToString(png), IsBase64Encoded: true}},
		{"invalid UTF-8 labelled text is base64", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte{'a', 0xff})
		}, events.APIGatewayV2HTTPResponse{StatusCode: 200, Headers: map[string]string{"Content-Type": "text/plain"}, Body: "Yf8=",
			IsBase64Encoded: true}},
		{"prometheus text stays text", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = io.WriteString(w, "vramq_up 1\n")
		}, events.APIGatewayV2HTTPResponse{StatusCode: 200,
			Headers: map[string]string{"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}, Body: "vramq_up 1\n"}},
		{"headers changed after WriteHeader are not sent", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Header().Set("X-Late", "1")
			_, _ = io.WriteString(w, `{}`)
		}, events.APIGatewayV2HTTPResponse{StatusCode: 404, Headers: map[string]string{"Content-Type": "application/json"}, Body: `{}`}},
		{"no body on 204", "DELETE", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
			if _, err := io.WriteString(w, "x"); err != http.ErrBodyNotAllowed {
				t.Errorf("writing a 204 body: %v; want http.ErrBodyNotAllowed", err)
			}
		}, events.APIGatewayV2HTTPResponse{StatusCode: 204, Headers: map[string]string{}}},
		{"no body for HEAD", "HEAD", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "ok")
		}, events.APIGatewayV2HTTPResponse{StatusCode: 200, Headers: map[string]string{"Content-Type": "text/plain"}}},
		{"panic is a 500", "GET", func(w http.ResponseWriter, r *http.Request) {
			panic("boom")
		}, events.APIGatewayV2HTTPResponse{StatusCode: 500,
			Headers: map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
			Body:    `{"error":{"code":"internal","message":"internal error"}}` + "\n"}},
		{"HTML characters are not escaped, so 5 MiB of them fit", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, strings.Repeat("<", 5<<20))
		}, events.APIGatewayV2HTTPResponse{StatusCode: 200, Headers: map[string]string{"Content-Type": "text/html"},
			Body: strings.Repeat("<", 5<<20)}},
		{"over Lambda's 6 MB is a 500", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `"`+strings.Repeat("\x01", 1<<20)+`"`) // 6 MiB once JSON escapes it
		}, events.APIGatewayV2HTTPResponse{StatusCode: 500,
			Headers: map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
			Body:    `{"error":{"code":"internal","message":"the response is larger than AWS Lambda's limit of 6291456 bytes"}}` + "\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := api.LambdaHandler(tc.h)(t.Context(), apigw.Event(tc.method, "/", nil, ""))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("response (-want +got):\n%s", d)
			}
		})
	}
}

func TestLambdaMalformedEvent(t *testing.T) {
	noMethod := apigw.Event("", "/v1/jobs", nil, "{}")
	badBase64 := base64Event(apigw.Event("POST", "/v1/jobs", nil, "not base64!"))
	badMethod := apigw.Event("GE T", "/v1/jobs", nil, "")
	badPath := apigw.Event("GET", "v1/jobs", nil, "")
	var empty events.APIGatewayV2HTTPRequest
	for name, ev := range map[string]events.APIGatewayV2HTTPRequest{
		"no method": noMethod, "bad base64": badBase64, "bad method": badMethod, "relative path": badPath, "empty event": empty,
	} {
		t.Run(name, func(t *testing.T) {
			h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran for a malformed event") })
			resp, err := api.LambdaHandler(h)(t.Context(), ev)
			if err != nil {
				t.Fatalf("a malformed event is a function error (API Gateway answers a bare 500): %v", err)
			}
			var e struct {
				Error struct{ Code, Message string }
			}
			if resp.StatusCode != http.StatusBadRequest || json.Unmarshal([]byte(resp.Body), &e) != nil || e.Error.Code != api.CodeInvalidEvent || e.Error.Message == "" {
				t.Errorf("got %d %s; want 400 with an invalid_event JSON error", resp.StatusCode, resp.Body)
			}
		})
	}
}

// A function URL sends the same JSON as payload 2.0 and reads the response
// as its own: check both directions through the wire format, not the types.
func TestLambdaFunctionURL(t *testing.T) {
	in, err := json.Marshal(events.LambdaFunctionURLRequest{
		Version: "2.0", RawPath: "/v1/jobs", RawQueryString: "dry_run=1", Cookies: []string{"s=1"},
		Headers: map[string]string{"content-type": "application/json", "host": "abcdefg.lambda-url.eu-west-1.on.aws"},
		Body:    base64.StdEncoding.EncodeToString([]byte(`{"items":[]}`)), IsBase64Encoded: true,
		RequestContext: events.LambdaFunctionURLRequestContext{
			AccountID: "123456789012", RequestID: "r-1", APIID: "abcdefg", DomainName: "abcdefg.lambda-url.eu-west-1.on.aws",
			DomainPrefix: "abcdefg",
			HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: "POST", Path: "/v1/jobs", Protocol: "HTTP/1.1",
				SourceIP: "198.51.100.7"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ev events.APIGatewayV2HTTPRequest
	if err := json.Unmarshal(in, &ev); err != nil {
		t.Fatal(err)
	}
	var got lambdaSeen
	resp, err := api.LambdaHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = lambdaSeen{Method: r.Method, RequestURI: r.RequestURI, Host: r.Host, RemoteAddr: r.RemoteAddr, Body: string(b)}
		if c, err := r.Cookie("s"); err != nil || c.Value != "1" {
			t.Errorf("cookie s: %v, %v", c, err)
		}
		w.Header().Set("Content-Type", "application/json")
		http.SetCookie(w, &http.Cookie{Name: "t", Value: "2"})
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":{"code":"empty_items","message":"no items"}}`)
	}))(t.Context(), ev)
	if err != nil {
		t.Fatal(err)
	}
	want := lambdaSeen{Method: "POST", RequestURI: "/v1/jobs?dry_run=1", Host: "abcdefg.lambda-url.eu-west-1.on.aws",
		RemoteAddr: "198.51.100.7:0", Body: `{"items":[]}`}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("request (-want +got):\n%s", d)
	}

	out, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var fu events.LambdaFunctionURLResponse
	if err := json.Unmarshal(out, &fu); err != nil {
		t.Fatal(err)
	}
	wantResp := events.LambdaFunctionURLResponse{StatusCode: 422, Headers: map[string]string{"Content-Type": "application/json"},
		Body: `{"error":{"code":"empty_items","message":"no items"}}`, Cookies: []string{"t=2"}}
	if d := cmp.Diff(wantResp, fu); d != "" {
		t.Errorf("function URL response (-want +got):\n%s", d)
	}
}

// The adapter must not depend on the string form of headers in the event:
// API Gateway lower-cases names, a test or another proxy might not.
func TestLambdaHeaderCase(t *testing.T) {
	var got http.Header
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header })
	ev := apigw.Event("GET", "/", map[string]string{"X-Api-Key": "k", "content-TYPE": "text/plain"}, "")
	if _, err := api.LambdaHandler(h)(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if got.Get("x-api-key") != "k" || got.Get("Content-Type") != "text/plain" {
		t.Errorf("headers %v; want X-Api-Key and Content-Type canonicalised", got)
	}
	if _, ok := got["Host"]; ok || !strings.Contains(got.Get("User-Agent"), "curl") {
		t.Errorf("headers %v; want no Host (it is in r.Host) and the user agent", got)
	}
}

// A REST API's proxy event (payload 1.0) becomes the request a payload 2.0
// event of the same call would: repeated query parameters and headers kept
// (API Gateway gives both decoded, in multi-value maps), the path without
// the stage, the body decoded from base64; the response comes back in
// payload 1.0's shape, each Set-Cookie in multiValueHeaders. An event of
// neither shape is a 400 in the publisher's format, not a function error.
func TestLambdaProxyRequest(t *testing.T) {
	var seen lambdaSeen
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lambdaCapture(t, &seen).ServeHTTP(httptest.NewRecorder(), r)
		w.Header().Add("Set-Cookie", "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT")
		w.Header().Add("Set-Cookie", "b=2")
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte{0xff, 0x00, 0x01})
	})
	ev := apigw.RESTEvent("POST", "/v1/jobs?x=1&x=2&y=a+b", map[string]string{"content-type": "application/json"}, "")
	ev.MultiValueHeaders["Accept"] = []string{"text/plain", "application/json"}
	ev.Headers["Accept"] = "application/json" // the last, as API Gateway gives it
	ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString([]byte(`{"items":[]}`)), true
	out, err := api.LambdaProxyHandler(h)(t.Context(), ev)
	if err != nil {
		t.Fatal(err)
	}
	if seen.Method != "POST" || seen.Path != "/v1/jobs" || seen.Body != `{"items":[]}` || seen.ContentLength != 12 ||
		seen.Host != apigw.Domain || seen.RemoteAddr != apigw.SourceIP+":0" {
		t.Errorf("request: %+v", seen)
	}
	if q, _ := url.ParseQuery(seen.RawQuery); !cmp.Equal(q, url.Values{"x": {"1", "2"}, "y": {"a b"}}) {
		t.Errorf("query %q; want x=1, x=2 and y=a b", seen.RawQuery)
	}
	if got := seen.Header.Get("Accept"); got != "text/plain, application/json" {
		t.Errorf("Accept %q; want both values", got)
	}
	want := events.APIGatewayProxyResponse{StatusCode: 201,
		Headers:           map[string]string{"Content-Type": "application/octet-stream"},
		MultiValueHeaders: map[string][]string{"Set-Cookie": {"a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT", "b=2"}},
		Body:              base64.StdEncoding.EncodeToString([]byte{0xff, 0x00, 0x01}), IsBase64Encoded: true}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}
	dispatch := api.LambdaEventHandler(h)
	for name, raw := range map[string]string{
		"not an object":           `[1,2]`,
		"no method (payload 1.0)": `{"path":"/v1/jobs"}`,
		"no method (payload 2.0)": `{"version":"2.0","rawPath":"/v1/jobs"}`,
	} {
		res, err := dispatch(t.Context(), json.RawMessage(raw))
		b, _ := json.Marshal(res)
		var got struct {
			StatusCode int    `json:"statusCode"`
			Body       string `json:"body"`
		}
		if err != nil || json.Unmarshal(b, &got) != nil || got.StatusCode != 400 || !strings.Contains(got.Body, `"code":"invalid_event"`) {
			t.Errorf("%s: %s (%v); want 400 invalid_event", name, b, err)
		}
	}
}
