// Package lambdart is a local AWS Lambda Runtime API, so that tests run a
// function's bootstrap binary the way Lambda runs it: the binary polls for
// events and posts back responses and errors over HTTP, and the test invokes
// it with event payloads.
//
// It implements the calls a runtime makes, as documented for API version
// 2018-06-01 (https://docs.aws.amazon.com/lambda/latest/dg/runtimes-api.html)
// and as github.com/aws/aws-lambda-go makes them: next invocation, invocation
// response (including an error reported in the request's trailers, as
// aws-lambda-go does when a streamed response fails), invocation error, and
// initialization error. Not implemented: the Extensions and Telemetry APIs,
// client context and Cognito identity headers, and the streaming response
// mode, whose bytes are returned undecoded.
package lambdart

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

const (
	// MaxPayload is Lambda's limit on a synchronous invocation's event and on
	// its response: 6 MB, in binary megabytes.
	MaxPayload = 6 << 20

	// DefaultTimeout is the function timeout when Invoke's context has no
	// deadline: API Gateway's own integration timeout.
	DefaultTimeout = 30 * time.Second

	// FunctionARN is the ARN every invocation is made under.
	FunctionARN = "arn:aws:lambda:us-east-1:123456789012:function:lambdart"

	prefix = "/2018-06-01/runtime"
)

// The runtime API's request and response headers.
const (
	HeaderRequestID   = "Lambda-Runtime-Aws-Request-Id"
	HeaderDeadline    = "Lambda-Runtime-Deadline-Ms"
	HeaderFunctionARN = "Lambda-Runtime-Invoked-Function-Arn"
	HeaderTraceID     = "Lambda-Runtime-Trace-Id"
	HeaderErrorType   = "Lambda-Runtime-Function-Error-Type"
	// HeaderErrorBody is a trailer of a response whose body failed midway:
	// the error document, base64-encoded.
	HeaderErrorBody = "Lambda-Runtime-Function-Error-Body"
)

var (
	// ErrClosed: the server was closed.
	ErrClosed = errors.New("lambdart: server closed")
	// ErrTimeout: the function did not answer by the invocation's deadline
	// (Lambda reports "Task timed out").
	ErrTimeout = errors.New("lambdart: task timed out")
	// ErrInitFailed: the runtime reported an initialization error; the
	// *FunctionError it posted is in the error's chain.
	ErrInitFailed = errors.New("lambdart: runtime initialization failed")
	// ErrRequestTooLarge: the event is over MaxPayload, which Lambda rejects
	// before any function runs.
	ErrRequestTooLarge = errors.New("lambdart: event larger than 6 MB")
)

// FunctionError is an error a runtime reported: an invocation error, a
// failed response, or an initialization error.
type FunctionError struct {
	Type    string // the error type header or trailer, else the document's errorType
	Message string // the document's errorMessage, if it has one
	Body    []byte // the error document as the runtime sent it
}

func (e *FunctionError) Error() string {
	if e.Message == "" {
		return e.Type
	}
	return e.Type + ": " + e.Message
}

func newFunctionError(typ string, body []byte) *FunctionError {
	var doc struct {
		Message string `json:"errorMessage"`
		Type    string `json:"errorType"`
	}
	_ = json.Unmarshal(body, &doc) // a document that is not JSON is still an error
	e := &FunctionError{Type: typ, Message: doc.Message, Body: body}
	if e.Type == "" {
		e.Type = doc.Type
	}
	if e.Type == "" {
		e.Type = "Unhandled"
	}
	return e
}

// Server is a runtime API for one function. Any number of runtimes (or
// concurrent pollers of one runtime, as with Lambda Managed Instances) may
// poll it; each event goes to one of them. Its methods may be called
// concurrently.
type Server struct {
	addr string
	srv  *http.Server

	handoff chan *invocation // an Invoke waiting for a poller, to one poller

	mu       sync.Mutex
	inflight map[string]*invocation // handed to a runtime, not yet answered
	initErr  *FunctionError

	initFailed chan struct{} // closed when initErr is set
	closed     chan struct{}
	closeOnce  sync.Once
	initOnce   sync.Once
}

type invocation struct {
	id       string
	event    []byte
	deadline time.Time
	traceID  string

	done     chan struct{} // closed once response or fnErr is set
	once     sync.Once
	response []byte
	fnErr    *FunctionError
}

func (inv *invocation) finish(response []byte, fnErr *FunctionError) {
	inv.once.Do(func() {
		inv.response, inv.fnErr = response, fnErr
		close(inv.done)
	})
}

// Start serves a runtime API on a free port of 127.0.0.1 until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("lambdart: %v", err)
	}
	s := &Server{
		addr:       ln.Addr().String(),
		handoff:    make(chan *invocation),
		inflight:   map[string]*invocation{},
		initFailed: make(chan struct{}),
		closed:     make(chan struct{}),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+prefix+"/invocation/next", s.next)
	mux.HandleFunc("POST "+prefix+"/invocation/{id}/response", s.response)
	mux.HandleFunc("POST "+prefix+"/invocation/{id}/error", s.invocationError)
	mux.HandleFunc("POST "+prefix+"/init/error", s.initError)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	t.Cleanup(s.Close)
	return s
}

// Addr is the value for the runtime's AWS_LAMBDA_RUNTIME_API: host and port,
// no scheme.
func (s *Server) Addr() string { return s.addr }

// Close stops the server. Pollers waiting for an event get an error, as does
// any Invoke still waiting. It is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closed) // first, so that blocked pollers return and Shutdown can finish
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			_ = s.srv.Close()
		}
	})
}

// InitError is the initialization error a runtime reported, or nil.
func (s *Server) InitError() *FunctionError {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.initErr
}

