package lambdart_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/vramq/vramq/internal/testenv/lambdart"
)

// The test binary doubles as a Lambda function built with aws-lambda-go, so
// the server is checked against the real runtime client, not only against
// this file's reading of the documentation.
func TestMain(m *testing.M) {
	if os.Getenv("LAMBDART_TEST_FUNCTION") == "1" {
		lambda.Start(testFunction)
		os.Exit(3) // Start never returns
	}
	os.Exit(m.Run())
}

type testEvent struct {
	Echo  string `json:"echo"`
	Fail  bool   `json:"fail"`
	Panic bool   `json:"panic"`
	Big   bool   `json:"big"`
}

type testResult struct {
	Echo        string `json:"echo"`
	RequestID   string `json:"request_id"`
	FunctionARN string `json:"function_arn"`
	DeadlineMS  int64  `json:"deadline_ms"`
	Big         string `json:"big,omitempty"`
}

func testFunction(ctx context.Context, ev testEvent) (testResult, error) {
	switch {
	case ev.Fail:
		return testResult{}, errors.New("failed on purpose")
	case ev.Panic:
		panic("panicked on purpose")
	}
	lc, _ := lambdacontext.FromContext(ctx)
	d, _ := ctx.Deadline()
	r := testResult{Echo: ev.Echo, RequestID: lc.AwsRequestID, FunctionARN: lc.InvokedFunctionArn, DeadlineMS: d.UnixMilli()}
	if ev.Big {
		r.Big = strings.Repeat("x", lambdart.MaxPayload)
	}
	return r, nil
}

// startFunction runs the test function against s; the returned channel is
// closed when the process exits.
func startFunction(t *testing.T, s *lambdart.Server) <-chan struct{} {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LAMBDART_TEST_FUNCTION=1", "AWS_LAMBDA_RUNTIME_API="+s.Addr())
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("function output:\n%s", logs.String())
		}
	})
	return exited
}

func invoke(t *testing.T, s *lambdart.Server, ev testEvent) (testResult, *lambdart.FunctionError) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	payload, _ := json.Marshal(ev)
	resp, fnErr, err := s.Invoke(ctx, payload)
	if err != nil {
		t.Fatalf("invoke %+v: %v", ev, err)
	}
	var r testResult
	if fnErr == nil {
		if err := json.Unmarshal(resp, &r); err != nil {
			t.Fatalf("response %q: %v", resp, err)
		}
	}
	return r, fnErr
}

func TestWithAWSLambdaGo(t *testing.T) {
	s := lambdart.Start(t)
	exited := startFunction(t, s)

	start := time.Now()
	r1, fnErr := invoke(t, s, testEvent{Echo: "one"})
	if fnErr != nil {
		t.Fatal(fnErr)
	}
	t.Logf("first invocation, with the process starting: %v", time.Since(start))
	if r1.Echo != "one" || r1.FunctionARN != lambdart.FunctionARN || len(r1.RequestID) != 36 {
		t.Errorf("got %+v; want the event echoed under the function's ARN and a request id", r1)
	}
	if d := time.Until(time.UnixMilli(r1.DeadlineMS)); d < 15*time.Second || d > 21*time.Second {
		t.Errorf("the function's deadline is %v away; want Invoke's context deadline (about 20s)", d)
	}

	// A returned error is a function error, and the function serves on.
	if _, fnErr := invoke(t, s, testEvent{Fail: true}); fnErr == nil || fnErr.Type != "errorString" || fnErr.Message != "failed on purpose" {
		t.Errorf("function error %+v; want errorString: failed on purpose", fnErr)
	}
	start = time.Now()
	r2, fnErr := invoke(t, s, testEvent{Echo: "two"})
	if fnErr != nil || r2.Echo != "two" || r2.RequestID == r1.RequestID {
		t.Errorf("after a function error: %+v, %v; want a fresh invocation served", r2, fnErr)
	}
	t.Logf("warm invocation: %v", time.Since(start))

	// A panic is reported, then aws-lambda-go exits the process.
	if _, fnErr := invoke(t, s, testEvent{Panic: true}); fnErr == nil || fnErr.Type != "string" || fnErr.Message != "panicked on purpose" {
		t.Errorf("panic reported as %+v; want string: panicked on purpose", fnErr)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("the function did not exit after a panic")
	}
}

