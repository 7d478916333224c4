package localstack_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/localstack"
)

// sqsClient returns a client for the endpoint in AWS_ENDPOINT_URL: the emulator,
// LocalStack, or AWS itself (https://sqs.<region>.amazonaws.com). Nothing here
// depends on which.
func sqsClient(t *testing.T) *sqs.Client {
	t.Helper()
	if os.Getenv("AWS_ENDPOINT_URL") == "" {
		t.Skip("AWS_ENDPOINT_URL not set; run localstack/emulator.sh up and eval \"$(localstack/emulator.sh env)\"")
	}
	cfg, err := awsconfig.Load(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return sqs.NewFromConfig(cfg)
}

// uniquePrefix keeps tests apart from each other and from earlier runs: SQS
// will not re-create a deleted name for 60 seconds.
func uniquePrefix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 5)
	rand.Read(b)
	return "test-" + hex.EncodeToString(b) + "-"
}

// create runs localstack.Create and deletes what it made when the test ends.
func create(t *testing.T, client *sqs.Client, opts localstack.Options) (localstack.URLs, error) {
	t.Helper()
	urls, err := localstack.Create(t.Context(), client, opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := localstack.Delete(ctx, client, urls); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return urls, err
}

func attributes(t *testing.T, client *sqs.Client, url string) map[string]string {
	t.Helper()
	out, err := client.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{
		QueueUrl:       &url,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	})
	if err != nil {
		t.Fatalf("GetQueueAttributes %s: %v", url, err)
	}
	return out.Attributes
}

// pick keeps the attributes a test compares, with the redrive policies decoded
// into comparable values.
func pick(t *testing.T, attrs map[string]string, names ...string) map[string]any {
	t.Helper()
	got := map[string]any{}
	for _, n := range names {
		v, ok := attrs[n]
		if !ok {
			continue
		}
		switch n {
		case "RedrivePolicy", "RedriveAllowPolicy":
			var decoded map[string]any
			if err := json.Unmarshal([]byte(v), &decoded); err != nil {
				t.Fatalf("%s = %q: %v", n, v, err)
			}
			// SQS documents maxReceiveCount as a string and returns a number.
			if c, ok := decoded["maxReceiveCount"].(string); ok {
				var f float64
				if err := json.Unmarshal([]byte(c), &f); err != nil {
					t.Fatalf("maxReceiveCount %q: %v", c, err)
				}
				decoded["maxReceiveCount"] = f
			}
			got[n] = decoded
		default:
			got[n] = v
		}
	}
	return got
}

