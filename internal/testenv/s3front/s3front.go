// Package s3front is a proxy in front of the S3 endpoint under test that
// records the requests it forwards, so that a test can count the objects a
// route read, and that checks presigned URLs as S3 does, which the emulator
// does not: fauxqs 2.4.1 serves a presigned GET whatever its signature,
// expiry or Authorization header (checked when this package was written).
//
// A request with X-Amz-Signature in its query is S3's query-string
// authentication (SigV4), and is answered as the S3 API reference says
// (https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html,
// and "Error responses" for the codes):
//   - an Authorization header besides it: 400 InvalidArgument, "Only one
//     auth mechanism allowed";
//   - past X-Amz-Date plus X-Amz-Expires: 403 AccessDenied, "Request has
//     expired";
//   - a signature other than the one the credentials make for the request
//     as it arrived (its method, host, path and query): 403
//     SignatureDoesNotMatch.
//
// Only signatures over the host header alone are checked (what
// PresignGetObject makes); any other is refused 403. Everything else is
// forwarded as it came, and the emulator's answer returned.
package s3front

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// Request is a request the front forwarded, path-style: /{bucket}/{key}.
type Request struct {
	Method string
	Bucket string
	Key    string     // "" for a request of the bucket (a listing)
	Query  url.Values // the query, decoded
}

// Front is the proxy; safe for concurrent use.
type Front struct {
	URL   string // the front's address, http://localhost:{port}
	creds aws.Credentials

	mu   sync.Mutex
	seen []Request
}

// Start serves a front of upstream (an S3 endpoint taking path-style
// requests) until the test ends, checking presigned URLs against creds. It
// is addressed as localhost, not 127.0.0.1, so that it is another host
// than an httptest server: an HTTP client following a redirect to it from
// one drops the Authorization header, as it does on the way to S3.
func Start(t testing.TB, upstream string, creds aws.Credentials) *Front {
	t.Helper()
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	f := &Front{creds: creds}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("X-Amz-Signature") {
			if code, msg, status := f.checkPresigned(r); code != "" {
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(status)
				fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>%s</Message></Error>`, code, msg)
				return
			}
		}
		bucket, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		f.mu.Lock()
		f.seen = append(f.seen, Request{Method: r.Method, Bucket: bucket, Key: key, Query: r.URL.Query()})
		f.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.URL = strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	return f
}

// Count is how many of the requests forwarded so far match.
func (f *Front) Count(match func(Request) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.seen {
		if match(r) {
			n++
		}
	}
	return n
}

// Reads matches the GETs of objects whose keys start with prefix.
func Reads(prefix string) func(Request) bool {
	return func(r Request) bool {
		return r.Method == http.MethodGet && r.Key != "" && strings.HasPrefix(r.Key, prefix)
	}
}

// checkPresigned is S3's answer to a presigned request that it refuses
// (code, message, status), or "" for one it serves.
func (f *Front) checkPresigned(r *http.Request) (code, msg string, status int) {
	q := r.URL.Query()
	if r.Header.Get("Authorization") != "" {
		return "InvalidArgument", "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query string parameter or the Authorization header should be specified", http.StatusBadRequest
	}
	signed, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	expires, eerr := strconv.Atoi(q.Get("X-Amz-Expires"))
	cred := strings.Split(q.Get("X-Amz-Credential"), "/") // key/date/region/service/aws4_request
	if err != nil || eerr != nil || len(cred) != 5 || q.Get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" {
		return "AuthorizationQueryParametersError", "X-Amz-Algorithm, X-Amz-Credential, X-Amz-Date and X-Amz-Expires must be given", http.StatusBadRequest
	}
	if time.Now().After(signed.Add(time.Duration(expires) * time.Second)) {
		return "AccessDenied", "Request has expired", http.StatusForbidden
	}
	if q.Get("X-Amz-SignedHeaders") != "host" || cred[0] != f.creds.AccessKeyID {
		return "AccessDenied", "this front checks signatures over the host header by the test's credentials only", http.StatusForbidden
	}
	// Sign the request as it arrived, less the signature's own parameters,
	// with the same time and scope: the signature must come out the same.
	creds := f.creds
	creds.SessionToken = q.Get("X-Amz-Security-Token")
	given := q.Get("X-Amz-Signature")
	for _, k := range []string{"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token"} {
		q.Del(k)
	}
	req, err := http.NewRequestWithContext(context.Background(), r.Method, "http://"+r.Host, nil)
	if err != nil {
		return "AccessDenied", err.Error(), http.StatusForbidden
	}
	req.URL.Path, req.URL.RawPath, req.URL.RawQuery = r.URL.Path, r.URL.RawPath, q.Encode()
	signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true }) // S3 signs the path unescaped twice
	again, _, err := signer.PresignHTTP(context.Background(), creds, req, "UNSIGNED-PAYLOAD", cred[3], cred[2], signed)
	if err != nil {
		return "AccessDenied", err.Error(), http.StatusForbidden
	}
	au, err := url.Parse(again)
	if err != nil || subtle.ConstantTimeCompare([]byte(au.Query().Get("X-Amz-Signature")), []byte(given)) != 1 {
		return "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided.", http.StatusForbidden
	}
	return "", "", 0
}