func TestResponseTooLarge(t *testing.T) {
	s := lambdart.Start(t)
	exited := startFunction(t, s)
	if _, fnErr := invoke(t, s, testEvent{Big: true}); fnErr == nil || fnErr.Type != "Function.ResponseSizeTooLarge" {
		t.Errorf("a response over 6 MB: %v; want Function.ResponseSizeTooLarge", fnErr)
	}
	// The Go runtime client treats the 413 as fatal, as it would in Lambda.
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("the function did not exit after its response was refused")
	}
}

// runtimeCall makes one runtime API call by hand.
func runtimeCall(t *testing.T, s *lambdart.Server, method, path string, header http.Header, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+s.Addr()+"/2018-06-01/runtime"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

type outcome struct {
	resp  []byte
	fnErr *lambdart.FunctionError
	err   error
}

func invokeAsync(s *lambdart.Server, ctx context.Context, event string) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		r, fe, err := s.Invoke(ctx, []byte(event))
		ch <- outcome{r, fe, err}
	}()
	return ch
}

// The documented protocol, call by call.
func TestProtocol(t *testing.T) {
	s := lambdart.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	// Two events in flight at once, to two concurrent pollers: answered out
	// of order, each reaches its own Invoke.
	a, b := invokeAsync(s, ctx, `{"n":"a"}`), invokeAsync(s, ctx, `{"n":"b"}`)
	type polled struct {
		id, event string
		h         http.Header
	}
	var wg sync.WaitGroup
	got := make([]polled, 2)
	for i := range got {
		wg.Go(func() {
			resp, body := runtimeCall(t, s, "GET", "/invocation/next", nil, "")
			if resp.StatusCode != http.StatusOK {
				t.Errorf("next: %d %s", resp.StatusCode, body)
			}
			got[i] = polled{resp.Header.Get(lambdart.HeaderRequestID), body, resp.Header}
		})
	}
	wg.Wait()
	for _, p := range got {
		deadline, err := strconv.ParseInt(p.h.Get(lambdart.HeaderDeadline), 10, 64)
		if p.id == "" || err != nil || deadline < time.Now().UnixMilli() || p.h.Get(lambdart.HeaderFunctionARN) != lambdart.FunctionARN ||
			!strings.HasPrefix(p.h.Get(lambdart.HeaderTraceID), "Root=1-") {
			t.Errorf("next's headers %v; want request id, a future deadline, function ARN and trace id", p.h)
		}
	}
	if got[0].id == got[1].id {
		t.Fatalf("two invocations share request id %s", got[0].id)
	}
	for i := len(got) - 1; i >= 0; i-- {
		p := got[i]
		if resp, body := runtimeCall(t, s, "POST", "/invocation/"+p.id+"/response", nil, "re:"+p.event); resp.StatusCode != http.StatusAccepted {
			t.Errorf("response: %d %s; want 202", resp.StatusCode, body)
		}
	}
	for name, ch := range map[string]<-chan outcome{`{"n":"a"}`: a, `{"n":"b"}`: b} {
		if o := <-ch; o.err != nil || o.fnErr != nil || string(o.resp) != "re:"+name {
			t.Errorf("invoke %s: %q, %v, %v", name, o.resp, o.fnErr, o.err)
		}
	}

	// Answering twice, or an unknown id, is refused.
	if resp, _ := runtimeCall(t, s, "POST", "/invocation/"+got[0].id+"/response", nil, "again"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("second response: %d; want 400", resp.StatusCode)
	}

	// An invocation error, typed by its header.
	c := invokeAsync(s, ctx, `{}`)
	resp, _ := runtimeCall(t, s, "GET", "/invocation/next", nil, "")
	id := resp.Header.Get(lambdart.HeaderRequestID)
	errDoc := `{"errorMessage":"bad input","errorType":"ValueError","stackTrace":[]}`
	if resp, body := runtimeCall(t, s, "POST", "/invocation/"+id+"/error", http.Header{lambdart.HeaderErrorType: {"Function.ValueError"}}, errDoc); resp.StatusCode != http.StatusAccepted {
		t.Errorf("error: %d %s; want 202", resp.StatusCode, body)
	}
	if o := <-c; o.err != nil || o.fnErr == nil || o.fnErr.Type != "Function.ValueError" || o.fnErr.Message != "bad input" || string(o.fnErr.Body) != errDoc {
		t.Errorf("invoke with an error: %+v", o)
	}
}