func TestCreate(t *testing.T) {
	client := sqsClient(t)
	prefix := uniquePrefix(t)
	urls, err := create(t, client, localstack.Options{Prefix: prefix, MaxReceiveCount: 3, VisibilityTimeout: 45 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for url, name := range map[string]string{urls.Work: "vramq-work", urls.Results: "vramq-results", urls.DLQ: "vramq-dlq"} {
		if !strings.HasSuffix(url, "/"+prefix+name) {
			t.Errorf("URL %q does not end in /%s%s", url, prefix, name)
		}
	}

	work := attributes(t, client, urls.Work)
	results := attributes(t, client, urls.Results)
	dlq := attributes(t, client, urls.DLQ)

	names := []string{"VisibilityTimeout", "ReceiveMessageWaitTimeSeconds", "MessageRetentionPeriod", "MaximumMessageSize",
		"RedrivePolicy", "RedriveAllowPolicy"}
	tests := []struct {
		queue string
		got   map[string]string
		want  map[string]any
	}{
		{"work", work, map[string]any{
			"VisibilityTimeout":             "45",
			"ReceiveMessageWaitTimeSeconds": "20",
			"MessageRetentionPeriod":        "345600",
			"MaximumMessageSize":            "1048576",
			"RedrivePolicy":                 map[string]any{"deadLetterTargetArn": dlq["QueueArn"], "maxReceiveCount": float64(3)},
		}},
		{"results", results, map[string]any{
			"VisibilityTimeout":             "30",
			"ReceiveMessageWaitTimeSeconds": "20",
			"MessageRetentionPeriod":        "345600",
			"MaximumMessageSize":            "1048576",
		}},
		{"dlq", dlq, map[string]any{
			"VisibilityTimeout":             "30",
			"ReceiveMessageWaitTimeSeconds": "0",
			"MessageRetentionPeriod":        "1209600",
			"MaximumMessageSize":            "1048576",
			"RedriveAllowPolicy":            map[string]any{"redrivePermission": "byQueue", "sourceQueueArns": []any{work["QueueArn"]}},
		}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, pick(t, tt.got, names...)); diff != "" {
			t.Errorf("%s queue attributes (-want +got):\n%s", tt.queue, diff)
		}
	}
}

func TestCreateIsIdempotent(t *testing.T) {
	client := sqsClient(t)
	opts := localstack.Options{Prefix: uniquePrefix(t)}
	first, err := create(t, client, opts)
	if err != nil {
		t.Fatal(err)
	}
	second, err := create(t, client, opts)
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if first != second {
		t.Errorf("second Create returned %+v, first %+v", second, first)
	}
}

func TestCreateRefusesOtherAttributes(t *testing.T) {
	client := sqsClient(t)
	prefix := uniquePrefix(t)
	if _, err := create(t, client, localstack.Options{Prefix: prefix}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		opts    localstack.Options
		wantErr []string
	}{
		{"visibility timeout", localstack.Options{Prefix: prefix, VisibilityTimeout: time.Minute},
			[]string{prefix + "vramq-work", "VisibilityTimeout is 30, want 60"}},
		{"max receive count", localstack.Options{Prefix: prefix, MaxReceiveCount: 9}, []string{prefix + "vramq-work", "RedrivePolicy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Not create: its cleanup would delete the queues the other cases need.
			_, err := localstack.Create(t.Context(), client, tt.opts)
			if err == nil {
				t.Fatal("no error")
			}
			t.Log(err)
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// TestRedriveToDLQ checks the redrive policy end to end: a message received
// maxReceiveCount times and never deleted moves to the dead-letter queue.
func TestRedriveToDLQ(t *testing.T) {
	client := sqsClient(t)
	const maxReceiveCount = 2
	urls, err := create(t, client, localstack.Options{Prefix: uniquePrefix(t), MaxReceiveCount: maxReceiveCount})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	body := "redrive me " + uniquePrefix(t)
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &urls.Work, MessageBody: &body}); err != nil {
		t.Fatal(err)
	}

	// The SDK leaves out a zero WaitTimeSeconds (and a zero VisibilityTimeout on
	// ReceiveMessage), which would mean the queue's 20 s long poll; so poll for 1 s
	// and release each receipt with ChangeMessageVisibility 0, which is always sent.
	receive := func(url string) *types.Message {
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:            &url,
			MaxNumberOfMessages: 1,
			WaitTimeSeconds:     1,
		})
		if err != nil {
			t.Fatalf("ReceiveMessage %s: %v", url, err)
		}
		if len(out.Messages) == 0 {
			return nil
		}
		m := out.Messages[0]
		if *m.Body != body {
			t.Fatalf("received %q from %s, want %q", *m.Body, url, body)
		}
		return &m
	}

	receives := 0
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		// SQS moves a message when a receive finds it over the limit, so keep
		// receiving from the work queue until it shows up in the DLQ.
		if m := receive(urls.Work); m != nil {
			receives++
			if receives > maxReceiveCount {
				t.Fatalf("received %d times from the work queue; maxReceiveCount is %d", receives, maxReceiveCount)
			}
			if _, err := client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
				QueueUrl: &urls.Work, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0,
			}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if receives < maxReceiveCount {
			continue
		}
		if m := receive(urls.DLQ); m != nil {
			return
		}
	}
	t.Fatalf("message not in the dead-letter queue after 30s (received %d times from the work queue)", receives)
}
