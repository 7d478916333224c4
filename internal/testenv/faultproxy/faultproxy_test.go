package faultproxy_test

// Each fault kind as an SDK client with retries off sees it, against the
// emulator (or whatever AWS_ENDPOINT_URL points at; skipped without one),
// and what the endpoint really did checked with a direct client.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/vramq/vramq/internal/testenv/faultproxy"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/sqstest"
)

type env struct {
	proxy  *faultproxy.Proxy
	direct *sqs.Client // straight to the endpoint, for checking what it did
	via    *sqs.Client // through the proxy, retries off
	queue  string
}

func setup(t *testing.T, f faultproxy.Faults) *env {
	t.Helper()
	direct := sqstest.Client(t) // skips without an endpoint
	target := os.Getenv("AWS_ENDPOINT_URL_SQS")
	if target == "" {
		target = os.Getenv("AWS_ENDPOINT_URL")
	}
	p, err := faultproxy.New(target, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	cfg, err := p.Config(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	via := p.SQS(cfg, func(o *sqs.Options) { o.Retryer = aws.NopRetryer{} })
	return &env{proxy: p, direct: direct, via: via, queue: sqstest.Queues(t, direct, 5).Work}
}

// counts returns the queue's visible and in-flight messages.
func (e *env) counts(t *testing.T) (visible, inflight int) {
	t.Helper()
	v, i, err := jobq.Counts(t.Context(), e.direct, e.queue)
	if err != nil {
		t.Fatal(err)
	}
	return v, i
}

func (e *env) send(c *sqs.Client, body string) error {
	_, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: &e.queue, MessageBody: &body})
	return err
}

// receiveAll takes every visible message off the queue with the direct
// client, for visibility d, and returns their bodies by receipt handle.
func (e *env) receiveAll(t *testing.T, d int32) map[string]string {
	t.Helper()
	got := map[string]string{}
	for {
		out, err := e.direct.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &e.queue,
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: d})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			return got
		}
		for _, m := range out.Messages {
			got[aws.ToString(m.ReceiptHandle)] = aws.ToString(m.Body)
		}
	}
}

func isThrottle(err error) bool {
	return retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err) == aws.TrueTernary
}

func isRetryable(err error) bool {
	return retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err) == aws.TrueTernary
}

func TestThrottle(t *testing.T) {
	e := setup(t, faultproxy.Faults{Throttle: 1, Seed: 1})
	codes := map[string]bool{}
	for i := range 8 {
		err := e.send(e.via, fmt.Sprint("m", i))
		var apiErr smithy.APIError
		if !errors.As(err, &apiErr) {
			t.Fatalf("send %d: %v; want an API error", i, err)
		}
		codes[apiErr.ErrorCode()] = true
		if !isThrottle(err) || !isRetryable(err) {
			t.Errorf("send %d: %v (code %q) is not a retryable throttle to the SDK's retryer", i, err, apiErr.ErrorCode())
		}
	}
	// Both shapes, from 8 fair draws (seed 1 gives both).
	if !codes["ThrottlingException"] || !codes["RequestThrottled"] {
		t.Errorf("codes %v; want both ThrottlingException and RequestThrottled", codes)
	}
	if v, i := e.counts(t); v+i != 0 {
		t.Errorf("%d messages on the queue; a throttled call must not reach it", v+i)
	}
	if n := e.proxy.Injected()[faultproxy.KindThrottle]; n != 8 {
		t.Errorf("%d throttles counted, want 8", n)
	}
}

func TestServerError(t *testing.T) {
	e := setup(t, faultproxy.Faults{ServerError: 1})
	err := e.send(e.via, "m")
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "InternalError" || apiErr.ErrorFault() != smithy.FaultServer {
		t.Fatalf("send: %v; want InternalError, a server fault", err)
	}
	var re interface{ HTTPStatusCode() int }
	if !errors.As(err, &re) || re.HTTPStatusCode() != 500 {
		t.Errorf("send: %v; want HTTP 500", err)
	}
	if !isRetryable(err) || isThrottle(err) {
		t.Errorf("send: %v; want retryable and not a throttle", err)
	}
	if v, i := e.counts(t); v+i != 0 {
		t.Errorf("%d messages on the queue; the failed call must not reach it", v+i)
	}
}

