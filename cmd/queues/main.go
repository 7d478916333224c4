// Command queues creates the vramq queues (work, results, dead-letter) on the
// SQS endpoint the standard AWS configuration names (AWS_ENDPOINT_URL for the
// emulator or LocalStack, none for AWS) and prints their URLs as shell
// assignments:
//
//	eval "$(queues -prefix dev-)"   # sets QUEUE_URL, RESULTS_QUEUE_URL, DLQ_URL
//
// With -payload-bucket it also creates the bucket, and with -events the
// completion events' SNS topic and a queue subscribed to it.
//
// It is safe to run again: existing queues with the same attributes are reused.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "queues:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "queues:", err)
		os.Exit(1)
	}
}

// usageError is a bad command line or environment; the usage has been printed.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("queues", flag.ContinueOnError)
	defs := localstack.Definitions()
	var opts localstack.Options
	fs.StringVar(&opts.Prefix, "prefix", "", "put `PREFIX` in front of every queue name (letters, digits, '-', '_')")
	fs.IntVar(&opts.MaxReceiveCount, "max-receive-count", defs.Work.RedrivePolicy.MaxReceiveCount,
		"receives before a work message moves to the dead-letter queue")
	fs.DurationVar(&opts.VisibilityTimeout, "visibility-timeout", defaultVisibility(defs.Work),
		"the work queue's visibility timeout, in whole seconds")
	bucket := fs.String("payload-bucket", "", "also create this S3 bucket for claim-checked payloads and results, and print PAYLOAD_BUCKET")
	events := fs.Bool("events", false, "also create an SNS topic for completion events and a queue subscribed to it "+
		"(both PREFIXvramq-events), and print VRAMQ_EVENTS_TOPIC_ARN and EVENTS_QUEUE_URL; needs -payload-bucket, as the subscriber's events do")
	// The flag package reports command-line mistakes itself but envflag's
	// environment ones not at all; silence it so both are reported the same way.
	fs.SetOutput(io.Discard)
	err := envflag.Parse(fs, args, getenv)
	fs.SetOutput(nil)
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err == nil {
		err = checkOptions(opts, *bucket, defs)
	}
	if err == nil && *events && *bucket == "" {
		err = fmt.Errorf("-events (%s) needs -payload-bucket (%s): the subscriber keeps its done markers there",
			envflag.Name("events"), envflag.Name("payload-bucket"))
	}
	if err != nil {
		fs.Usage()
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}

	cfg, err := awsconfig.Load(ctx, nil)
	if err != nil {
		return fmt.Errorf("AWS configuration: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	urls, err := localstack.Create(ctx, sqs.NewFromConfig(cfg), opts)
	if err != nil {
		return err
	}
	// Prefixes are restricted to characters a shell takes unquoted, and queue
	// URLs contain none that need quoting.
	if _, err := fmt.Fprintf(stdout, "QUEUE_URL=%s\nRESULTS_QUEUE_URL=%s\nDLQ_URL=%s\n", urls.Work, urls.Results, urls.DLQ); err != nil {
		return err
	}
	if *bucket == "" {
		return nil
	}
	if err := createBucket(ctx, awsconfig.S3(cfg, getenv), *bucket); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "PAYLOAD_BUCKET=%s\n", *bucket); err != nil {
		return err
	}
	if !*events {
		return nil
	}
	topic, queue, err := createEvents(ctx, sns.NewFromConfig(cfg), sqs.NewFromConfig(cfg), opts.Prefix+"vramq-events")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "VRAMQ_EVENTS_TOPIC_ARN=%s\nEVENTS_QUEUE_URL=%s\n", topic, queue)
	return err
}

