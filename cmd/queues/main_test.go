package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/localstack"
)

func TestRunRejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // what the error must say: the flag, for a bad value
	}{
		{"unknown flag", []string{"-bogus"}, nil, "bogus"},
		{"extra argument", []string{"extra"}, nil, "extra"},
		{"bad environment", nil, map[string]string{"VRAMQ_MAX_RECEIVE_COUNT": "many"}, "VRAMQ_MAX_RECEIVE_COUNT"},
		{"fractional seconds", []string{"-visibility-timeout", "1500ms"}, nil, "-visibility-timeout (VRAMQ_VISIBILITY_TIMEOUT): 1.5s"},
		{"visibility over 12h", nil, map[string]string{"VRAMQ_VISIBILITY_TIMEOUT": "13h"}, "-visibility-timeout (VRAMQ_VISIBILITY_TIMEOUT)"},
		{"bad prefix", []string{"-prefix", "a/b"}, nil, "-prefix (VRAMQ_PREFIX): \"a/b\""},
		{"prefix too long", []string{"-prefix", strings.Repeat("p", 75)}, nil, "-prefix (VRAMQ_PREFIX)"},
		{"no receives", []string{"-max-receive-count", "0"}, nil, "-max-receive-count (VRAMQ_MAX_RECEIVE_COUNT): 0"},
		{"too many receives", []string{"-max-receive-count", "5000"}, nil, "-max-receive-count (VRAMQ_MAX_RECEIVE_COUNT): 5000"},
		{"bad bucket", []string{"-payload-bucket", "My_Bucket"}, nil, "-payload-bucket (PAYLOAD_BUCKET)"},
		{"events without a bucket", []string{"-events"}, nil, "-events (VRAMQ_EVENTS) needs -payload-bucket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(t.Context(), tt.args, func(k string) string { return tt.env[k] }, &out)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v; want a usage error saying %q", err, tt.want)
			}
			if out.Len() > 0 {
				t.Errorf("printed %q on error", out.String())
			}
		})
	}
	if err := run(t.Context(), []string{"-h"}, func(string) string { return "" }, new(bytes.Buffer)); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: error %v, want flag.ErrHelp", err)
	}
}

func TestRunCreatesQueues(t *testing.T) {
	if os.Getenv("AWS_ENDPOINT_URL") == "" {
		t.Skip("AWS_ENDPOINT_URL not set; run localstack/emulator.sh up and eval \"$(localstack/emulator.sh env)\"")
	}
	b := make([]byte, 5)
	rand.Read(b)
	prefix := "test-" + hex.EncodeToString(b) + "-"
	// The prefix from the environment, the count from a flag: both paths at once.
	getenv := func(k string) string {
		if k == "VRAMQ_PREFIX" {
			return prefix
		}
		return os.Getenv(k)
	}
	var out bytes.Buffer
	err := run(t.Context(), []string{"-max-receive-count", "4", "-visibility-timeout", "90s"}, getenv, &out)

	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("line %q is not NAME=value", line)
		}
		got[k] = v
	}
	cfg, cerr := awsconfig.Load(t.Context(), nil)
	if cerr != nil {
		t.Fatal(cerr)
	}
	client := sqs.NewFromConfig(cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		urls := localstack.URLs{Work: got["QUEUE_URL"], Results: got["RESULTS_QUEUE_URL"], DLQ: got["DLQ_URL"]}
		if err := localstack.Delete(ctx, client, urls); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}

	want := map[string]string{"QUEUE_URL": "vramq-work", "RESULTS_QUEUE_URL": "vramq-results", "DLQ_URL": "vramq-dlq"}
	if len(got) != len(want) {
		t.Errorf("output %q: want exactly %d lines", out.String(), len(want))
	}
	for k, name := range want {
		if !strings.HasSuffix(got[k], "/"+prefix+name) {
			t.Errorf("%s=%q, want a URL ending in /%s%s", k, got[k], prefix, name)
		}
	}

	// The flags reached the queue.
	work := got["QUEUE_URL"]
	attrs, err := client.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{
		QueueUrl: &work, AttributeNames: []types.QueueAttributeName{"VisibilityTimeout", "RedrivePolicy"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := attrs.Attributes["VisibilityTimeout"]; v != "90" {
		t.Errorf("VisibilityTimeout = %s, want 90", v)
	}
	if p := attrs.Attributes["RedrivePolicy"]; !strings.Contains(p, `"maxReceiveCount":4`) && !strings.Contains(p, `"maxReceiveCount":"4"`) {
		t.Errorf("RedrivePolicy = %s, want maxReceiveCount 4", p)
	}
}

// -events makes a topic and a queue subscribed to it: a message published to
// the topic arrives on the queue as its raw body, which is how docs/events.md
// reads the events.
func TestRunCreatesEventsTopic(t *testing.T) {
	if os.Getenv("AWS_ENDPOINT_URL") == "" {
		t.Skip("AWS_ENDPOINT_URL not set; run localstack/emulator.sh up and eval \"$(localstack/emulator.sh env)\"")
	}
	b := make([]byte, 5)
	rand.Read(b)
	prefix := "test-" + hex.EncodeToString(b) + "-"
	var out bytes.Buffer
	err := run(t.Context(), []string{"-prefix", prefix, "-payload-bucket", prefix + "bucket", "-events"}, os.Getenv, &out)
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		k, v, _ := strings.Cut(line, "=")
		got[k] = v
	}
	cfg, cerr := awsconfig.Load(t.Context(), nil)
	if cerr != nil {
		t.Fatal(cerr)
	}
	client := sqs.NewFromConfig(cfg)
	topics := sns.NewFromConfig(cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		urls := localstack.URLs{Work: got["QUEUE_URL"], Results: got["RESULTS_QUEUE_URL"], DLQ: got["DLQ_URL"]}
		_ = localstack.Delete(ctx, client, urls)
		if u := got["EVENTS_QUEUE_URL"]; u != "" {
			_, _ = client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: &u})
		}
		if a := got["VRAMQ_EVENTS_TOPIC_ARN"]; a != "" {
			_, _ = topics.DeleteTopic(ctx, &sns.DeleteTopicInput{TopicArn: &a})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	topic, queue := got["VRAMQ_EVENTS_TOPIC_ARN"], got["EVENTS_QUEUE_URL"]
	if !strings.HasSuffix(topic, ":"+prefix+"vramq-events") || !strings.HasSuffix(queue, "/"+prefix+"vramq-events") {
		t.Fatalf("output %q: want the topic's ARN and the queue's URL, both named %svramq-events", out.String(), prefix)
	}
	const body = `{"v":1,"job_id":"j"}`
	if _, err := topics.Publish(t.Context(), &sns.PublishInput{TopicArn: &topic, Message: aws.String(body)}); err != nil {
		t.Fatal(err)
	}
	r, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &queue, WaitTimeSeconds: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Messages) != 1 || aws.ToString(r.Messages[0].Body) != body {
		t.Fatalf("received %d messages (first body %q), want one with the raw body %s", len(r.Messages), firstBody(r.Messages), body)
	}
}

func firstBody(ms []types.Message) string {
	if len(ms) == 0 {
		return ""
	}
	return aws.ToString(ms[0].Body)
}
