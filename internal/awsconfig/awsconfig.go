// Package awsconfig loads the AWS configuration every vramq binary shares: the
// standard chain (AWS_REGION, credentials, AWS_ENDPOINT_URL[_SQS|_S3]) with the
// SDK's retryer tuned for a queue worker, an HTTP transport whose every phase
// has a timeout, and the SDK's log routed to slog.
package awsconfig

import (
	"context"
	"fmt"
	"io"
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

	"github.com/vramq/vramq/job"
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
	cfg, err := config.LoadDefaultConfig(ctx,
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
	if err != nil {
		return cfg, err
	}
	// Wrapped after loading: the SDK adds a CA bundle (AWS_CA_BUNDLE) only
	// to its own buildable client.
	cfg.HTTPClient = BodyGuard{cfg.HTTPClient}
	return cfg, nil
}

// BodyGuard is an HTTP client that hands net/http request bodies without
// their WriteTo method. It works around a race between smithy-go (v1.28)
// and net/http that breaks calls whose answer has already arrived:
//
//   - net/http's connection writer, having sent a body of known length,
//     copies the body once more to check that nothing is left, then closes
//     it;
//   - smithy-go closes the body itself as soon as Do returns, and its body's
//     WriteTo answers (0, io.EOF) once closed, which io.Copy passes on as an
//     error (WriteTo should return nil at the end);
//   - so when the answer comes back before the writer gets to that last
//     copy (a busy machine delays the writer; SQS answers as soon as it has
//     the body), the writer takes the EOF for a failed upload and closes the
//     connection under the answer. The SDK fails to read the answer ("use of
//     closed network connection") and retries the call.
//
// For a ReceiveMessage that retry is costly: the messages SQS handed to the
// failed attempt stay invisible for their whole visibility timeout. On 2
// cores against the emulator it happened in most benchmark runs. Without
// WriteTo, io.Copy reads the body with Read, whose io.EOF it takes for the
// end.
type BodyGuard struct{ Client aws.HTTPClient }

// Do sends req with its body hidden behind Read and Close.
func (g BodyGuard) Do(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = readCloser{req.Body}
	}
	return g.Client.Do(req)
}

type readCloser struct{ io.ReadCloser }

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
	// (job.MaxLongPoll) when no message comes.
	ResponseHeader time.Duration
	// Attempt bounds one attempt as a whole, body upload and download
	// included: a last resort against a response that stalls half-way.
	Attempt time.Duration
}

// DefaultTimeouts are Load's. Dial is a third of the SDK's default of 30 s:
// AWS endpoints answer a connect within milliseconds, and a dial that hangs
// is better retried on another address soon. TLSHandshake is the SDK's.
// ResponseHeader is a long poll plus 30 s for a busy endpoint. Attempt allows
// a 32 MiB claim-checked body (the publisher's largest request) at about
// 110 KB/s.
var DefaultTimeouts = Timeouts{
	Dial:           10 * time.Second,
	TLSHandshake:   10 * time.Second,
	ResponseHeader: job.MaxLongPoll + 30*time.Second,
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
