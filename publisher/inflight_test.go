package publisher

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/jobs"
)

// heldQueue holds every SendBatch until release is closed, so that the
// requests sending stay in flight.
type heldQueue struct {
	countingQueue
	arrived chan struct{}
	release chan struct{}
}

func (q *heldQueue) SendBatch(ctx context.Context, entries []jobs.Entry) ([]error, error) {
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
	// One client (all come from 127.0.0.1) may take the whole budget here:
	// this is the bound over all clients.
	pub, err := New(Config{
		Queue: q,
		API: API{
			MaxBodyBytes:          limit,
			MaxBodyBytesInFlight:  2 * limit,
			MaxBodyBytesPerClient: 2 * limit,
			Registerer:            reg,
			Logger:                slog.New(slog.DiscardHandler),
		},
	})
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
		if resp.StatusCode != http.StatusServiceUnavailable || e.Code != api.CodeOverloaded || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("%s, over the budget: %d %s Retry-After %q; want 503 %s, Retry-After 1", name, resp.StatusCode, e.Code,
				resp.Header.Get("Retry-After"), api.CodeOverloaded)
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
	if n := gateValue(t, pub, "overloaded_total"); n != 2 {
		t.Errorf("overloaded_total %v, want 2", n)
	}
	// The charge came back.
	if c := send(t, "POST", srv.URL+"/v1/jobs", "", body).StatusCode; c != http.StatusAccepted {
		t.Errorf("after the others were answered: %d", c)
	}
}

// A declared length is charged as the body arrives, not up front: clients
// that declare the largest body and send nothing do not hold the budget (or
// the memory) from a client that sends its body.
func TestDeclaredLengthIsChargedAsItArrives(t *testing.T) {
	const limit = 4 << 20
	srv, q, _ := rateTestServer(t, Config{API: API{MaxBodyBytes: limit, MaxBodyBytesInFlight: limit}})
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
	srv, q, _ := rateTestServer(t, Config{API: API{MaxBodyBytes: limit, MaxBodyBytesInFlight: limit}})
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

// The attacks of issue 25, on the budget its figures were taken with (a body
// of at most 1 MiB, 2 MiB of bodies in flight): connections that declare a
// length and send nothing, or send half a body each and stall, must not make
// the small POSTs of another client 503. Nothing is charged before it
// arrives, and a body that stops coming is cut off, 408 body_too_slow, giving
// back all it held.
func TestStalledBodiesDoNotStarveOthers(t *testing.T) {
	const limit = 1 << 20
	small := `{"items":[{"id":"a","text":"x"}]}`
	for _, tc := range []struct {
		name    string
		clients int // each on a connection of its own, from an address of its own
		sent    int // of a declared limit
	}{
		{"32 connections declare a length and send nothing", 32, 0},
		{"two clients send half a body each and stall", 2, limit / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newPipeServer(t, Config{API: API{MaxBodyBytes: limit, MaxBodyBytesInFlight: 2 * limit}})
				var stalled []net.Conn
				for i := range tc.clients {
					stalled = append(stalled, s.start(fmt.Sprintf("198.51.100.%d:4000", i+1), limit, []byte(strings.Repeat(" ", tc.sent))))
				}
				synctest.Wait()
				var got []string
				for range 20 {
					if status, code := s.post("203.0.113.9:5000", small); status != http.StatusAccepted {
						got = append(got, fmt.Sprint(status, " ", code))
					}
				}
				if len(got) > 0 {
					t.Errorf("%d of 20 small POSTs from another client refused: %v", len(got), got)
				}
				// The stalled bodies are cut off once the grace is over, and
				// what they held comes back.
				time.Sleep(DefaultConfig().BodyGrace + time.Second)
				for i, c := range stalled {
					if status, code := s.answer(c); status != http.StatusRequestTimeout || code != api.CodeBodyTooSlow {
						t.Errorf("stalled client %d: %d %s, want 408 %s", i, status, code, api.CodeBodyTooSlow)
					}
				}
				synctest.Wait()
				if used := bodiesInFlight(t, s.pub); used != 0 {
					t.Errorf("after the stalled bodies were cut: %d bytes held, want none", used)
				}
			})
		})
	}
}

