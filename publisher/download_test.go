package publisher_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/apigw"
	"github.com/vramq/vramq/internal/testenv/edge"
	"github.com/vramq/vramq/internal/testenv/s3front"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
)

// largeFile is a file of tenant owner's in the bucket of e, stored as a
// batch's output file is (batchfiles.go): its content, then its record.
type largeFile struct {
	id   string
	data []byte
}

// storeOutputFile stores size bytes of JSONL lines as owner's batch_output
// file, straight into the bucket: the Lambda mode's uploads are bounded at
// 4 MiB, but a batch's output file has no such bound.
func storeOutputFile(t *testing.T, e *env, owner string, size int) largeFile {
	t.Helper()
	var line bytes.Buffer
	var data []byte
	for i := 0; len(data) < size; i++ {
		line.Reset()
		fmt.Fprintf(&line, `{"id":"batch_req_%d","custom_id":"c-%d","response":{"status_code":200,"body":{"data":"%s"}},"error":null}`+"\n",
			i, i, strings.Repeat("x", 900))
		data = append(data, line.Bytes()...)
	}
	var rnd [10]byte
	_, _ = rand.Read(rnd[:])
	now := time.Now()
	id := fmt.Sprintf("file-%012x%s", now.UnixMilli(), hex.EncodeToString(rnd[:]))
	rec := fmt.Sprintf(`{"v":1,"id":%q,"owner":%q,"filename":"big_output.jsonl","bytes":%d,"lines":1,"purpose":"batch_output","created_at":%d,"expires_at":%d}`,
		id, owner, len(data), now.Unix(), now.Add(time.Hour).Unix())
	if _, err := e.store.Put(t.Context(), job.FileKey(owner, id), data); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Put(t.Context(), job.FileRecordKey(owner, id), []byte(rec)); err != nil {
		t.Fatal(err)
	}
	return largeFile{id, data}
}

// lambdaDownloads is a publisher with key key-a (tenant acme) both served
// over HTTP (s.url) and run as a Lambda function behind an HTTP API
// (lambdaURL), whose bucket it reaches through an S3 front that checks
// presigned URLs as S3 does.
func lambdaDownloads(t *testing.T) (s *server, lambdaURL string, front *s3front.Front) {
	t.Helper()
	s, lambdaURL, _, front = lambdaDownloadsEdged(t, false)
	return s, lambdaURL, front
}

