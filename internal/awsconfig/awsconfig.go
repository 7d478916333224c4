// Package awsconfig loads the AWS configuration every vramq binary shares: the
// standard chain (AWS_REGION, credentials, AWS_ENDPOINT_URL[_SQS|_S3]) with the
// SDK's retryer tuned for a queue worker and its log routed to slog.
package awsconfig

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/logging"
)

// Load reads the standard AWS configuration. Retries are the SDK's own
// (throttling, 5xx and broken responses, with jittered backoff); a worker can
// afford more attempts than an interactive client, so the attempt count is
// raised and the backoff capped, rather than adding a retry loop on top.
//
// Every retry is logged at WARN through log: a retried ReceiveMessage whose
// first response was lost in transit leaves the messages SQS handed to that
// attempt invisible until their visibility timeout, and an operator should be
// able to see why messages came back late.
func Load(ctx context.Context, log *slog.Logger) (aws.Config, error) {
	if log == nil {
		log = slog.Default()
	}
	return config.LoadDefaultConfig(ctx,
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = 6
				o.MaxBackoff = 5 * time.Second
			})
		}),
		config.WithClientLogMode(aws.LogRetries),
		config.WithLogger(logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
			// With LogRetries the SDK logs its warnings, its retries, and at
			// debug every request that failed without a retry, which includes
			// expected misses (an S3 key not there yet).
			msg := fmt.Sprintf(format, v...)
			level := slog.LevelDebug
			if c == logging.Warn || strings.HasPrefix(msg, "retrying request") {
				level = slog.LevelWarn
			}
			log.Log(context.Background(), level, msg, "component", "aws-sdk")
		})),
	)
}

// S3 returns an S3 client for cfg. Emulators and LocalStack serve buckets by
// path, not by host name, so path-style addressing is used whenever the
// endpoint is overridden by the standard variables.
func S3(cfg aws.Config, getenv func(string) string) *s3.Client {
	pathStyle := getenv("AWS_ENDPOINT_URL") != "" || getenv("AWS_ENDPOINT_URL_S3") != ""
	return s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = pathStyle })
}
