// Package edge stands in for the CloudFront distribution that infra/edge.tf
// puts in front of the publisher under Lambda: one origin, the API's, for
// every path but one prefix, which goes to the payload bucket. A test's
// SDK then sees the API and the bucket on one origin, as a client of the
// real edge does.
//
// The bucket's behaviour forwards what CloudFront forwards to an S3 origin
// with the module's policies (CachingDisabled, and an origin request policy
// of all query strings, no headers, no cookies):
//   - the path and the query string as they came (query_string_behavior
//     "all"; a custom policy, since the managed AllViewer policies drop
//     response-content-type and its kin for S3 origins: "Use managed
//     origin request policies", CloudFront Developer Guide);
//   - Host set to the origin's domain name ("HTTP request headers and
//     CloudFront behavior": "sets the value to the domain name of the
//     origin that is associated with the requested object");
//   - no Authorization, which CloudFront removes from the origin request
//     unless a cache policy keys on it ("HTTP 401 status code
//     (Unauthorized)": "CloudFront removes some viewer headers by default,
//     including the Authorization header"), and no cookies;
//   - the conditional and range headers, which it forwards.
//
// Everything else goes to the API as it came, as the managed
// AllViewerExceptHostHeader policy sends it (less the Host, which is the
// API's own here too, both being served by httptest).
package edge

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
)

// forwarded are the viewer headers CloudFront passes to an S3 origin whose
// policies name none ("HTTP request headers and CloudFront behavior").
var forwarded = []string{"If-Match", "If-Modified-Since", "If-None-Match", "If-Range", "If-Unmodified-Since", "Range"}

// Edge is the distribution; safe for concurrent use.
type Edge struct {
	URL string // the edge's address, http://127.0.0.1:{port}: the clients' base URL
	api atomic.Pointer[http.Handler]
}

// Start serves an edge until the test ends: paths under prefix (e.g.
// "/bucket/files/") go to the bucket's origin (an S3 endpoint's base URL),
// the rest to the API that Route names (502 until it does), which may be
// built knowing the edge's URL.
func Start(t testing.TB, prefix, bucket string) *Edge {
	t.Helper()
	origin, err := url.Parse(bucket)
	if err != nil {
		t.Fatal(err)
	}
	s3 := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		out := r.Out
		out.URL.Scheme, out.URL.Host = origin.Scheme, origin.Host
		out.Host = origin.Host
		out.Header = http.Header{}
		for _, h := range forwarded {
			if v := r.In.Header.Values(h); len(v) > 0 {
				out.Header[h] = v
			}
		}
		out.Header.Set("User-Agent", "Amazon CloudFront")
	}}
	e := &Edge{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, prefix) {
			s3.ServeHTTP(w, r)
			return
		}
		api := e.api.Load()
		if api == nil {
			http.Error(w, "no API origin yet", http.StatusBadGateway)
			return
		}
		(*api).ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.URL = srv.URL
	return e
}

// Route sends every path but the bucket's to api.
func (e *Edge) Route(api http.Handler) { e.api.Store(&api) }
