package sdkclients

// Moved from the publisher's package (issue 32, item 4): what openai-go
// does with the publisher's redirect of a large download.

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/vramq/vramq/internal/testenv/s3front"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/publishertest"
)

// downloads is publishertest.LambdaDownloads on fresh queues and a bucket.
func downloads(t *testing.T, edged bool) *publishertest.Downloads {
	t.Helper()
	b := newBare(t)
	return publishertest.LambdaDownloads(t, b.client, b.urls.Work, b.store, edged)
}

// followingDoer is a net/http client as an HTTP doer of the OpenAI SDK for
// Go (option.WithHTTPClient takes any type with Do): the SDK then checks the
// origin of the request it makes, but leaves redirects to the client,
// which follows one to another host without the Authorization header.
type followingDoer struct{ c *http.Client }

func (d followingDoer) Do(r *http.Request) (*http.Response, error) { return d.c.Do(r) }

// Issue 34, item 6: a file too large for Lambda's 6 MB response (a batch's
// output file of 6 MiB here) is answered under Lambda by a 307 to a
// presigned URL of its content, and streams whole from the HTTP server.
// The OpenAI SDK for Go (v3.98.0) refuses, by design, to follow a redirect
// to another origin with its own transport ("request URL origin must match
// the configured base URL", internal/requestconfig/origin.go): given a
// net/http client as its HTTP doer, it follows it, and the client drops
// the bearer key on the way to S3's host (else S3, the front, would answer
// 400). The redirect's URL is good for 5 minutes, signed for a plain GET
// of the file's key, and S3 (the front, as S3 does) refuses it altered or
// with an Authorization header.
func TestLargeDownloadUnderLambdaRedirectsToS3(t *testing.T) {
	t.Parallel()
	d := downloads(t, false)
	lambdaURL, front := d.LambdaURL, d.Front
	f := publishertest.StoreOutputFile(t, d.Store, "acme", 6<<20)

	for _, mode := range []struct {
		name, url string
		opts      []option.RequestOption
		refused   bool
	}{
		{"HTTP server", d.URL, nil, false},
		{"Lambda, the SDK's own transport", lambdaURL, nil, true},
		{"Lambda, a net/http doer", lambdaURL, []option.RequestOption{option.WithHTTPClient(followingDoer{&http.Client{}})}, false},
	} {
		c := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(mode.url + "/v1/"), option.WithAPIKey("key-a"),
			option.WithMaxRetries(0)}, mode.opts...)...)
		res, err := c.Files.Content(t.Context(), f.ID)
		if mode.refused {
			if err == nil || !strings.Contains(err.Error(), "origin must match") {
				t.Errorf("%s: Content: %v; want the SDK's refusal of a redirect to another origin (if it follows now, docs/api.md says otherwise)", mode.name, err)
			}
			if err == nil {
				res.Body.Close()
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: Content: %s", mode.name, sdkAPIError(err))
		}
		got, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || !bytes.Equal(got, f.Data) {
			t.Errorf("%s: Content: %d bytes (%v); want the file's %d", mode.name, len(got), err, len(f.Data))
		}
	}

	// The redirect itself.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(t.Context(), "GET", lambdaURL+"/v1/files/"+f.ID+"/content", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer key-a")
	res, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	loc, err := url.Parse(res.Header.Get("Location"))
	if res.StatusCode != http.StatusTemporaryRedirect || err != nil || res.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("GET content under Lambda: %d, Location %q, Cache-Control %q; want 307 to a presigned URL, no-store",
			res.StatusCode, res.Header.Get("Location"), res.Header.Get("Cache-Control"))
	}
	q := loc.Query()
	wantPath := "/" + d.Store.Bucket() + "/" + job.FileKey("acme", f.ID)
	if loc.Scheme+"://"+loc.Host != front.URL || loc.Path != wantPath || q.Get("X-Amz-Expires") != "300" ||
		q.Get("X-Amz-Signature") == "" || q.Get("X-Amz-SignedHeaders") != "host" {
		t.Errorf("Location %s; want a GET of %s%s presigned for 300 s", loc, front.URL, wantPath)
	}
	get := func(u string, header map[string]string) (int, []byte) {
		req, err := http.NewRequestWithContext(t.Context(), "GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	if status, b := get(loc.String(), nil); status != 200 || !bytes.Equal(b, f.Data) {
		t.Errorf("the presigned URL: %d, %d bytes; want 200 and the file", status, len(b))
	}
	if status, b := get(loc.String(), map[string]string{"Authorization": "Bearer key-a"}); status != 400 || !bytes.Contains(b, []byte("InvalidArgument")) {
		t.Errorf("the presigned URL with the bearer key: %d %s; want S3's 400 InvalidArgument", status, b)
	}
	tampered := *loc
	tq := tampered.Query()
	tq.Set("response-content-type", "text/html")
	tampered.RawQuery = tq.Encode()
	if status, b := get(tampered.String(), nil); status != 403 || !bytes.Contains(b, []byte("SignatureDoesNotMatch")) {
		t.Errorf("the presigned URL, altered: %d %s; want S3's 403 SignatureDoesNotMatch", status, b)
	}

	// A HEAD is answered with the file's size, not sent away: a GET's URL
	// would not sign it.
	req, err = http.NewRequestWithContext(t.Context(), "HEAD", lambdaURL+"/v1/files/"+f.ID+"/content", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer key-a")
	if res, err := noFollow.Do(req); err != nil || res.StatusCode != 200 || res.Header.Get("Content-Length") != fmt.Sprint(len(f.Data)) {
		t.Errorf("HEAD under Lambda: %v %v", err, res)
	}
}

// Issue 34, item 6: the OpenAI SDK for Go with its default options, whose
// transport refuses any request off its base URL's origin, downloads a
// file too large for Lambda's response through the edge (infra/edge.tf):
// the publisher, told the edge's origin (PublicURL), redirects to the
// presigned URL's path and query there, and the edge serves it from the
// bucket. The SDK's client keeps the bearer key on a redirect within the
// origin; the edge leaves it out of the request to S3, as CloudFront does,
// or S3 (the front) would refuse two kinds of authentication (400).
func TestLargeDownloadUnderLambdaThroughTheEdgeWithTheGoSDK(t *testing.T) {
	t.Parallel()
	d := downloads(t, true)
	edgeURL, front := d.EdgeURL, d.Front
	f := publishertest.StoreOutputFile(t, d.Store, "acme", 6<<20+1)

	c := openai.NewClient(option.WithBaseURL(edgeURL+"/v1/"), option.WithAPIKey("key-a"), option.WithMaxRetries(0))
	res, err := c.Files.Content(t.Context(), f.ID)
	if err != nil {
		t.Fatalf("Content through the edge, the SDK's default client: %s", sdkAPIError(err))
	}
	got, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || !bytes.Equal(got, f.Data) {
		t.Errorf("Content through the edge: %d bytes (%v); want the file's %d", len(got), err, len(f.Data))
	}
	if n := front.Count(s3front.Reads(job.FileKey("acme", f.ID))); n != 1 {
		t.Errorf("S3 served the file %d times through the edge; want once", n)
	}

	// The redirect: the edge's origin, the presigned URL's path and query.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(t.Context(), "GET", edgeURL+"/v1/files/"+f.ID+"/content", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer key-a")
	res, err = noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	loc, err := url.Parse(res.Header.Get("Location"))
	wantPath := "/" + d.Store.Bucket() + "/" + job.FileKey("acme", f.ID)
	if res.StatusCode != http.StatusTemporaryRedirect || err != nil || loc.Scheme+"://"+loc.Host != edgeURL || loc.Path != wantPath ||
		loc.Query().Get("X-Amz-Signature") == "" || loc.Query().Get("X-Amz-Expires") != "300" {
		t.Fatalf("GET content through the edge: %d, Location %q; want 307 to %s%s presigned for 300 s",
			res.StatusCode, res.Header.Get("Location"), edgeURL, wantPath)
	}
	// Altered on the way, it is S3's to refuse, as from its own host.
	tampered := *loc
	tq := tampered.Query()
	tq.Set("X-Amz-Expires", "604800")
	tampered.RawQuery = tq.Encode()
	res, err = http.Get(tampered.String())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 403 || !bytes.Contains(b, []byte("SignatureDoesNotMatch")) {
		t.Errorf("the redirect, altered: %d %s; want S3's 403 SignatureDoesNotMatch", res.StatusCode, b)
	}
}
