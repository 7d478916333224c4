package publisher

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sync/semaphore"
)

// heldQueue holds every SendBatch until release is closed, so that the
// requests sending stay in flight.
type heldQueue struct {
	countingQueue
	arrived chan struct{}
	release chan struct{}
}

func (q *heldQueue) SendBatch(ctx context.Context, entries []Entry) ([]error, error) {
	q.arrived <- struct{}{}
	<-q.release
	return q.countingQueue.SendBatch(ctx, entries)
}

// The bytes of bodies in flight are bounded across requests: with two
// requests holding the budget, a third is answered 503 overloaded with
// Retry-After at once (it does not wait), JSON, and enqueues nothing, whether
// its length is declared or not; once the two are answered their charge is
// back and a request goes through.
func TestBodiesInFlightAreBounded(t *testing.T) {
	const limit = 1 << 10
	q := &heldQueue{arrived: make(chan struct{}, 8), release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	pub, err := New(Config{Queue: q, MaxBodyBytes: limit, MaxBodyBytesInFlight: 2 * limit, Registerer: reg,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(pub.Handler())
	t.Cleanup(srv.Close)
	// Run before srv.Close (cleanups run last first), which waits for the
	// held requests, so that a failing test ends rather than hangs.
	releaseAll := sync.OnceFunc(func() { close(q.release) })
	t.Cleanup(releaseAll)
	client := &http.Client{Timeout: 10 * time.Second}

	// Each body is over a third of the budget: two fit, a third does not.
	body := `{"items":[{"id":"a","text":"` + strings.Repeat("x", limit-150) + `"}]}`
	if len(body) <= 2*limit/3 || len(body) > limit {
		t.Fatalf("body of %d bytes", len(body))
	}
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for range 2 {
		wg.Go(func() { codes <- send(t, "POST", srv.URL+"/v1/jobs", "", body).StatusCode })
		<-q.arrived // its body is read and charged; it is sending
	}
	for name, chunked := range map[string]bool{"declared length": false, "chunked": true} {
		var rd io.Reader = strings.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // no length known: sent chunked
		}
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/v1/jobs", rd)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s, over the budget: %v; want an answer at once", name, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		e := errorOf(t, resp.StatusCode, resp.Header, b)
		if resp.StatusCode != http.StatusServiceUnavailable || e.Code != CodeOverloaded || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("%s, over the budget: %d %s Retry-After %q; want 503 %s, Retry-After 1", name, resp.StatusCode, e.Code,
				resp.Header.Get("Retry-After"), CodeOverloaded)
		}
	}
	releaseAll()
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusAccepted {
			t.Errorf("a request within the budget: %d", c)
		}
	}
	if n := q.count(); n != 2 {
		t.Errorf("%d messages enqueued, want the 2 accepted jobs'", n)
	}
	if n := testutil.ToFloat64(pub.m.overloaded); n != 2 {
		t.Errorf("overloaded_total %v, want 2", n)
	}
	// The charge came back.
	if c := send(t, "POST", srv.URL+"/v1/jobs", "", body).StatusCode; c != http.StatusAccepted {
		t.Errorf("after the others were answered: %d", c)
	}
}

