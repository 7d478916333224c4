package awsconfig

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// The client Load configures reaches the service clients with its timeouts,
// and the response-header timeout leaves room for a full SQS long poll: a
// value at or under 20 s would cut every empty receive short.
func TestLoadSetsTimeoutsThatOutlastALongPoll(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	cfg, err := Load(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	client := sqs.NewFromConfig(cfg)
	b, ok := client.Options().HTTPClient.(*awshttp.BuildableClient)
	if !ok {
		t.Fatalf("the SQS client's HTTP client is a %T, not the buildable client Load sets", client.Options().HTTPClient)
	}
	tr := b.GetTransport()
	d := DefaultTimeouts
	if tr.ResponseHeaderTimeout != d.ResponseHeader || tr.TLSHandshakeTimeout != d.TLSHandshake || b.GetDialer().Timeout != d.Dial || b.GetTimeout() != d.Attempt {
		t.Errorf("SQS client: response header %v, TLS %v, dial %v, attempt %v; want %+v",
			tr.ResponseHeaderTimeout, tr.TLSHandshakeTimeout, b.GetDialer().Timeout, b.GetTimeout(), d)
	}
	if d.ResponseHeader <= MaxLongPoll || d.Attempt <= d.ResponseHeader {
		t.Errorf("timeouts %+v: the response-header wait must exceed a %v long poll, and an attempt the header wait", d, MaxLongPoll)
	}
	for name, v := range map[string]time.Duration{"dial": d.Dial, "TLS handshake": d.TLSHandshake} {
		if v <= 0 {
			t.Errorf("%s timeout %v: want one", name, v)
		}
	}
}

// An endpoint that takes the request and never answers costs one
// response-header timeout per attempt, then an error: the call does not hang.
// An answer slower than a long poll but within the timeout still goes through.
func TestASilentEndpointTimesOut(t *testing.T) {
	release := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // hold the request until the test ends
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer silent.Close()
	defer close(release)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = w.Write([]byte(`{"QueueUrls":[]}`))
	}))
	defer slow.Close()

	short := Timeouts{Dial: time.Second, TLSHandshake: time.Second, ResponseHeader: 200 * time.Millisecond, Attempt: 30 * time.Second}
	client := func(url string, tm Timeouts) *sqs.Client {
		return sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(url), HTTPClient: HTTPClient(tm),
			Credentials: aws.AnonymousCredentials{}, RetryMaxAttempts: 2})
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a backstop, far beyond the timeouts
	defer cancel()
	_, err := client(silent.URL, short).ListQueues(ctx, &sqs.ListQueuesInput{})
	var ne net.Error
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() || ctx.Err() != nil {
		t.Fatalf("ListQueues on a silent endpoint: %v (context: %v); want a transport timeout before the test's own deadline", err, ctx.Err())
	}

	generous := short
	generous.ResponseHeader = 10 * time.Second
	if _, err := client(slow.URL, generous).ListQueues(ctx, &sqs.ListQueuesInput{}); err != nil {
		t.Errorf("ListQueues on an endpoint answering in 300ms with a 10s header timeout: %v", err)
	}
}