func TestSlow(t *testing.T) {
	e := setup(t, faultproxy.Faults{Slow: 1, SlowDelay: 300 * time.Millisecond})
	start := time.Now()
	if err := e.send(e.via, "slow"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("the call took %v; want at least the 300ms delay", d)
	}
	if v, _ := e.counts(t); v != 1 {
		t.Errorf("%d messages visible after a slow send, want 1", v)
	}

	// A client that gives up during the delay: nothing reaches the endpoint.
	if err := e.proxy.Set(faultproxy.Faults{Slow: 1, SlowDelay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	body := "never"
	_, err := e.via.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &e.queue, MessageBody: &body})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send with a 200ms deadline through a 1h delay: %v", err)
	}
	if got := e.receiveAll(t, 30); len(got) != 1 || !slices.Contains(slices.Collect(maps.Values(got)), "slow") {
		t.Errorf("queue holds %v; want only the first message", got)
	}
	if n := e.proxy.Injected()[faultproxy.KindSlow]; n != 2 {
		t.Errorf("%d slow requests counted, want 2", n)
	}
}

func TestDropBefore(t *testing.T) {
	e := setup(t, faultproxy.Faults{DropBefore: 1})
	err := e.send(e.via, "m")
	if err == nil || !isRetryable(err) {
		t.Fatalf("send through a dropped connection: %v; want a retryable connection error", err)
	}
	if v, i := e.counts(t); v+i != 0 {
		t.Errorf("%d messages on the queue; the request was dropped before reaching it", v+i)
	}
	if n := e.proxy.Injected()[faultproxy.KindDropBefore]; n != 1 {
		t.Errorf("%d drops counted, want 1", n)
	}
}

// The endpoint acts, the client does not hear of it: a send that failed to
// the client is on the queue, and a receive strands what it took.
func TestDropAfter(t *testing.T) {
	e := setup(t, faultproxy.Faults{DropAfter: 1, Actions: []string{"SendMessage", "ReceiveMessage"}})
	err := e.send(e.via, "m")
	if err == nil || !isRetryable(err) {
		t.Fatalf("send with the response dropped: %v; want a retryable connection error", err)
	}
	if v, _ := e.counts(t); v != 1 {
		t.Fatalf("%d messages visible; the send reached the queue and should be there", v)
	}
	_, err = e.via.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &e.queue, MaxNumberOfMessages: 10,
		WaitTimeSeconds: 1, VisibilityTimeout: 60})
	if err == nil {
		t.Fatal("receive with the response dropped succeeded")
	}
	if v, i := e.counts(t); v != 0 || i != 1 {
		t.Errorf("%d visible, %d in flight; want the message stranded in flight", v, i)
	}
	got := e.proxy.InjectedFor("ReceiveMessage")[faultproxy.KindDropAfter]
	if all := e.proxy.Injected()[faultproxy.KindDropAfter]; got != 1 || all != 2 {
		t.Errorf("drop-after: %d on ReceiveMessage, %d in all; want 1 and 2", got, all)
	}
}

func batchOf(n int) []types.SendMessageBatchRequestEntry {
	entries := make([]types.SendMessageBatchRequestEntry, n)
	for i := range entries {
		entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(fmt.Sprint("m", i))}
	}
	return entries
}

// checkFailed checks the Failed entries of a partial batch and returns their
// ids.
func checkFailed(t *testing.T, n int, failed []types.BatchResultErrorEntry, ok int) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for _, f := range failed {
		if aws.ToString(f.Code) != "InternalError" || f.SenderFault {
			t.Errorf("failed entry %+v; want InternalError, not the sender's fault", f)
		}
		ids[aws.ToString(f.Id)] = true
	}
	if len(ids) == 0 || len(ids) == n || len(ids)+ok != n {
		t.Fatalf("%d failed and %d successful of %d; want some of each, adding up", len(ids), ok, n)
	}
	return ids
}