func TestResponseTrailerError(t *testing.T) {
	s := lambdart.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := invokeAsync(s, ctx, `{}`)
	resp, _ := runtimeCall(t, s, "GET", "/invocation/next", nil, "")
	id := resp.Header.Get(lambdart.HeaderRequestID)

	// As aws-lambda-go reports a response body that fails while streaming:
	// chunked, with the error in trailers.
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/2018-06-01/runtime/invocation/"+id+"/response", pr)
	req.Trailer = http.Header{lambdart.HeaderErrorType: nil, lambdart.HeaderErrorBody: nil}
	go func() {
		_, _ = io.WriteString(pw, "partial")
		req.Trailer.Set(lambdart.HeaderErrorType, "ReadError")
		req.Trailer.Set(lambdart.HeaderErrorBody,
			"eyJlcnJvck1lc3NhZ2UiOiJkaXNrIGdvbmUiLCJlcnJvclR5cGUiOiJSZWFkRXJyb3IifQ==") // {"errorMessage":"disk gone","errorType":"ReadError"}
		pw.Close()
	}()
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if o := <-c; o.err != nil || o.fnErr == nil || o.fnErr.Type != "ReadError" || o.fnErr.Message != "disk gone" {
		t.Errorf("invoke whose response failed midway: %+v", o)
	}
}

func TestInitError(t *testing.T) {
	s := lambdart.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := invokeAsync(s, ctx, `{}`)
	resp, body := runtimeCall(t, s, "POST", "/init/error", http.Header{lambdart.HeaderErrorType: {"Runtime.ConfigError"}},
		`{"errorMessage":"missing QUEUE_URL","errorType":"ConfigError"}`)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("init error: %d %s", resp.StatusCode, body)
	}
	o := <-c
	var fe *lambdart.FunctionError
	if !errors.Is(o.err, lambdart.ErrInitFailed) || !errors.As(o.err, &fe) || fe.Type != "Runtime.ConfigError" || fe.Message != "missing QUEUE_URL" {
		t.Errorf("invoke after an init error: %v; want ErrInitFailed with the reported error", o.err)
	}
	if got := s.InitError(); got == nil || got.Type != "Runtime.ConfigError" {
		t.Errorf("InitError() = %v", got)
	}
}

func TestInvokeLimits(t *testing.T) {
	s := lambdart.Start(t)
	if _, _, err := s.Invoke(t.Context(), make([]byte, lambdart.MaxPayload+1)); !errors.Is(err, lambdart.ErrRequestTooLarge) {
		t.Errorf("an event over 6 MB: %v; want ErrRequestTooLarge", err)
	}

	// No runtime polls: the deadline ends the invocation.
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := s.Invoke(ctx, []byte(`{}`)); !errors.Is(err, lambdart.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("an invocation nobody polled for: %v; want ErrTimeout", err)
	}

	// A runtime polls but never answers.
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := invokeAsync(s, ctx, `{}`)
	resp, _ := runtimeCall(t, s, "GET", "/invocation/next", nil, "")
	id := resp.Header.Get(lambdart.HeaderRequestID)
	cancel()
	if o := <-c; !errors.Is(o.err, context.Canceled) {
		t.Errorf("invoke cancelled while in flight: %v", o.err)
	}
	// Its late answer finds nothing to answer.
	if resp, _ := runtimeCall(t, s, "POST", "/invocation/"+id+"/response", nil, "late"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("late response: %d; want 400", resp.StatusCode)
	}

	s.Close()
	if _, _, err := s.Invoke(t.Context(), []byte(`{}`)); !errors.Is(err, lambdart.ErrClosed) {
		t.Errorf("invoke after Close: %v; want ErrClosed", err)
	}
	s.Close() // idempotent
}
