package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
)

// JSONErrors wraps the listener of an http.Server serving Handler so that
// the errors the server writes itself, before any handler runs, are the
// API's JSON errors too. net/http answers a request whose headers are over
// MaxHeaderBytes (431), one it cannot parse (400), an unknown transfer
// coding (501) and an unknown HTTP version (505) by writing a text/plain
// response straight to the connection, and an Expect header other than
// 100-continue by an empty 417; no http.Server option changes either. The
// wrapper recognises the first by its exact form (a status line, then only
// "Content-Type: text/plain; charset=utf-8" and "Connection: close", written
// in one piece to a connection the server then closes) and the second by its
// status, which Handler never answers, and sends a JSON error of the same
// status instead, with a fixed message: the server's text can quote the
// request. A Go release that changes the form fails TestServerErrorsAreJSON.
func JSONErrors(ln net.Listener) net.Listener { return jsonErrorListener{ln} }

type jsonErrorListener struct{ net.Listener }

func (l jsonErrorListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return jsonErrorConn{c}, nil
}

type jsonErrorConn struct{ net.Conn }

// serverErrorHeaders is what net/http writes between the status line and the
// body of its own error responses (conn.serve in net/http/server.go).
const serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c jsonErrorConn) Write(p []byte) (int, error) {
	status, ok := serverError(p)
	if !ok {
		return c.Conn.Write(p)
	}
	e := &Error{Status: status, Code: CodeBadRequest, Message: "the server could not read this as an HTTP/1.1 request"}
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		e.Code, e.Message = CodeHeadersTooLarge, "the request's headers are over the server's limit"
	case http.StatusNotImplemented:
		e.Message = "the request's Transfer-Encoding is not supported"
	case http.StatusHTTPVersionNotSupported:
		e.Message = "the request's HTTP version is not supported"
	case http.StatusExpectationFailed:
		e.Message = "the request's Expect header is not supported; only 100-continue is"
	}
	body, _ := json.Marshal(ErrorBody{Error: e})
	body = append(body, '\n')
	var out bytes.Buffer
	fmt.Fprintf(&out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n"+
		"X-Content-Type-Options: nosniff\r\nConnection: close\r\nContent-Length: %d\r\n\r\n",
		status, http.StatusText(status), len(body))
	out.Write(body)
	if _, err := c.Conn.Write(out.Bytes()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// serverError reports whether p is one of net/http's own error responses,
// and its status.
func serverError(p []byte) (int, bool) {
	const proto = "HTTP/1.1 "
	if !bytes.HasPrefix(p, []byte(proto)) || len(p) < len(proto)+3 {
		return 0, false
	}
	status, err := strconv.Atoi(string(p[len(proto) : len(proto)+3]))
	if err != nil || status < 400 || status > 599 {
		return 0, false
	}
	if status == http.StatusExpectationFailed {
		// Written through a ResponseWriter (sendExpectationFailed): no
		// body, in one flush.
		return status, bytes.HasSuffix(p, []byte("\r\n\r\n"))
	}
	eol := bytes.IndexByte(p, '\r')
	if eol < 0 || !bytes.HasPrefix(p[eol:], []byte(serverErrorHeaders)) {
		return 0, false
	}
	return status, true
}