// A partial batch really leaves the failed entries undone: unsent,
// undeleted, their visibility unchanged.
func TestPartialBatch(t *testing.T) {
	e := setup(t, faultproxy.Faults{PartialBatch: 1, Seed: 3})
	const n = 10
	out, err := e.via.SendMessageBatch(t.Context(), &sqs.SendMessageBatchInput{QueueUrl: &e.queue, Entries: batchOf(n)})
	if err != nil {
		t.Fatal(err)
	}
	failedSend := checkFailed(t, n, out.Failed, len(out.Successful))
	got := e.receiveAll(t, 60)
	if len(got) != n-len(failedSend) {
		t.Fatalf("%d messages on the queue; want the %d that did not fail", len(got), n-len(failedSend))
	}
	for _, body := range got {
		if failedSend[strings.TrimPrefix(body, "m")] {
			t.Errorf("%s was reported failed but was sent", body)
		}
	}

	// Release them all through the proxy: the failed ones stay in flight.
	handles := slices.Collect(maps.Keys(got))
	vis := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(handles))
	for i, h := range handles {
		vis[i] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(h)}
	}
	cout, err := e.via.ChangeMessageVisibilityBatch(t.Context(), &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &e.queue, Entries: vis})
	if err != nil {
		t.Fatal(err)
	}
	failedVis := checkFailed(t, len(handles), cout.Failed, len(cout.Successful))
	if v, i := e.counts(t); v != len(handles)-len(failedVis) || i != len(failedVis) {
		t.Errorf("%d visible, %d in flight after releasing %d with %d failed", v, i, len(handles), len(failedVis))
	}

	// Delete what is visible again through the proxy: the failed ones stay.
	again := e.receiveAll(t, 60)
	var del []types.DeleteMessageBatchRequestEntry
	for h := range again {
		del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(len(del))), ReceiptHandle: aws.String(h)})
	}
	if len(del) < 2 {
		t.Fatalf("%d messages to delete; the test needs at least 2 for a partial batch", len(del))
	}
	dout, err := e.via.DeleteMessageBatch(t.Context(), &sqs.DeleteMessageBatchInput{QueueUrl: &e.queue, Entries: del})
	if err != nil {
		t.Fatal(err)
	}
	failedDel := checkFailed(t, len(del), dout.Failed, len(dout.Successful))
	if _, i := e.counts(t); i != len(failedVis)+len(failedDel) {
		t.Errorf("%d in flight; want the %d whose release failed and the %d whose delete failed", i, len(failedVis), len(failedDel))
	}
	inj := e.proxy.Injected()
	if inj[faultproxy.KindPartialBatch] != 3 || inj[faultproxy.KindFailedEntry] != int64(len(failedSend)+len(failedVis)+len(failedDel)) {
		t.Errorf("counted %v; want 3 partial batches and %d failed entries", inj, len(failedSend)+len(failedVis)+len(failedDel))
	}
}

// When every entry is chosen, nothing is forwarded.
func TestPartialBatchAllFailed(t *testing.T) {
	e := setup(t, faultproxy.Faults{PartialBatch: 1})
	// One entry is always chosen: at least one entry of a batch fails.
	out, err := e.via.SendMessageBatch(t.Context(), &sqs.SendMessageBatchInput{QueueUrl: &e.queue, Entries: batchOf(1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Failed) != 1 || len(out.Successful) != 0 || aws.ToString(out.Failed[0].Id) != "0" {
		t.Fatalf("failed %+v, successful %d; want the one entry failed", out.Failed, len(out.Successful))
	}
	if v, i := e.counts(t); v+i != 0 {
		t.Errorf("%d messages on the queue; want none", v+i)
	}
}

func TestDown(t *testing.T) {
	e := setup(t, faultproxy.Faults{})
	if err := e.send(e.via, "before"); err != nil {
		t.Fatal(err)
	}
	e.proxy.Down(true)
	for i := range 3 { // a pooled connection, then new ones
		if err := e.send(e.via, "during"); err == nil || !isRetryable(err) {
			t.Fatalf("send %d while down: %v; want a retryable connection error", i, err)
		}
	}
	e.proxy.Down(false)
	if err := e.send(e.via, "after"); err != nil {
		t.Fatalf("send after the outage: %v", err)
	}
	got := slices.Sorted(maps.Values(e.receiveAll(t, 60)))
	if !slices.Equal(got, []string{"after", "before"}) {
		t.Errorf("queue holds %v; want before and after only", got)
	}
	// The first send went on a pooled connection (a request refused), the
	// others on new ones (closed at accept).
	if got := e.proxy.Injected()[faultproxy.KindDown]; got < 3 {
		t.Errorf("%d requests or connections counted as refused while down, want at least 3", got)
	}
}

func TestActionsFilter(t *testing.T) {
	e := setup(t, faultproxy.Faults{Throttle: 1, Actions: []string{"ReceiveMessage"}})
	if err := e.send(e.via, "m"); err != nil {
		t.Fatalf("send with only ReceiveMessage faulted: %v", err)
	}
	_, err := e.via.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &e.queue, WaitTimeSeconds: 1})
	if !isThrottle(err) {
		t.Fatalf("receive: %v; want a throttle", err)
	}
	if got := e.proxy.InjectedFor("SendMessage"); len(got) != 0 {
		t.Errorf("faults on SendMessage: %v", got)
	}
	if e.proxy.Requests() != 2 {
		t.Errorf("%d requests through the proxy, want 2", e.proxy.Requests())
	}
}