// lambdaDownloadsEdged is lambdaDownloads, and with edged an edge in front
// of the HTTP API and the bucket (edgeURL, the publisher's PublicURL), as
// infra/edge.tf's CloudFront distribution is: it routes the bucket's file
// keys to the front, which is path-style here (/{bucket}/files/...) where
// S3's own presigned URLs put the bucket in the host (/files/...).
func lambdaDownloadsEdged(t *testing.T, edged bool) (s *server, lambdaURL, edgeURL string, front *s3front.Front) {
	t.Helper()
	e := newEnv(t, true)
	endpoint := os.Getenv("AWS_ENDPOINT_URL_S3")
	if endpoint == "" {
		endpoint = os.Getenv("AWS_ENDPOINT_URL")
	}
	cfg, err := awsconfig.Load(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := cfg.Credentials.Retrieve(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	front = s3front.Start(t, endpoint, creds)
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.BaseEndpoint, o.UsePathStyle = aws.String(front.URL), true })
	pc := publisher.Config{APIKeys: []string{"acme:key-a"}, Payloads: payload.New(client, e.store.Bucket())}
	var ed *edge.Edge
	if edged {
		ed = edge.Start(t, "/"+e.store.Bucket()+"/"+strings.SplitAfter(job.FilesPrefix("acme"), "/")[0], front.URL)
		pc.PublicURL, edgeURL = ed.URL, ed.URL
	}
	s = e.serve(pc)
	fn := apigw.Handler(publisher.LambdaHandler(s.pub.Handler()))
	lam := httptest.NewServer(fn)
	t.Cleanup(lam.Close)
	if edged {
		ed.Route(fn)
	}
	return s, lam.URL, edgeURL, front
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
	s, lambdaURL, front := lambdaDownloads(t)
	f := storeOutputFile(t, s.env, "acme", 6<<20)

	for _, mode := range []struct {
		name, url string
		opts      []option.RequestOption
		refused   bool
	}{
		{"HTTP server", s.url, nil, false},
		{"Lambda, the SDK's own transport", lambdaURL, nil, true},
		{"Lambda, a net/http doer", lambdaURL, []option.RequestOption{option.WithHTTPClient(followingDoer{&http.Client{}})}, false},
	} {
		c := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(mode.url + "/v1/"), option.WithAPIKey("key-a"),
			option.WithMaxRetries(0)}, mode.opts...)...)
		res, err := c.Files.Content(t.Context(), f.id)
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
		if err != nil || !bytes.Equal(got, f.data) {
			t.Errorf("%s: Content: %d bytes (%v); want the file's %d", mode.name, len(got), err, len(f.data))
		}
	}

	// The redirect itself.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(t.Context(), "GET", lambdaURL+"/v1/files/"+f.id+"/content", nil)
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
	wantPath := "/" + s.store.Bucket() + "/" + job.FileKey("acme", f.id)
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
	if status, b := get(loc.String(), nil); status != 200 || !bytes.Equal(b, f.data) {
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
	req, err = http.NewRequestWithContext(t.Context(), "HEAD", lambdaURL+"/v1/files/"+f.id+"/content", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer key-a")
	if res, err := noFollow.Do(req); err != nil || res.StatusCode != 200 || res.Header.Get("Content-Length") != fmt.Sprint(len(f.data)) {
		t.Errorf("HEAD under Lambda: %v %v", err, res)
	}
}

// The same download with the official JavaScript SDK (download.mjs), from
// the HTTP API and through the edge: its fetch follows the redirect, to
// S3's host or within the edge's origin, drops the bearer key on the way
// to S3's host or has the edge drop it (or S3, the front, would answer
// 400), and reads the whole file.
func TestLargeDownloadUnderLambdaWithTheJavaScriptSDK(t *testing.T) {
	t.Parallel()
	node := jsNode(t)
	for _, via := range []struct {
		name  string
		edged bool
	}{{"the HTTP API", false}, {"the edge", true}} {
		s, base, edgeURL, front := lambdaDownloadsEdged(t, via.edged)
		f := storeOutputFile(t, s.env, "acme", 6<<20)
		dest := front.URL // where the redirect ends
		if via.edged {
			base, dest = edgeURL, edgeURL
		}
		host, err := url.Parse(dest)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		cmd := exec.CommandContext(ctx, node, "download.mjs")
		cmd.Dir = jsClientDir
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "OPENAI_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, "OPENAI_BASE_URL="+base+"/v1", "OPENAI_API_KEY=key-a", "VRAMQ_FILE_ID="+f.id)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		cancel()
		if err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				t.Fatalf("%s: node download.mjs exited %d:\n%s%s", via.name, exit.ExitCode(), stderr.Bytes(), stdout.Bytes())
			}
			t.Fatalf("%s: node download.mjs: %v\n%s", via.name, err, stderr.Bytes())
		}
		var got struct {
			SDK        string `json:"sdk"`
			Status     int    `json:"status"`
			Redirected bool   `json:"redirected"`
			Host       string `json:"host"`
			Bytes      int    `json:"bytes"`
			SHA256     string `json:"sha256"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
			t.Fatalf("%s: download.mjs printed %q: %v", via.name, stdout.Bytes(), err)
		}
		sum := sha256.Sum256(f.data)
		if got.Status != 200 || !got.Redirected || got.Host != host.Host || got.Bytes != len(f.data) || got.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%s, %s: %s; want 200 from %s after a redirect, %d bytes, sha256 %x", via.name, got.SDK, stdout.Bytes(), host.Host, len(f.data), sum)
		}
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
	s, _, edgeURL, front := lambdaDownloadsEdged(t, true)
	f := storeOutputFile(t, s.env, "acme", 6<<20+1)

	c := openai.NewClient(option.WithBaseURL(edgeURL+"/v1/"), option.WithAPIKey("key-a"), option.WithMaxRetries(0))
	res, err := c.Files.Content(t.Context(), f.id)
	if err != nil {
		t.Fatalf("Content through the edge, the SDK's default client: %s", sdkAPIError(err))
	}
	got, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || !bytes.Equal(got, f.data) {
		t.Errorf("Content through the edge: %d bytes (%v); want the file's %d", len(got), err, len(f.data))
	}
	if n := front.Count(s3front.Reads(job.FileKey("acme", f.id))); n != 1 {
		t.Errorf("S3 served the file %d times through the edge; want once", n)
	}

	// The redirect: the edge's origin, the presigned URL's path and query.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(t.Context(), "GET", edgeURL+"/v1/files/"+f.id+"/content", nil)
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
	wantPath := "/" + s.store.Bucket() + "/" + job.FileKey("acme", f.id)
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

// sdkAPIError shows an error of the SDK with its body, which its Error hides.
func sdkAPIError(err error) string {
	var e *openai.Error
	if errors.As(err, &e) {
		return fmt.Sprintf("%d %s", e.StatusCode, e.RawJSON())
	}
	return fmt.Sprint(err)
}
