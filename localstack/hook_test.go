package localstack_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/localstack"
)

const hookPath = "init/ready.d/vramq-queues.py"

// TestHookReadsQueuesJSON checks, without Docker, that the LocalStack hook takes
// its queues from the file docker-compose.yml mounts, and keeps no copy of its own.
func TestHookReadsQueuesJSON(t *testing.T) {
	hook := readFile(t, hookPath)
	compose := readFile(t, "docker-compose.yml")

	m := regexp.MustCompile(`"VRAMQ_QUEUES_FILE",\s*"([^"]+)"`).FindStringSubmatch(hook)
	if m == nil {
		t.Fatalf("%s: no default for VRAMQ_QUEUES_FILE", hookPath)
	}
	mounted := regexp.MustCompile(`(?m)^\s*-\s*"?\./queues\.json:([^:"\s]+)`).FindStringSubmatch(compose)
	if mounted == nil {
		t.Fatal("docker-compose.yml does not mount ./queues.json")
	}
	if mounted[1] != m[1] {
		t.Errorf("docker-compose.yml mounts queues.json at %s, the hook reads %s", mounted[1], m[1])
	}
	if !regexp.MustCompile(`(?m)^\s*-\s*"?\./init/ready\.d:/etc/localstack/init/ready\.d\b`).MatchString(compose) {
		t.Error("docker-compose.yml does not mount ./init/ready.d at /etc/localstack/init/ready.d")
	}
	if !regexp.MustCompile(`(?m)^\s*image:\s*localstack/localstack:4\.\d+\.\d+\s*$`).MatchString(compose) {
		t.Error("docker-compose.yml does not pin a localstack/localstack:4.x.y image")
	}

	// A name or a distinctive value in the hook would be a second source of truth.
	d := localstack.Definitions()
	for _, q := range []localstack.Queue{d.Work, d.Results, d.DLQ} {
		if strings.Contains(hook, q.Name) {
			t.Errorf("%s names queue %s itself; it must come from queues.json", hookPath, q.Name)
		}
		for name, v := range q.Attributes {
			if len(v) >= 4 && strings.Contains(hook, v) {
				t.Errorf("%s contains %s's %s value %s; it must come from queues.json", hookPath, q.Name, name, v)
			}
		}
	}
}

// TestHookCreatesTheSameQueues runs the hook outside LocalStack, against the
// test endpoint, and compares what it made with what Create makes; then Create
// must accept the hook's queues as its own.
func TestHookCreatesTheSameQueues(t *testing.T) {
	client := sqsClient(t)
	if err := exec.Command("python3", "-c", "import boto3").Run(); err != nil {
		t.Skipf("python3 with boto3 not available (%v); LocalStack's own Python has it", err)
	}
	queuesFile, err := filepath.Abs("queues.json")
	if err != nil {
		t.Fatal(err)
	}

	hookPrefix := uniquePrefix(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", hookPath)
	cmd.Env = append(os.Environ(), "VRAMQ_QUEUES_FILE="+queuesFile, "VRAMQ_QUEUE_PREFIX="+hookPrefix)
	out, err := cmd.CombinedOutput()
	t.Logf("hook output:\n%s", out)
	hookURLs := urlsFromHookOutput(t, string(out), hookPrefix)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := localstack.Delete(ctx, client, hookURLs); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("hook: %v", err)
	}

	goPrefix := uniquePrefix(t)
	goURLs, err := create(t, client, localstack.Options{Prefix: goPrefix})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"VisibilityTimeout", "ReceiveMessageWaitTimeSeconds", "MessageRetentionPeriod", "MaximumMessageSize",
		"DelaySeconds", "RedrivePolicy", "RedriveAllowPolicy"}
	for _, q := range []struct{ role, hook, go_ string }{
		{"work", hookURLs.Work, goURLs.Work},
		{"results", hookURLs.Results, goURLs.Results},
		{"dlq", hookURLs.DLQ, goURLs.DLQ},
	} {
		if q.hook == "" {
			t.Errorf("hook made no %s queue", q.role)
			continue
		}
		fromHook := attributes(t, client, q.hook)
		// Same queues under another prefix: ARNs in the policies differ by it alone.
		for k, v := range fromHook {
			fromHook[k] = strings.ReplaceAll(v, hookPrefix, goPrefix)
		}
		want := pick(t, attributes(t, client, q.go_), names...)
		if diff := cmp.Diff(want, pick(t, fromHook, names...)); diff != "" {
			t.Errorf("%s queue: hook's attributes differ from Create's (-Create +hook):\n%s", q.role, diff)
		}
	}

	again, err := localstack.Create(t.Context(), client, localstack.Options{Prefix: hookPrefix})
	if err != nil {
		t.Fatalf("Create over the hook's queues: %v", err)
	}
	if again != hookURLs {
		t.Errorf("Create over the hook's queues returned %+v, the hook printed %+v", again, hookURLs)
	}
}

func urlsFromHookOutput(t *testing.T, out, prefix string) localstack.URLs {
	t.Helper()
	var urls localstack.URLs
	for _, line := range strings.Split(out, "\n") {
		name, url, ok := strings.Cut(strings.TrimPrefix(line, "vramq: queue "), ": ")
		if !ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		switch strings.TrimPrefix(name, prefix) {
		case "vramq-work":
			urls.Work = url
		case "vramq-results":
			urls.Results = url
		case "vramq-dlq":
			urls.DLQ = url
		}
	}
	return urls
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