// S3 requests pass untouched unless S3 is set, then get S3's own errors.
func TestS3(t *testing.T) {
	e := setup(t, faultproxy.Faults{Throttle: 1})
	direct := sqstest.S3(t)
	bucket := sqstest.Bucket(t, direct)
	cfg, err := e.proxy.Config(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	via := e.proxy.S3(cfg, func(o *s3.Options) { o.Retryer = aws.NopRetryer{} })
	key := "k"
	if _, err := via.PutObject(t.Context(), &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader("v")}); err != nil {
		t.Fatalf("put with S3 not faulted: %v", err)
	}
	if err := e.proxy.Set(faultproxy.Faults{Throttle: 1, S3: true}); err != nil {
		t.Fatal(err)
	}
	_, err = via.GetObject(t.Context(), &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "SlowDown" || !isThrottle(err) {
		t.Fatalf("get: %v; want SlowDown, a throttle", err)
	}
	if err := e.proxy.Set(faultproxy.Faults{ServerError: 1, S3: true}); err != nil {
		t.Fatal(err)
	}
	_, err = via.HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: &bucket, Key: &key})
	if err == nil || !isRetryable(err) {
		t.Fatalf("head: %v; want a retryable 500", err)
	}
	if got := e.proxy.InjectedFor(faultproxy.ActionS3); got[faultproxy.KindThrottle] != 1 || got[faultproxy.KindServerError] != 1 {
		t.Errorf("S3 faults counted %v; want one throttle and one server error", got)
	}

	// S3 alone: SQS passes.
	if err := e.proxy.Set(faultproxy.Faults{ServerError: 1, Actions: []string{faultproxy.ActionS3}}); err != nil {
		t.Fatal(err)
	}
	if err := e.send(e.via, "m"); err != nil {
		t.Errorf("send with only S3 faulted: %v", err)
	}
	if _, err = via.HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: &bucket, Key: &key}); err == nil {
		t.Error("head with S3 in Actions: no error")
	}
}

// The same seed and the same requests, one after another, give the same faults.
func TestSeedReproducible(t *testing.T) {
	f := faultproxy.Faults{Throttle: 0.3, ServerError: 0.3, Seed: 42}
	var runs [2][]bool
	for r := range runs {
		e := setup(t, f)
		for i := range 20 {
			runs[r] = append(runs[r], e.send(e.via, fmt.Sprint(i)) != nil)
		}
	}
	if !slices.Equal(runs[0], runs[1]) {
		t.Errorf("failures differ with the same seed:\n%v\n%v", runs[0], runs[1])
	}
	if !slices.Contains(runs[0], true) || !slices.Contains(runs[0], false) {
		t.Errorf("failures %v; want some of each at a rate of 0.6", runs[0])
	}
}

// Set while requests run, for the race detector.
func TestSetConcurrent(t *testing.T) {
	e := setup(t, faultproxy.Faults{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 5 {
				_ = e.send(e.via, fmt.Sprint(i, "-", j))
			}
		})
	}
	for i := range 10 {
		if err := e.proxy.Set(faultproxy.Faults{Throttle: float64(i%2) / 2, Actions: []string{"SendMessage"}}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if e.proxy.Requests() != 20 {
		t.Errorf("%d requests, want 20", e.proxy.Requests())
	}
}

func TestValidate(t *testing.T) {
	for _, f := range []faultproxy.Faults{
		{Throttle: -0.1},
		{ServerError: 1.5},
		{Throttle: 0.6, DropAfter: 0.6},
		{Slow: 0.5},
		{Slow: 0.5, SlowDelay: -time.Second},
	} {
		if err := f.Validate(); err == nil {
			t.Errorf("%+v: no error", f)
		}
		if _, err := faultproxy.New("http://127.0.0.1:1", f); err == nil {
			t.Errorf("New with %+v: no error", f)
		}
	}
	if _, err := faultproxy.New("127.0.0.1:1", faultproxy.Faults{}); err == nil {
		t.Error("New with a target that is not a URL: no error")
	}
	if err := (faultproxy.Faults{Throttle: 0.5, ServerError: 0.5, Slow: 1, SlowDelay: time.Second}).Validate(); err != nil {
		t.Errorf("valid faults: %v", err)
	}
}
