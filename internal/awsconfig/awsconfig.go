// Package awsconfig loads the AWS configuration every vramq binary shares: the
// standard chain (AWS_REGION, credentials, AWS_ENDPOINT_URL[_SQS|_S3]) with the
// SDK's retryer tuned for a queue worker, an HTTP transport whose every phase
// has a timeout, and the SDK's log routed to slog.
package awsconfig

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/logging"
)

// Load reads the standard AWS configuration. Retries are the SDK's own
// (throttling, 5xx and broken responses, with jittered backoff); a worker can
// afford more attempts than an interactive client, so the attempt count is
// raised and the backoff capped, rather than adding a retry loop on top.
//
// The HTTP client bounds every phase of an attempt (see Timeouts), so an
// endpoint that accepts a connection and then goes silent costs one attempt's
// timeout and a retry, not a worker stuck forever on a call without a
// deadline.
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
		config.WithHTTPClient(HTTPClient(DefaultTimeouts)),
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

// Timeouts bound the phases of one HTTP attempt to AWS. Each ends the
// attempt with an error the SDK's retryer treats as retryable.
type Timeouts struct {
	// Dial bounds opening a TCP connection.
	Dial time.Duration
	// TLSHandshake bounds the TLS handshake on a new connection.
	TLSHandshake time.Duration
	// ResponseHeader bounds the wait for the response's headers once the
	// request, body included, is written. It must exceed the longest wait an
	// API makes on purpose: an SQS long poll answers after up to 20 s
	// (MaxLongPoll) when no message comes.
	ResponseHeader time.Duration
	// Attempt bounds one attempt as a whole, body upload and download
	// included: a last resort against a response that stalls half-way.
	Attempt time.Duration
}

// MaxLongPoll is SQS's longest ReceiveMessage wait (WaitTimeSeconds 20).
const MaxLongPoll = 20 * time.Second

// DefaultTimeouts are Load's. Dial is a third of the SDK's default of 30 s:
// AWS endpoints answer a connect within milliseconds, and a dial that hangs
// is better retried on another address soon. TLSHandshake is the SDK's.
// ResponseHeader is a long poll plus 30 s for a busy endpoint. Attempt allows
// a 32 MiB claim-checked body (the publisher's largest request) at about
// 110 KB/s.
var DefaultTimeouts = Timeouts{
	Dial:           10 * time.Second,
	TLSHandshake:   10 * time.Second,
	ResponseHeader: MaxLongPoll + 30*time.Second,
	Attempt:        5 * time.Minute,
}

// HTTPClient is the SDK's buildable client (its connection pool, TLS 1.2 at
// least, HTTP/2, redirects not followed) with t's timeouts.
func HTTPClient(t Timeouts) *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = t.Dial }).
		WithTransportOptions(func(tr *http.Transport) {
			tr.TLSHandshakeTimeout = t.TLSHandshake
			tr.ResponseHeaderTimeout = t.ResponseHeader
		}).
		WithTimeout(t.Attempt)
}

// S3 returns an S3 client for cfg. Emulators and LocalStack serve buckets by
// path, not by host name, so path-style addressing is used whenever the
// endpoint is overridden by the standard variables.
func S3(cfg aws.Config, getenv func(string) string) *s3.Client {
	pathStyle := getenv("AWS_ENDPOINT_URL") != "" || getenv("AWS_ENDPOINT_URL_S3") != ""
	return s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = pathStyle })
}
