// Package sqstest sets up end-to-end tests against a real SQS API: the
// emulator that make test starts, LocalStack, or AWS itself, whichever
// AWS_ENDPOINT_URL and the standard AWS settings point at.
package sqstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/localstack"
)

// Client returns an SQS client for the endpoint under test, or skips the
// test when none is configured. make test always configures one; to run the
// suite against AWS, set AWS_ENDPOINT_URL to the regional SQS endpoint.
func Client(t testing.TB) *sqs.Client {
	c, _ := CountingClient(t)
	return c
}

// CountingClient is Client, also counting the ReceiveMessage calls its SDK
// retried. A retried receive may have stranded up to ten messages, which SQS
// handed to the lost attempt: they stay invisible until their visibility
// timeout, whatever the consumer does.
func CountingClient(t testing.TB) (*sqs.Client, *atomic.Int64) {
	t.Helper()
	if os.Getenv("AWS_ENDPOINT_URL") == "" && os.Getenv("AWS_ENDPOINT_URL_SQS") == "" {
		t.Skip("no SQS endpoint: set AWS_ENDPOINT_URL (make test starts the emulator and sets it)")
	}
	var retries atomic.Int64
	log := slog.New(handlerFunc(func(r slog.Record) {
		if strings.Contains(r.Message, "retrying request SQS/ReceiveMessage") {
			retries.Add(1)
		}
		t.Log("aws-sdk: " + r.Message)
	}))
	cfg, err := awsconfig.Load(t.Context(), log)
	if err != nil {
		t.Fatal(err)
	}
	return sqs.NewFromConfig(cfg), &retries
}

type handlerFunc func(slog.Record)

func (h handlerFunc) Enabled(context.Context, slog.Level) bool      { return true }
func (h handlerFunc) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h handlerFunc) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h handlerFunc) WithGroup(string) slog.Handler                 { return h }

var unsafe = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// Queues creates a work, results and dead-letter queue of the project's
// definitions under a prefix unique to this test, and deletes them when the
// test ends.
func Queues(t testing.TB, client *sqs.Client, maxReceive int) localstack.URLs {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	name := unsafe.ReplaceAllString(t.Name(), "-")
	if len(name) > 30 {
		name = name[len(name)-30:]
	}
	prefix := "t" + hex.EncodeToString(b[:]) + "-" + name + "-"
	urls, err := localstack.Create(t.Context(), client, localstack.Options{Prefix: prefix, MaxReceiveCount: maxReceive})
	if err != nil {
		t.Fatalf("creating queues: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := localstack.Delete(ctx, client, urls); err != nil {
			t.Logf("deleting queues: %v", err)
		}
	})
	return urls
}

// S3 returns an S3 client for the endpoint under test (path-style when
// AWS_ENDPOINT_URL overrides it), or skips the test when none is configured.
func S3(t testing.TB) *s3.Client {
	t.Helper()
	if os.Getenv("AWS_ENDPOINT_URL") == "" && os.Getenv("AWS_ENDPOINT_URL_S3") == "" {
		t.Skip("no S3 endpoint: set AWS_ENDPOINT_URL (make test starts the emulator and sets it)")
	}
	cfg, err := awsconfig.Load(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return awsconfig.S3(cfg, os.Getenv)
}

// Bucket creates a bucket unique to this test and empties and deletes it
// when the test ends.
func Bucket(t testing.TB, c *s3.Client) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "vramq-test-" + hex.EncodeToString(b[:])
	if _, err := c.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: &name}); err != nil {
		t.Fatalf("creating bucket: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: &name})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				break
			}
			for _, o := range page.Contents {
				_, _ = c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &name, Key: o.Key})
			}
		}
		_, _ = c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &name})
	})
	return name
}