// Invoke sends event to the function, as a synchronous invocation, and waits
// for its answer: the response payload, or the error the function reported
// (fnErr), or err when there is no answer — the context ended, the deadline
// passed (ErrTimeout), the runtime failed to initialize (ErrInitFailed), the
// server closed (ErrClosed), or the event is too large (ErrRequestTooLarge).
//
// The function's deadline is ctx's, or DefaultTimeout from now. Invoke waits
// for a runtime to poll, so it may be called before the runtime starts.
func (s *Server) Invoke(ctx context.Context, event []byte) (response []byte, fnErr *FunctionError, err error) {
	if len(event) > MaxPayload {
		return nil, nil, ErrRequestTooLarge
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
		deadline, _ = ctx.Deadline()
	}
	inv := &invocation{id: newRequestID(), event: event, deadline: deadline, traceID: newTraceID(), done: make(chan struct{})}

	select {
	case s.handoff <- inv:
	case <-ctx.Done():
		return nil, nil, ended(ctx, "no runtime polled for the event")
	case <-s.initFailed:
		return nil, nil, fmt.Errorf("%w: %w", ErrInitFailed, s.InitError())
	case <-s.closed:
		return nil, nil, ErrClosed
	}
	defer s.forget(inv.id)
	select {
	case <-inv.done:
		return inv.response, inv.fnErr, nil
	case <-ctx.Done():
		return nil, nil, ended(ctx, "request "+inv.id+" had no answer")
	case <-s.closed:
		return nil, nil, ErrClosed
	}
}

// ended explains why ctx ended: past the deadline, the function timed out.
func ended(ctx context.Context, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s: %w", ErrTimeout, what, context.Cause(ctx))
	}
	return context.Cause(ctx)
}

func (s *Server) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inflight, id)
}

// take removes and returns the in-flight invocation id, or nil: an
// invocation is answered once.
func (s *Server) take(id string) *invocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	inv := s.inflight[id]
	delete(s.inflight, id)
	return inv
}

// next blocks until an event is invoked, as Lambda's does: the runtime must
// not time this call out.
func (s *Server) next(w http.ResponseWriter, r *http.Request) {
	var inv *invocation
	select {
	case inv = <-s.handoff:
	case <-r.Context().Done():
		return
	case <-s.closed:
		writeError(w, http.StatusInternalServerError, "Runtime.Closed", "the runtime API is shutting down")
		return
	}
	// Registered before the event is sent, so that the runtime's answer
	// always finds it.
	s.mu.Lock()
	s.inflight[inv.id] = inv
	s.mu.Unlock()

	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set(HeaderRequestID, inv.id)
	h.Set(HeaderDeadline, strconv.FormatInt(inv.deadline.UnixMilli(), 10))
	h.Set(HeaderFunctionARN, FunctionARN)
	h.Set(HeaderTraceID, inv.traceID)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(inv.event)
}

// response takes an invocation's result. A body over MaxPayload is refused
// with 413 and the invocation fails, as in Lambda, where the Go runtime
// client then exits (it treats any status but 202 as fatal).
func (s *Server) response(w http.ResponseWriter, r *http.Request) {
	inv := s.take(r.PathValue("id"))
	if inv == nil {
		writeError(w, http.StatusBadRequest, "InvalidRequestID", "no invocation in flight has this request id")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxPayload+1))
	if err != nil {
		inv.finish(nil, &FunctionError{Type: "Runtime.ResponseReadError", Message: err.Error()})
		writeError(w, http.StatusBadRequest, "InvalidRequest", err.Error())
		return
	}
	if len(body) > MaxPayload {
		inv.finish(nil, &FunctionError{
			Type:    "Function.ResponseSizeTooLarge",
			Message: "response payload size exceeded maximum allowed payload size (6291456 bytes)",
		})
		writeError(w, http.StatusRequestEntityTooLarge, "RequestEntityTooLarge", "response payload over 6291456 bytes")
		return
	}
	// The trailers are only known once the body has been read to its end.
	if typ := r.Trailer.Get(HeaderErrorType); typ != "" {
		doc, _ := base64.StdEncoding.DecodeString(r.Trailer.Get(HeaderErrorBody))
		inv.finish(nil, newFunctionError(typ, doc))
	} else {
		inv.finish(body, nil)
	}
	accepted(w)
}

func (s *Server) invocationError(w http.ResponseWriter, r *http.Request) {
	inv := s.take(r.PathValue("id"))
	if inv == nil {
		writeError(w, http.StatusBadRequest, "InvalidRequestID", "no invocation in flight has this request id")
		return
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, MaxPayload))
	inv.finish(nil, newFunctionError(r.Header.Get(HeaderErrorType), body))
	accepted(w)
}

func (s *Server) initError(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, MaxPayload))
	fe := newFunctionError(r.Header.Get(HeaderErrorType), body)
	s.initOnce.Do(func() {
		s.mu.Lock()
		s.initErr = fe
		s.mu.Unlock()
		close(s.initFailed)
	})
	accepted(w)
}

func accepted(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = io.WriteString(w, `{"status":"OK"}`+"\n")
}

// writeError answers in the runtime API's error document format.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	b, _ := json.Marshal(map[string]string{"errorType": typ, "errorMessage": msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// newRequestID makes a random UUID (version 4), the form of Lambda's ids.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// newTraceID makes an X-Ray trace header of the form Lambda sends.
func newTraceID() string {
	var b [20]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("Root=1-%08x-%s;Parent=%s;Sampled=0", time.Now().Unix(), hex.EncodeToString(b[:12]), hex.EncodeToString(b[12:]))
}
