// Package s3cond is a reverse proxy for an S3 endpoint (the fauxqs emulator)
// that honours conditional writes as S3 does, where the emulator ignores
// them, and counts the requests that pass.
//
// S3's conditional writes (S3 User Guide, "Add preconditions to S3
// operations with conditional requests"; PutObject API reference): a
// PutObject with If-None-Match: * fails with 412 PreconditionFailed when the
// key has an object; one with If-Match fails with 412 PreconditionFailed
// when the object's ETag is another, and with 404 NoSuchKey when there is
// no object. The check and the write are one atomic step: here, one lock
// held over the check and the forwarded write (and over every other write
// and delete), which is stricter than S3 (which may also answer 409
// ConditionalRequestConflict to a race) and never looser.
package s3cond

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// Proxy is the proxy; URL is the endpoint to give S3 clients (path style).
type Proxy struct {
	URL    string
	target *url.URL
	rp     *httputil.ReverseProxy
	write  sync.Mutex // held over a conditional write's check and the write

	mu     sync.Mutex
	log    []string // "METHOD /bucket/key", in order
	refuse []string // "METHOD /bucket/prefix" answered 403 (Refuse)
}

// New starts a proxy in front of the S3 endpoint target, closed when t ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{target: u, rp: httputil.NewSingleHostReverseProxy(u)}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.log = append(p.log, r.Method+" "+r.URL.Path)
	refused := false
	for _, f := range p.refuse {
		refused = refused || strings.HasPrefix(r.Method+" "+r.URL.Path, f)
	}
	p.mu.Unlock()
	if refused {
		fail(w, http.StatusForbidden, "AccessDenied", "Access Denied")
		return
	}
	if r.Method != http.MethodPut && r.Method != http.MethodDelete && r.Method != http.MethodPost {
		p.rp.ServeHTTP(w, r)
		return
	}
	p.write.Lock()
	defer p.write.Unlock()
	if r.Method == http.MethodPut && r.URL.Query().Get("partNumber") == "" {
		inm, im := r.Header.Get("If-None-Match"), r.Header.Get("If-Match")
		if inm != "" || im != "" {
			etag, exists, err := p.head(r)
			switch {
			case err != nil:
				fail(w, http.StatusBadGateway, "InternalError", err.Error())
				return
			case inm == "*" && exists:
				fail(w, http.StatusPreconditionFailed, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
				return
			case im != "" && !exists:
				fail(w, http.StatusNotFound, "NoSuchKey", "The specified key does not exist.")
				return
			case im != "" && im != etag:
				fail(w, http.StatusPreconditionFailed, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
				return
			}
		}
	}
	p.rp.ServeHTTP(w, r)
}

// head is the ETag of r's object upstream, and whether it exists.
func (p *Proxy) head(r *http.Request) (string, bool, error) {
	u := *p.target
	u.Path, u.RawPath = r.URL.Path, r.URL.RawPath
	req, err := http.NewRequestWithContext(r.Context(), http.MethodHead, u.String(), nil)
	if err != nil {
		return "", false, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", false, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode == http.StatusNotFound {
		return "", false, nil
	}
	return res.Header.Get("ETag"), true, nil
}

// fail answers as S3 answers an error: its XML error document.
func fail(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>`+code+`</Code><Message>`+msg+`</Message></Error>`)
}

// Count is how many requests of method passed for keys of bucket that start
// with prefix.
func (p *Proxy) Count(method, bucket, prefix string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.log {
		if strings.HasPrefix(l, method+" /"+bucket+"/"+prefix) {
			n++
		}
	}
	return n
}

// Reset forgets the requests counted so far, and what Refuse refuses.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log, p.refuse = nil, nil
}

// Refuse answers every request of method for keys of bucket that start with
// prefix with S3's 403 AccessDenied from now on, until Reset: a write that
// fails for good (the SDK does not retry it), which leaves the work as a
// publisher that died there would.
func (p *Proxy) Refuse(method, bucket, prefix string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = append(p.refuse, method+" /"+bucket+"/"+prefix)
}