// readBody charges what it holds, as the body arrives when its length is
// not declared, and gives all of it back.
func TestReadBodyCharges(t *testing.T) {
	const limit = 1 << 20
	for name, chunked := range map[string]bool{"declared length": false, "chunked": true} {
		t.Run(name, func(t *testing.T) {
			sem := semaphore.NewWeighted(2 * limit)
			payload := strings.Repeat("x", 300<<10)
			var rd io.Reader = strings.NewReader(payload)
			if chunked {
				rd = io.MultiReader(rd)
			}
			r, _ := http.NewRequest("POST", "/", rd)
			if chunked {
				r.ContentLength = -1
			}
			body, release, err := readBody(nil, r, sem, limit)
			if err != nil || string(body) != payload {
				t.Fatalf("read %d bytes: %v", len(body), err)
			}
			// What is charged now is not free: a charge of the whole
			// budget fails until release.
			if sem.TryAcquire(2 * limit) {
				t.Fatal("nothing was charged for the body")
			}
			if !sem.TryAcquire(2*limit - int64(cap(body))) {
				t.Errorf("more than the buffer's %d bytes charged", cap(body))
			} else {
				sem.Release(2*limit - int64(cap(body)))
			}
			release()
			release() // twice is harmless
			if !sem.TryAcquire(2 * limit) {
				t.Error("the charge was not given back")
			}
		})
	}
	// A chunked body over the limit is cut off there.
	sem := semaphore.NewWeighted(4 * limit)
	r, _ := http.NewRequest("POST", "/", io.MultiReader(strings.NewReader(strings.Repeat("x", limit+1))))
	r.ContentLength = -1
	_, release, err := readBody(nil, r, sem, limit)
	release()
	var tooBig *http.MaxBytesError
	if !errors.As(err, &tooBig) {
		t.Errorf("over the limit: %v", err)
	}
}

// A declared length is charged as the body arrives, not up front: clients
// that declare the largest body and send nothing do not hold the budget (or
// the memory) from a client that sends its body.
func TestDeclaredLengthIsChargedAsItArrives(t *testing.T) {
	const limit = 4 << 20
	srv, q, _ := rateTestServer(t, Config{MaxBodyBytes: limit, MaxBodyBytesInFlight: limit})
	addr := strings.TrimPrefix(srv.URL, "http://")
	for range 3 {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		fmt.Fprintf(conn,
			"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", limit)
		// The server says 100 Continue when the handler first reads the
		// body: by then it has charged what it charges before reading.
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("want 100 Continue, got %q %v", line, err)
		}
		fmt.Fprint(conn, "{")
	}
	if c := send(t, "POST", srv.URL+"/v1/jobs", "", `{"items":[{"id":"a","text":"x"}]}`).StatusCode; c != http.StatusAccepted {
		t.Errorf("a whole body while three clients stall on declared ones: %d, want 202", c)
	}
	if n := q.count(); n != 1 {
		t.Errorf("%d messages enqueued, want 1", n)
	}
}

// A body at the limit fits a budget of the limit, declared or sent chunked,
// and one byte more is 413, not 503: the charge is the buffer, not the
// buffer and the one it grew from.
func TestABodyAtTheLimitFitsABudgetOfTheLimit(t *testing.T) {
	const limit = 1 << 20
	srv, q, _ := rateTestServer(t, Config{MaxBodyBytes: limit, MaxBodyBytesInFlight: limit})
	// Items of 1 KiB (a larger one would not fit in a message), the last
	// one padded so that the body is exactly the limit.
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < limit-2048; i++ {
		fmt.Fprintf(&b, `{"id":"i%d","text":"%s"},`, i, strings.Repeat("x", 1000))
	}
	last := `{"id":"last","text":"`
	pad := limit - b.Len() - len(last) - len(`"}]}`)
	full := b.String() + last + strings.Repeat("y", pad) + `"}]}`
	if len(full) != limit {
		t.Fatalf("body of %d bytes", len(full))
	}
	for _, tc := range []struct {
		name    string
		body    string
		chunked bool
		status  int
	}{
		{"declared, at the limit", full, false, http.StatusAccepted},
		{"chunked, at the limit", full, true, http.StatusAccepted},
		{"chunked, one byte over", full + " ", true, http.StatusRequestEntityTooLarge},
	} {
		var rd io.Reader = strings.NewReader(tc.body)
		if tc.chunked {
			rd = io.MultiReader(rd)
		}
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/v1/jobs", rd)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %.200s, want %d", tc.name, resp.StatusCode, b, tc.status)
		}
	}
	if n := q.count(); n == 0 {
		t.Error("nothing enqueued")
	}
}
