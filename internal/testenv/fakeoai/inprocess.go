package fakeoai

import (
	"errors"
	"io"
	"net/http"
	"sync"
)

// errDropped is what an in-process client gets for a dropped connection, as
// a real one gets an EOF or a reset.
var errDropped = errors.New("fakeoai: connection closed by server")

// inProcess is a RoundTripper that runs the server's handler in a goroutine
// of its own and streams its answer through a pipe, so that slow bodies stay
// slow and everything runs on the caller's clock (synctest's in a bubble).
type inProcess struct{ s *Server }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = "192.0.2.1:1234"
	if in.Body == nil {
		in.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			if v := recover(); v != nil && v != http.ErrAbortHandler {
				pw.CloseWithError(errDropped)
				w.signal()
				panic(v)
			}
			w.WriteHeader(http.StatusOK) // a handler that wrote nothing answered 200
			pw.Close()
		}()
		t.s.ServeHTTP(w, in)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err()) // the handler's writes fail, as on a closed connection
		return nil, req.Context().Err()
	}
	if w.dropped {
		return nil, errDropped
	}
	return &http.Response{
		Status:        http.StatusText(w.status),
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.sent,
		Body:          pr,
		ContentLength: -1,
		Request:       req,
	}, nil
}

// pipeWriter is the handler's side of an in-process exchange.
type pipeWriter struct {
	header  http.Header
	sent    http.Header
	status  int
	dropped bool
	pw      *io.PipeWriter
	ready   chan struct{}
	once    sync.Once
}

func (w *pipeWriter) signal() { w.once.Do(func() { close(w.ready) }) }

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(status int) {
	if w.status != 0 || w.dropped {
		return
	}
	w.status = status
	w.sent = w.header.Clone()
	w.signal()
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	if w.dropped {
		return 0, errDropped
	}
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}

func (w *pipeWriter) Flush() {}

// drop ends the exchange without an answer (before headers) or mid-body.
func (w *pipeWriter) drop() {
	if w.status == 0 {
		w.dropped = true
		w.signal()
	}
	w.pw.CloseWithError(errDropped)
}
