package publisher_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/s3front"
	"github.com/vramq/vramq/publisher/publishertest"
)

// lambdaDownloadsEdged is publishertest.LambdaDownloads on a new env.
func lambdaDownloadsEdged(t *testing.T, edged bool) (s *server, lambdaURL, edgeURL string, front *s3front.Front) {
	t.Helper()
	e := newEnv(t, true)
	d := publishertest.LambdaDownloads(t, e.client, e.urls.Work, e.store, edged)
	return &server{env: e, pub: d.Pub, reg: d.Reg, url: d.URL}, d.LambdaURL, d.EdgeURL, d.Front
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
		f := publishertest.StoreOutputFile(t, s.store, "acme", 6<<20)
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
		cmd.Env = append(cmd.Env, "OPENAI_BASE_URL="+base+"/v1", "OPENAI_API_KEY=key-a", "VRAMQ_FILE_ID="+f.ID)
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
		sum := sha256.Sum256(f.Data)
		if got.Status != 200 || !got.Redirected || got.Host != host.Host || got.Bytes != len(f.Data) || got.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%s, %s: %s; want 200 from %s after a redirect, %d bytes, sha256 %x", via.name, got.SDK, stdout.Bytes(), host.Host, len(f.Data), sum)
		}
	}
}