// One client cannot take the whole budget, by bytes or by bodies: its
// bodies over its share (here the default, half the budget) or over
// MaxBodiesPerClient are answered 429 too_many_bodies with Retry-After, and
// another client's POSTs go through.
func TestOneClientCannotTakeTheBudget(t *testing.T) {
	const limit = 1 << 20
	small := `{"items":[{"id":"a","text":"x"}]}`
	synctest.Test(t, func(t *testing.T) {
		s := newPipeServer(t, Config{API: API{MaxBodyBytes: limit, MaxBodyBytesInFlight: 4 * limit, MaxBodiesPerClient: 4}})
		// Almost whole bodies, stalled: without a share the fourth would
		// fill the budget.
		var held []net.Conn
		for range 2 {
			held = append(held, s.start("198.51.100.1:4000", limit, []byte(strings.Repeat(" ", limit-1))))
		}
		over := s.start("198.51.100.1:4001", limit, []byte(strings.Repeat(" ", limit-1)))
		if status, code := s.answer(over); status != http.StatusTooManyRequests || code != api.CodeTooManyBodies {
			t.Errorf("a third body over the client's share: %d %s, want 429 %s", status, code, api.CodeTooManyBodies)
		}
		synctest.Wait()
		if used := bodiesInFlight(t, s.pub); used != 2*(limit-1) {
			t.Errorf("%d bytes held, want the two bodies' %d: the refused one gives back what it was charged", used, 2*(limit-1))
		}
		// Bodies that send nothing take none of the share, but a place:
		// two more fill the client's four.
		for range 2 {
			held = append(held, s.start("198.51.100.1:4002", limit, nil))
		}
		c := s.dial("198.51.100.1:4003")
		fmt.Fprintf(c, "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", limit)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if e := errorOf(t, resp.StatusCode, resp.Header, b); resp.StatusCode != http.StatusTooManyRequests || e.Code != api.CodeTooManyBodies ||
			resp.Header.Get("Retry-After") != "1" {
			t.Errorf("a fifth body from the client: %d %s Retry-After %q, want 429 %s at once, Retry-After 1", resp.StatusCode, e.Code,
				resp.Header.Get("Retry-After"), api.CodeTooManyBodies)
		}
		for i := range 10 {
			if status, code := s.post(fmt.Sprintf("203.0.113.%d:5000", i+1), small); status != http.StatusAccepted {
				t.Errorf("another client's small POST: %d %s", status, code)
			}
		}
		if got := gateValue(t, s.pub, "body_refusals_total", "reason", "client_bytes"); got != 1 {
			t.Errorf("body_refusals_total{reason=client_bytes} %v, want 1", got)
		}
		if got := gateValue(t, s.pub, "body_refusals_total", "reason", "client_bodies"); got != 1 {
			t.Errorf("body_refusals_total{reason=client_bodies} %v, want 1", got)
		}
		time.Sleep(DefaultConfig().BodyGrace + time.Second)
		for _, c := range held {
			s.answer(c)
		}
	})
}

// A body that trickles, a byte every few seconds (never pausing for the
// grace), is cut off once the grace is over for falling behind the minimum
// rate, 408 body_too_slow; one that comes steadily above the rate takes as
// long as it needs.
func TestABodyThatTricklesIsCutOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newPipeServer(t, Config{})
		grace, rate := DefaultConfig().BodyGrace, DefaultConfig().MinBodyRate
		c := s.start("198.51.100.1:4000", 1<<10, nil)
		go func() {
			for range 1 << 10 {
				time.Sleep(grace / 2)
				if _, err := c.Write([]byte(" ")); err != nil {
					return // cut off: the server closed the connection
				}
			}
		}()
		if status, code := s.answer(c); status != http.StatusRequestTimeout || code != api.CodeBodyTooSlow {
			t.Errorf("a byte every %v: %d %s, want 408 %s", grace/2, status, code, api.CodeBodyTooSlow)
		}
		if got := gateValue(t, s.pub, "body_refusals_total", "reason", "too_slow"); got != 1 {
			t.Errorf("body_refusals_total{reason=too_slow} %v, want 1", got)
		}
		// Four times the grace at twice the rate, a piece every half second.
		small := `{"items":[{"id":"a","text":"x"}]}`
		piece := int(2 * rate / 2)
		n := 4 * int(grace/time.Second) * 2 * piece
		body := strings.Repeat(" ", n-len(small)) + small
		steady := s.start("198.51.100.2:4000", len(body), nil)
		go func() {
			for i := 0; i < len(body); i += piece {
				time.Sleep(time.Second / 2)
				if _, err := steady.Write([]byte(body[i:min(i+piece, len(body))])); err != nil {
					return
				}
			}
		}()
		if status, code := s.answer(steady); status != http.StatusAccepted {
			t.Errorf("%d bytes at %d bytes a second: %d %s, want 202", n, 2*rate, status, code)
		}
		if used := bodiesInFlight(t, s.pub); used != 0 {
			t.Errorf("%d bytes held, want none", used)
		}
	})
}

// gateValue is the value of the counter or gauge vramq_publisher_<name>
// with the given label pairs, in p's registry: the Gate's metrics are how
// these tests, from outside package api, see what it refused and holds.
func gateValue(t *testing.T, p *Publisher, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := p.cfg.Registerer.(prometheus.Gatherer).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "vramq_publisher_"+name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
					return l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}) {
					continue metric
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	if len(labels) == 0 {
		t.Fatalf("no series vramq_publisher_%s", name)
	}
	return 0 // a labelled series not yet counted
}

// bodiesInFlight is the bytes of request bodies p holds now, all clients
// together (body_bytes_in_flight).
func bodiesInFlight(t *testing.T, p *Publisher) int64 {
	t.Helper()
	return int64(gateValue(t, p, "body_bytes_in_flight"))
}
