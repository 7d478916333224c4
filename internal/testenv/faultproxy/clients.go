package faultproxy

import (
	"context"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/internal/awsconfig"
)

// Config loads the project's AWS configuration (awsconfig.Load: the SDK's
// retryer as tuned for the workers, retries logged to log) with its endpoint
// set to the proxy.
func (p *Proxy) Config(ctx context.Context, log *slog.Logger) (aws.Config, error) {
	cfg, err := awsconfig.Load(ctx, log)
	if err != nil {
		return aws.Config{}, err
	}
	cfg.BaseEndpoint = aws.String(p.URL())
	return cfg, nil
}

// SQS returns an SQS client for cfg that talks to the proxy. The endpoint is
// set on the client, after the service-specific variables
// (AWS_ENDPOINT_URL_SQS) the SDK would otherwise prefer; opts come last, to
// change the retryer for example.
func (p *Proxy) SQS(cfg aws.Config, opts ...func(*sqs.Options)) *sqs.Client {
	return sqs.NewFromConfig(cfg, append([]func(*sqs.Options){func(o *sqs.Options) {
		o.BaseEndpoint = aws.String(p.URL())
	}}, opts...)...)
}

// S3 returns a path-style S3 client for cfg that talks to the proxy (the
// proxy serves every bucket on its one host name).
func (p *Proxy) S3(cfg aws.Config, opts ...func(*s3.Options)) *s3.Client {
	return s3.NewFromConfig(cfg, append([]func(*s3.Options){func(o *s3.Options) {
		o.BaseEndpoint = aws.String(p.URL())
		o.UsePathStyle = true
	}}, opts...)...)
}