// createEvents makes the completion events' topic and a queue subscribed to
// it with raw delivery (each message body is one event, as docs/events.md
// shows a consumer reading them). Both calls are idempotent in SNS and SQS
// for the same name and attributes. The queue's policy lets only this topic
// send to it, as AWS requires for an SNS-to-SQS subscription; the emulator
// does not check it. Terraform (infra/events.tf) owns the real ones.
func createEvents(ctx context.Context, topics *sns.Client, queues *sqs.Client, name string) (topicARN, queueURL string, err error) {
	t, err := topics.CreateTopic(ctx, &sns.CreateTopicInput{Name: &name})
	if err != nil {
		return "", "", fmt.Errorf("creating topic %s: %w", name, err)
	}
	topicARN = aws.ToString(t.TopicArn)
	q, err := queues.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: &name})
	if err != nil {
		return "", "", fmt.Errorf("creating queue %s: %w", name, err)
	}
	queueURL = aws.ToString(q.QueueUrl)
	a, err := queues.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		return "", "", fmt.Errorf("queue %s: %w", name, err)
	}
	queueARN := a.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]
	policy, err := json.Marshal(map[string]any{
		"Version": "2012-10-17",
		"Statement": []any{map[string]any{
			"Effect":    "Allow",
			"Principal": map[string]string{"Service": "sns.amazonaws.com"},
			"Action":    "sqs:SendMessage",
			"Resource":  queueARN,
			"Condition": map[string]any{"ArnEquals": map[string]string{"aws:SourceArn": topicARN}},
		}},
	})
	if err != nil {
		return "", "", err
	}
	_, err = queues.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: q.QueueUrl,
		Attributes: map[string]string{string(sqstypes.QueueAttributeNamePolicy): string(policy)}})
	if err != nil {
		return "", "", fmt.Errorf("queue %s policy: %w", name, err)
	}
	_, err = topics.Subscribe(ctx, &sns.SubscribeInput{TopicArn: t.TopicArn, Protocol: aws.String("sqs"),
		Endpoint: &queueARN, Attributes: map[string]string{"RawMessageDelivery": "true"}})
	if err != nil {
		return "", "", fmt.Errorf("subscribing %s to %s: %w", name, topicARN, err)
	}
	return topicARN, queueURL, nil
}

// createBucket makes the payload bucket, or reuses it when this account
// already owns it. Its encryption, lifecycle and policy belong to Terraform
// (infra/); this is for local emulators and quick starts.
func createBucket(ctx context.Context, client *s3.Client, name string) error {
	_, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &name})
	var owned *s3types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) {
		return fmt.Errorf("creating bucket %s: %w", name, err)
	}
	return nil
}

// defaultVisibility is the definition's visibility timeout, so that -h shows
// the value in effect; parseDefinitions guarantees the attribute is an integer.
func defaultVisibility(q localstack.Queue) time.Duration {
	n, _ := strconv.Atoi(q.Attributes["VisibilityTimeout"])
	return time.Duration(n) * time.Second
}

// checkOptions checks the flags' values against what SQS and S3 accept,
// before any call, naming each flag and its environment variable;
// localstack.Create checks the queue names and attributes again.
func checkOptions(o localstack.Options, bucket string, defs localstack.Queues) error {
	var errs []error
	bad := func(flag, format string, a ...any) {
		errs = append(errs, fmt.Errorf("-%s (%s): %s", flag, envflag.Name(flag), fmt.Sprintf(format, a...)))
	}
	longest := 0
	for _, q := range []localstack.Queue{defs.Work, defs.Results, defs.DLQ} {
		longest = max(longest, len(q.Name))
	}
	switch {
	case strings.IndexFunc(o.Prefix, func(c rune) bool { return !nameChar(c) }) >= 0:
		bad("prefix", "%q: only letters, digits, '-' and '_' (SQS queue names)", o.Prefix)
	case len(o.Prefix)+longest > maxQueueName:
		bad("prefix", "%q: at most %d characters, so that every queue name fits SQS's %d", o.Prefix, maxQueueName-longest, maxQueueName)
	}
	if o.MaxReceiveCount < 1 || o.MaxReceiveCount > 1000 {
		bad("max-receive-count", "%d: want 1 to 1000 (SQS's redrive policy)", o.MaxReceiveCount)
	}
	if v := o.VisibilityTimeout; v < 0 || v > job.MaxVisibility || v%time.Second != 0 {
		bad("visibility-timeout", "%v: want whole seconds from 0 to 12h (SQS)", v)
	}
	if bucket != "" && !validBucket(bucket) {
		bad("payload-bucket", "%q: want 3 to 63 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit (S3)", bucket)
	}
	return errors.Join(errs...)
}

// maxQueueName is SQS's limit on a queue name.
const maxQueueName = 80

func nameChar(c rune) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// validBucket applies S3's general-purpose bucket naming rules that a
// string alone can break (not the reserved prefixes and suffixes).
func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 63 || strings.Contains(b, "..") {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	if !alnum(b[0]) || !alnum(b[len(b)-1]) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if c := b[i]; !alnum(c) && c != '-' && c != '.' {
			return false
		}
	}
	return true
}
