package publisher

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// pipeServer serves a Publisher over in-memory connections (net.Pipe), each
// with the client address the test gives it. Inside a synctest bubble the
// server's reads, deadlines and timers then run on the bubble's clock, so a
// test can let a stalled body sit for minutes at no cost, and knows, after
// synctest.Wait, that the server has taken in every byte written.
type pipeServer struct {
	t     *testing.T
	pub   *Publisher
	q     *countingQueue
	conns chan net.Conn
	done  chan struct{}
	close sync.Once
}

func newPipeServer(t *testing.T, cfg Config) *pipeServer {
	t.Helper()
	s := &pipeServer{t: t, q: &countingQueue{}, conns: make(chan net.Conn), done: make(chan struct{})}
	cfg.Queue, cfg.Registerer, cfg.Logger = s.q, prometheus.NewRegistry(), slog.New(slog.DiscardHandler)
	pub, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.pub = pub
	srv := &http.Server{Handler: pub.Handler()}
	go func() { _ = srv.Serve(s) }()
	t.Cleanup(func() {
		_ = srv.Close()
		// A connection the server closes lingers for net/http's
		// rstAvoidanceDelay (500 ms) first; the bubble must not end with it.
		time.Sleep(time.Second)
	})
	return s
}

func (s *pipeServer) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

func (s *pipeServer) Close() error {
	s.close.Do(func() { close(s.done) })
	return nil
}

func (s *pipeServer) Addr() net.Addr { return &net.TCPAddr{} }

type remoteConn struct {
	net.Conn
	remote net.Addr
}

func (c remoteConn) RemoteAddr() net.Addr { return c.remote }

// dial opens a connection from the client address from ("ip:port"). Its
// reads and writes fail after an hour of the bubble's time rather than
// hang the test when the server neither reads nor answers.
func (s *pipeServer) dial(from string) net.Conn {
	client, server := net.Pipe()
	s.conns <- remoteConn{server, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(from))}
	_ = client.SetDeadline(time.Now().Add(time.Hour))
	return client
}

// start sends from the headers of a POST declaring a body of declared
// bytes, and the first bytes of that body; it returns once the server has
// read them, or stopped reading (it refused the body: answer says why).
// Call it in a synctest bubble.
func (s *pipeServer) start(from string, declared int, first []byte) net.Conn {
	s.t.Helper()
	c := s.dial(from)
	if _, err := fmt.Fprintf(c, "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", declared); err != nil {
		s.t.Fatalf("headers from %s: %v", from, err)
	}
	// Written aside, so that a server that stops reading does not block
	// the test; the write ends when the server closes the connection.
	go func() { _, _ = c.Write(first) }()
	synctest.Wait()
	return c
}

// answer reads the response on c: its status and, for an error, its code.
func (s *pipeServer) answer(c net.Conn) (status int, code string) {
	s.t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		code = errorOf(s.t, resp.StatusCode, resp.Header, b).Code
	}
	return resp.StatusCode, code
}

// post sends a whole POST of body from and reads the answer.
func (s *pipeServer) post(from, body string) (status int, code string) {
	s.t.Helper()
	c := s.start(from, len(body), []byte(body))
	defer c.Close()
	return s.answer(c)
}
