package main_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/internal/testenv/apigw"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/lambdart"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/publishertest"
)

// The publisher's Lambda function end to end: the publisher's program (this
// test binary running main, see lambdaBuild) runs against a local
// Runtime API and takes API Gateway HTTP API (payload 2.0) and function URL
// events, with SQS and S3 on the endpoint under test.
func TestLambdaEndToEnd(t *testing.T) {
	client := sqstest.Client(t) // skips without an endpoint
	s3c := sqstest.S3(t)
	queues := sqstest.Queues(t, client, 5)
	bucket := sqstest.Bucket(t, s3c)

	bin := lambdaBuild(t)
	rt := lambdart.Start(t)
	fn := lambdaStart(t, bin, rt, map[string]string{
		"QUEUE_URL":            queues.Work,
		"PAYLOAD_BUCKET":       bucket,
		"VRAMQ_MAX_ITEM_BYTES": strconv.Itoa(lambdaMaxItem),
		"VRAMQ_API_KEYS":       "", // whatever the environment says: no auth here
	})

	start := time.Now()
	resp := fn.invoke(t, apigw.Event("GET", "/healthz", nil, ""))
	t.Logf("first invocation (init included): %v", time.Since(start))
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(resp.body) != "ok" {
		t.Fatalf("GET /healthz: %d %q; want 200 ok", resp.StatusCode, resp.body)
	}

	t.Run("job", func(t *testing.T) {
		items := lambdaItems(7)
		body := lambdaJSON(t, map[string]any{"items": items, "options": map[string]any{"chunk_items": 3}})
		start := time.Now()
		resp := fn.invoke(t, lambdaDocumentedEvent(t, body))
		t.Logf("POST /v1/jobs of 7 items in 3 chunks: %v", time.Since(start))
		created := resp.accepted(t, 3)
		lambdaExpectWork(t, client, queues.Work, created.JobID, 3, lambdaIDs(items))

		// The job is the JWT subject's that the documented event's
		// authorizer names (issue 34, item 4): a request without it is
		// answered as for a job that does not exist.
		if resp := fn.invoke(t, apigw.Event("GET", "/v1/jobs/"+created.JobID, nil, "")); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET /v1/jobs/%s without the authorizer's identity: %d %s; want 404", created.JobID, resp.StatusCode, resp.body)
		}
		get := apigw.Event("GET", "/v1/jobs/"+created.JobID, nil, "")
		get.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{
			Claims: map[string]string{"sub": "client-1", "iss": "https://issuer.example.com"}}}
		resp = fn.invoke(t, get)
		var st struct {
			JobID        string `json:"job_id"`
			Status       string `json:"status"`
			Chunks       int    `json:"chunks"`
			Items        int    `json:"items"`
			ChunksFailed int    `json:"chunks_failed"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(resp.body), &st) != nil || st.JobID != created.JobID || st.Chunks != 3 || st.Items != 7 {
			t.Errorf("GET /v1/jobs/%s: %d %s; want 200 with the job's 3 chunks and 7 items", created.JobID, resp.StatusCode, resp.body)
		}
	})

	// A REST API's proxy event (payload 1.0) runs the same handler: the
	// function tells the payloads apart (issue 34, item 4), answers in
	// payload 1.0's shape, and the job is the IAM caller's.
	t.Run("REST API event", func(t *testing.T) {
		items := lambdaItems(2)
		iam := func(ev events.APIGatewayProxyRequest) events.APIGatewayProxyRequest {
			ev.RequestContext.Identity.UserArn = "arn:aws:iam::123456789012:user/rest-client"
			return ev
		}
		resp := fn.invoke(t, iam(apigw.RESTEvent("POST", "/v1/jobs", jsonHeaders, lambdaJSON(t, map[string]any{"items": items}))))
		created := resp.accepted(t, 1)
		lambdaExpectWork(t, client, queues.Work, created.JobID, 1, lambdaIDs(items))
		if resp := fn.invoke(t, iam(apigw.RESTEvent("GET", "/v1/jobs/"+created.JobID+"?page_size=1", nil, ""))); resp.StatusCode != http.StatusOK ||
			!strings.Contains(resp.body, created.JobID) {
			t.Errorf("GET of the job by its IAM caller: %d %s", resp.StatusCode, resp.body)
		}
		if resp := fn.invoke(t, apigw.RESTEvent("GET", "/v1/jobs/"+created.JobID, nil, "")); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET of the job without an identity: %d %s; want 404", resp.StatusCode, resp.body)
		}
	})

	t.Run("base64 body", func(t *testing.T) {
		items := lambdaItems(2)
		ev := apigw.Event("POST", "/v1/jobs", jsonHeaders, lambdaJSON(t, map[string]any{"items": items}))
		ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString([]byte(ev.Body)), true
		created := fn.invoke(t, ev).accepted(t, 1)
		lambdaExpectWork(t, client, queues.Work, created.JobID, 1, lambdaIDs(items))
	})

	t.Run("function URL", func(t *testing.T) {
		items := lambdaItems(1)
		ev := lambdaFunctionURLEvent("POST", "/v1/jobs", jsonHeaders, lambdaJSON(t, map[string]any{"items": items}))
		created := fn.invoke(t, ev).accepted(t, 1)
		lambdaExpectWork(t, client, queues.Work, created.JobID, 1, lambdaIDs(items))
	})

	t.Run("named stage", func(t *testing.T) {
		ev := apigw.Event("GET", "/prod/healthz", nil, "")
		ev.RequestContext.Stage = "prod"
		if resp := fn.invoke(t, ev); resp.StatusCode != http.StatusOK {
			t.Errorf("GET /prod/healthz on stage prod: %d %s; want 200", resp.StatusCode, resp.body)
		}
	})

	t.Run("claim check", func(t *testing.T) {
		items := []map[string]any{{"id": "big", "text": strings.Repeat("large ", lambdaMaxItem/6+1)}, {"id": "small", "text": "small"}}
		created := fn.invoke(t, apigw.Event("POST", "/v1/jobs", jsonHeaders, lambdaJSON(t, map[string]any{"items": items}))).accepted(t, 1)
		works := lambdaExpectWork(t, client, queues.Work, created.JobID, 1, []string{"big", "small"})
		for _, w := range works {
			for _, it := range w.Items {
				if it.ID == "big" && (it.Ref == nil || it.Ref.Bucket != bucket || it.Text != "") {
					t.Errorf("item big went inline (ref %+v); want a reference into %s", it.Ref, bucket)
				}
			}
		}
	})

	t.Run("idempotency", func(t *testing.T) {
		h := map[string]string{"content-type": "application/json", "idempotency-key": "lambda-retry-1"}
		body := lambdaJSON(t, map[string]any{"items": lambdaItems(1)})
		first := fn.invoke(t, apigw.Event("POST", "/v1/jobs", h, body)).accepted(t, 1)
		again := fn.invoke(t, apigw.Event("POST", "/v1/jobs", h, body))
		if again.StatusCode != http.StatusAccepted || !strings.Contains(again.body, first.JobID) {
			t.Errorf("retried POST with the same key: %d %s; want 202 with job %s", again.StatusCode, again.body, first.JobID)
		}
		lambdaExpectWork(t, client, queues.Work, first.JobID, 1, []string{"item-0"})
	})

	t.Run("invalid events", func(t *testing.T) {
		// What only an event can get wrong, so not in the API table: the
		// function answers the publisher's JSON error, not a function error
		// (which API Gateway would turn into a bare 500).
		noMethod := apigw.Event("POST", "/v1/jobs", jsonHeaders, `{"items":[{"id":"a","text":"x"}]}`)
		noMethod.RequestContext.HTTP.Method = ""
		badBase64 := apigw.Event("POST", "/v1/jobs", jsonHeaders, "not base64!")
		badBase64.IsBase64Encoded = true
		for _, tc := range []struct {
			name string
			ev   events.APIGatewayV2HTTPRequest
		}{{"event without a method", noMethod}, {"event body not base64", badBase64}} {
			resp := fn.invoke(t, tc.ev)
			var e struct {
				Error struct{ Code, Message string }
			}
			if resp.StatusCode != http.StatusBadRequest || json.Unmarshal([]byte(resp.body), &e) != nil || e.Error.Code != "invalid_event" || e.Error.Message == "" {
				t.Errorf("%s: %d %s; want 400 with error code invalid_event", tc.name, resp.StatusCode, resp.body)
			}
			if ct := resp.Headers["Content-Type"]; ct != "application/json" {
				t.Errorf("%s: Content-Type %q; want application/json", tc.name, ct)
			}
		}
		if v, f, err := jobq.Counts(t.Context(), client, queues.Work); err != nil || v+f != 0 {
			t.Errorf("after the invalid events the work queue holds %d visible and %d in flight (%v); want nothing enqueued", v, f, err)
		}
	})

	t.Run("API table", func(t *testing.T) {
		// The HTTP server's API contract (publishertest, run over HTTP by
		// publisher's TestBadRequests), case for case through the binary. Two
		// more functions, configured as the table's publishers: one with the
		// bucket and the keys, one with neither for the NoBucket cases; both
		// send to the work queue, which the subtests above left empty.
		keyed := lambdaStart(t, bin, lambdart.Start(t), lambdaTableEnv(queues.Work, bucket, publishertest.Keys))
		bare := lambdaStart(t, bin, lambdart.Start(t), lambdaTableEnv(queues.Work, "", nil))

		// The seed: a job the status cases ask about, under the key the
		// reused-key case sends again with another body.
		const seedKey = "seed-key"
		seedHeaders := map[string]string{"content-type": "application/json", "authorization": "Bearer " + publishertest.Key,
			"idempotency-key": seedKey}
		seed := keyed.invoke(t, apigw.Event("POST", "/v1/jobs", seedHeaders, `{"items":[{"id":"seed","text":"x"}]}`)).accepted(t, 1)

		cases := publishertest.Cases(seed.JobID, seedKey)
		if len(cases) < 20 {
			t.Fatalf("only %d cases", len(cases))
		}
		for _, tc := range cases {
			t.Run(tc.Name, func(t *testing.T) {
				f := keyed
				if tc.NoBucket {
					f = bare
				}
				method, path, h := tc.Request()
				// API Gateway sends header names in lower case.
				lower := map[string]string{}
				for k, v := range h {
					lower[strings.ToLower(k)] = v
				}
				ev := apigw.Event(method, path, lower, tc.Body)
				if !utf8.ValidString(tc.Body) {
					// A JSON string cannot carry it: API Gateway sends
					// such a body in base64.
					ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString([]byte(tc.Body)), true
				}
				resp := f.invoke(t, ev)
				header := http.Header{}
				for k, v := range resp.Headers {
					header.Set(k, v)
				}
				for k, vs := range resp.MultiValueHeaders {
					for _, v := range vs {
						header.Add(k, v)
					}
				}
				publishertest.Check(t, tc, resp.StatusCode, header, []byte(resp.body))
			})
		}

		// Nothing but the seed reached the queue: lambdaExpectWork takes the
		// seed's chunk and flags any other job's; Counts sees what is left.
		lambdaExpectWork(t, client, queues.Work, seed.JobID, 1, []string{"seed"})
		if v, f, err := jobq.Counts(t.Context(), client, queues.Work); err != nil || v+f != 0 {
			t.Errorf("after the table the work queue holds %d visible and %d in flight (%v); want only the seed job, taken", v, f, err)
		}
		keyed.checkAlive(t)
		bare.checkAlive(t)
	})

	t.Run("event that is not JSON", func(t *testing.T) {
		// API Gateway never sends one; a direct invocation might. The Lambda
		// client reports it as a function error, and the function serves on.
		_, fnErr, err := rt.Invoke(t.Context(), []byte("not json"))
		if err != nil || fnErr == nil {
			t.Errorf("a non-JSON event: %v, %v; want a function error", fnErr, err)
		}
		if resp := fn.invoke(t, apigw.Event("GET", "/healthz", nil, "")); resp.StatusCode != http.StatusOK {
			t.Errorf("GET /healthz after a bad event: %d; want 200", resp.StatusCode)
		}
	})

	t.Run("no metrics", func(t *testing.T) {
		// API Gateway would route /metrics to API clients: the function
		// does not serve it.
		resp := fn.invoke(t, apigw.Event("GET", "/metrics", nil, ""))
		if resp.StatusCode != http.StatusNotFound || strings.Contains(resp.body, "# TYPE") {
			t.Errorf("GET /metrics: %d, %.200q; want 404", resp.StatusCode, resp.body)
		}
	})

	fn.checkAlive(t)
}

// VRAMQ_MAX_ITEM_BYTES of the function without auth, so that a modest item
// takes the claim check. The bad-input limits are the API table's
// (lambdaTableEnv).
const lambdaMaxItem = 8 << 10

var jsonHeaders = map[string]string{"content-type": "application/json"}

// lambdaTableEnv is the environment of a function configured as the API
// table's publisher (publishertest): its limits, the keys (none: no auth) and
// the bucket (none: no payload bucket), through the flags' variables as a
// deployment sets them. VRAMQ_MAX_ITEM_BYTES is left to its default, as the
// table's Config leaves MaxItemBytes.
func lambdaTableEnv(queue, bucket string, keys []string) map[string]string {
	return map[string]string{
		"QUEUE_URL":               queue,
		"PAYLOAD_BUCKET":          bucket,
		"VRAMQ_API_KEYS":          strings.Join(keys, ","),
		"VRAMQ_MAX_MESSAGE_BYTES": strconv.Itoa(publishertest.MaxMessageBytes),
		"VRAMQ_MAX_BODY_BYTES":    strconv.Itoa(publishertest.MaxBodyBytes),
		"VRAMQ_MAX_ITEMS":         strconv.Itoa(publishertest.MaxItems),
		"VRAMQ_MAX_CHUNK_ITEMS":   strconv.Itoa(publishertest.MaxChunkItems),
		"VRAMQ_MAX_ITEM_BYTES":    "",
		"VRAMQ_MODELS":            publishertest.Model,
		"VRAMQ_MAX_N":             strconv.Itoa(publishertest.MaxN),
		"VRAMQ_MAX_OUTPUT_TOKENS": strconv.Itoa(publishertest.MaxOutputTokens),
	}
}

// lambdaBuild returns the bootstrap to run: this test binary, which runs
// the publisher's main when VRAMQ_TEST_MAIN=1 (see TestMain), the same
// program make lambda builds. What make lambda adds (lambda.norpc, no cgo,
// -trimpath) leaves out code this path does not reach; make lambda itself
// is not built here.
func lambdaBuild(t *testing.T) string {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

type lambdaFunction struct {
	rt     *lambdart.Server
	cmd    *exec.Cmd
	exited chan struct{}
	alive  context.Context // cancelled when the process exits, so that an invocation fails at once
	mu     sync.Mutex
	logs   bytes.Buffer
}

func (f *lambdaFunction) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.logs.Write(p)
}

// lambdaStart runs the bootstrap as Lambda would: AWS_LAMBDA_RUNTIME_API and
// the function's environment, the AWS settings of the endpoint under test
// inherited.
func lambdaStart(t *testing.T, bin string, rt *lambdart.Server, env map[string]string) *lambdaFunction {
	t.Helper()
	alive, died := context.WithCancelCause(context.Background())
	f := &lambdaFunction{rt: rt, exited: make(chan struct{}), alive: alive}
	f.cmd = exec.Command(bin)
	f.cmd.Env = append(os.Environ(), "VRAMQ_TEST_MAIN=1", "AWS_LAMBDA_RUNTIME_API="+rt.Addr(), "AWS_LAMBDA_FUNCTION_NAME=vramq-publisher",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=512", "AWS_LAMBDA_FUNCTION_VERSION=$LATEST")
	for k, v := range env {
		f.cmd.Env = append(f.cmd.Env, k+"="+v)
	}
	f.cmd.Stdout, f.cmd.Stderr = f, f
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = f.cmd.Wait()
		died(fmt.Errorf("the function exited: %v", f.cmd.ProcessState))
		close(f.exited)
	}()
	t.Cleanup(func() {
		_ = f.cmd.Process.Kill()
		<-f.exited
		if t.Failed() {
			f.mu.Lock()
			t.Logf("function output:\n%s", f.logs.String())
			f.mu.Unlock()
		}
	})
	return f
}

// checkAlive fails the test if the function has exited: nothing it was sent
// should end it.
func (f *lambdaFunction) checkAlive(t *testing.T) {
	t.Helper()
	select {
	case <-f.exited:
		t.Errorf("the function exited during the test: %v", f.cmd.ProcessState)
	default:
	}
}

type lambdaResponse struct {
	events.APIGatewayV2HTTPResponse
	body string // decoded
}

// invoke sends ev through the Runtime API as API Gateway would, as JSON.
func (f *lambdaFunction) invoke(t *testing.T, ev any) lambdaResponse {
	t.Helper()
	payload, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.alive, 30*time.Second)
	defer cancel()
	out, fnErr, err := f.rt.Invoke(ctx, payload)
	if err != nil {
		t.Fatalf("invoke: %v", err)
	}
	if fnErr != nil {
		t.Fatalf("invoke: function error %v", fnErr)
	}
	var r lambdaResponse
	if err := json.Unmarshal(out, &r.APIGatewayV2HTTPResponse); err != nil {
		t.Fatalf("response %q is not a payload 2.0 response: %v", out, err)
	}
	r.body = r.Body
	if r.IsBase64Encoded {
		b, err := base64.StdEncoding.DecodeString(r.Body)
		if err != nil {
			t.Fatalf("response body: %v", err)
		}
		r.body = string(b)
	}
	return r
}

type lambdaCreated struct {
	JobID  string `json:"job_id"`
	Chunks int    `json:"chunks"`
}

// accepted checks a 202 for a job of chunks and returns it.
func (r lambdaResponse) accepted(t *testing.T, chunks int) lambdaCreated {
	t.Helper()
	var c lambdaCreated
	if r.StatusCode != http.StatusAccepted || json.Unmarshal([]byte(r.body), &c) != nil || c.JobID == "" || c.Chunks != chunks {
		t.Fatalf("got %d %s; want 202 with a job_id and %d chunks", r.StatusCode, r.body, chunks)
	}
	return c
}

// lambdaExpectWork receives the job's chunks from the work queue, checks
// they hold exactly ids, and deletes them, so that the queue is empty again.
func lambdaExpectWork(t *testing.T, client *sqs.Client, url, jobID string, chunks int, ids []string) []job.Work {
	t.Helper()
	var works []job.Work
	deadline := time.Now().Add(15 * time.Second)
	for len(works) < chunks && time.Now().Before(deadline) {
		out, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			var w job.Work
			if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &w); err != nil {
				t.Fatalf("work message %q: %v", aws.ToString(m.Body), err)
			}
			if a := m.MessageAttributes[job.AttrJobID]; w.JobID != jobID || aws.ToString(a.StringValue) != jobID {
				t.Errorf("work message of job %q (attribute %q); want only job %s on the queue", w.JobID, aws.ToString(a.StringValue), jobID)
			}
			works = append(works, w)
			if _, err := client.DeleteMessage(t.Context(), &sqs.DeleteMessageInput{QueueUrl: &url, ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var got []string
	var chunkIdx []int
	for _, w := range works {
		chunkIdx = append(chunkIdx, w.Chunk)
		for _, it := range w.Items {
			got = append(got, it.ID)
		}
	}
	slices.Sort(got)
	slices.Sort(chunkIdx)
	want := slices.Sorted(slices.Values(ids))
	if len(works) != chunks || !slices.Equal(got, want) || chunkIdx[0] != 0 || chunkIdx[len(chunkIdx)-1] != chunks-1 {
		t.Errorf("job %s on the queue: chunks %v with items %v; want chunks 0..%d with %v", jobID, chunkIdx, got, chunks-1, want)
	}
	return works
}

func lambdaItems(n int) []map[string]any {
	items := make([]map[string]any, n)
	for i := range items {
		items[i] = map[string]any{"id": fmt.Sprintf("item-%d", i), "text": fmt.Sprintf("text number %d", i)}
	}
	return items
}

func lambdaIDs(items []map[string]any) []string {
	var ids []string
	for _, it := range items {
		ids = append(ids, it["id"].(string))
	}
	return ids
}

func lambdaJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lambdaDocumentedEvent is POST /v1/jobs with body as the event document
// API Gateway's documentation shows for payload 2.0, field for field: a JWT
// authorizer, cookies, query and stage variables, and the fields the Go type
// leaves empty when it builds an event.
func lambdaDocumentedEvent(t *testing.T, body string) json.RawMessage {
	t.Helper()
	const doc = `{
  "version": "2.0",
  "routeKey": "POST /v1/jobs",
  "rawPath": "/v1/jobs",
  "rawQueryString": "source=test&source=lambda",
  "cookies": ["session=s-1", "theme=dark"],
  "headers": {
    "accept": "application/json",
    "content-length": %[1]q,
    "content-type": "application/json; charset=utf-8",
    "host": "r4nd0m1d.execute-api.us-east-1.amazonaws.com",
    "user-agent": "upstream/1.0",
    "x-amzn-trace-id": "Root=1-65f0c0de-0123456789abcdef01234567",
    "x-forwarded-for": "192.0.2.10, 198.51.100.23",
    "x-forwarded-port": "443",
    "x-forwarded-proto": "https"
  },
  "queryStringParameters": {"source": "test,lambda"},
  "requestContext": {
    "accountId": "123456789012",
    "apiId": "r4nd0m1d",
    "authorizer": {"jwt": {"claims": {"sub": "client-1", "iss": "https://issuer.example.com"}, "scopes": ["jobs:write"]}},
    "domainName": "r4nd0m1d.execute-api.us-east-1.amazonaws.com",
    "domainPrefix": "r4nd0m1d",
    "http": {"method": "POST", "path": "/v1/jobs", "protocol": "HTTP/1.1", "sourceIp": "198.51.100.23", "userAgent": "upstream/1.0"},
    "requestId": "JKJaXmPLvHcESHA=",
    "routeKey": "POST /v1/jobs",
    "stage": "$default",
    "time": "21/Nov/2026:10:00:00 +0000",
    "timeEpoch": 1795255200000
  },
  "body": %[2]s,
  "pathParameters": {},
  "isBase64Encoded": false,
  "stageVariables": {"env": "test"}
}`
	quoted, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return json.RawMessage(fmt.Sprintf(doc, strconv.Itoa(len(body)), quoted))
}

// lambdaFunctionURLEvent is the same request as a Lambda function URL sends
// it, in its own type: the function must not care which service called.
func lambdaFunctionURLEvent(method, path string, headers map[string]string, body string) events.LambdaFunctionURLRequest {
	ev := apigw.Event(method, path, headers, body)
	const domain = "abcdefghijklmnop.lambda-url.us-east-1.on.aws"
	ev.Headers["host"] = domain
	return events.LambdaFunctionURLRequest{
		Version: "2.0", RawPath: ev.RawPath, RawQueryString: ev.RawQueryString, Headers: ev.Headers, Body: ev.Body,
		RequestContext: events.LambdaFunctionURLRequestContext{
			AccountID: "123456789012", RequestID: ev.RequestContext.RequestID,
			APIID: "abcdefghijklmnop", DomainName: domain, DomainPrefix: "abcdefghijklmnop",
			Time: ev.RequestContext.Time, TimeEpoch: ev.RequestContext.TimeEpoch,
			HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: method, Path: ev.RawPath, Protocol: "HTTP/1.1",
				SourceIP: "198.51.100.23", UserAgent: "curl/8.5.0"},
		},
	}
}

// Under Lambda the client is the source address API Gateway saw
// (requestContext.http.sourceIp), whatever X-Forwarded-For the client sent:
// a burst from one address beyond -rate-burst is refused with a JSON 429 and
// Retry-After, another address has its own bucket, and the refused request
// enqueues nothing.
func TestLambdaRateLimitBySourceIP(t *testing.T) {
	client := sqstest.Client(t)
	queues := sqstest.Queues(t, client, 5)
	fn := lambdaStart(t, lambdaBuild(t), lambdart.Start(t), map[string]string{
		"QUEUE_URL": queues.Work, "PAYLOAD_BUCKET": "", "VRAMQ_API_KEYS": "",
		"VRAMQ_RATE_LIMIT": "0.001", "VRAMQ_RATE_BURST": "2", // no token comes back during the test
	})
	post := func(sourceIP, forwardedFor string) lambdaResponse {
		ev := apigw.Event("POST", "/v1/jobs", map[string]string{"content-type": "application/json", "x-forwarded-for": forwardedFor}, lambdaJSON(t, map[string]any{"items": lambdaItems(1)}))
		ev.RequestContext.HTTP.SourceIP = sourceIP
		return fn.invoke(t, ev)
	}
	var got []int
	for i := range 3 {
		r := post("203.0.113.9", fmt.Sprintf("192.0.2.%d", i)) // a forged, changing X-Forwarded-For
		got = append(got, r.StatusCode)
		if r.StatusCode == http.StatusTooManyRequests && (r.Headers["Retry-After"] == "" || !strings.Contains(r.body, `"code":"rate_limited"`)) {
			t.Errorf("429 with headers %v and body %s; want Retry-After and the JSON error", r.Headers, r.body)
		}
	}
	got = append(got, post("198.51.100.77", "").StatusCode)
	if fmt.Sprint(got) != "[202 202 429 202]" {
		t.Errorf("statuses %v; want [202 202 429 202]: two from one address, the third refused, another address served", got)
	}
	// The queue's counts are approximate: read them until they reach 3.
	var seen int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		visible, inflight, err := jobq.Counts(t.Context(), client, queues.Work)
		if err != nil {
			t.Fatal(err)
		}
		if seen = visible + inflight; seen >= 3 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if seen != 3 {
		t.Errorf("%d messages on the queue, want 3: one per accepted job, none for the refused one", seen)
	}
	fn.checkAlive(t)
}
