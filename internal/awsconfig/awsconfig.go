// Package awsconfig loads the AWS configuration every vramq binary shares: the
// standard chain (AWS_REGION, credentials, AWS_ENDPOINT_URL[_SQS|_S3]) with the
// SDK's retryer tuned for a queue worker.
package awsconfig

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
)

// Load reads the standard AWS configuration. Retries are the SDK's own
// (throttling and 5xx with jittered backoff); a worker can afford more attempts
// than an interactive client, so the attempt count is raised and the backoff
// capped, rather than adding a retry loop on top.
func Load(ctx context.Context) (aws.Config, error) {
	return config.LoadDefaultConfig(ctx,
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = 6
				o.MaxBackoff = 5 * time.Second
			})
		}),
	)
}
