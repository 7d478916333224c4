package apigw

import "testing"

func TestEvent(t *testing.T) {
	for _, tc := range []struct {
		method, target, body string
		headers              map[string]string
		path, query, length  string
		hasLength            bool
	}{
		{method: "GET", target: "/v1/jobs/a%2Fb?page=2&q=a%20b", path: "/v1/jobs/a%2Fb", query: "page=2&q=a%20b"},
		{method: "POST", target: "/v1/jobs", body: `{"items":[]}`, path: "/v1/jobs", length: "12", hasLength: true},
		{method: "PUT", target: "/v1/jobs/j", path: "/v1/jobs/j", length: "0", hasLength: true},
		{method: "DELETE", target: "/v1/jobs/j", path: "/v1/jobs/j"},
		{method: "POST", target: "/", body: "AP/+eIA=", headers: map[string]string{"content-length": "5"}, path: "/", length: "5", hasLength: true},
	} {
		ev := Event(tc.method, tc.target, tc.headers, tc.body)
		length, hasLength := ev.Headers["content-length"]
		if ev.RawPath != tc.path || ev.RequestContext.HTTP.Path != tc.path || ev.RawQueryString != tc.query ||
			ev.RequestContext.HTTP.Method != tc.method || ev.Body != tc.body || length != tc.length || hasLength != tc.hasLength {
			t.Errorf("Event(%s, %s, %v, %q): path %q/%q, query %q, method %q, body %q, content-length %q (%v)", tc.method, tc.target,
				tc.headers, tc.body, ev.RawPath, ev.RequestContext.HTTP.Path, ev.RawQueryString, ev.RequestContext.HTTP.Method,
				ev.Body, length, hasLength)
		}
		if ev.Headers["host"] != Domain || ev.RequestContext.HTTP.SourceIP != SourceIP {
			t.Errorf("host %q, source %q", ev.Headers["host"], ev.RequestContext.HTTP.SourceIP)
		}
	}
}
