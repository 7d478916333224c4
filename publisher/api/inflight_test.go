package api

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vramq/vramq/internal/payload"
)

// ReadBody charges exactly the body it returns, declared or sent chunked,
// as one body of its client, and gives all of it back.
func TestReadBodyCharges(t *testing.T) {
	const limit = 1 << 20
	newPub := func(t *testing.T) *Gate {
		p, err := NewGate(testConfig(Config{MaxBodyBytes: limit}))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for name, chunked := range map[string]bool{"declared length": false, "chunked": true} {
		t.Run(name, func(t *testing.T) {
			p := newPub(t)
			payload := strings.Repeat("x", 300<<10)
			var rd io.Reader = strings.NewReader(payload)
			if chunked {
				rd = io.MultiReader(rd)
			}
			r := httptest.NewRequest("POST", "/", rd)
			if chunked {
				r.ContentLength = -1
			}
			body, release, err := p.ReadBody(httptest.NewRecorder(), r)
			if err != nil || string(body) != payload {
				t.Fatalf("read %d bytes: %v", len(body), err)
			}
			// A buffer of the body's size, give or take the allocator's
			// rounding; not one grown past it.
			if used, clients := p.bodies.inFlight(); used != int64(len(body)) || clients != 1 || cap(body) > len(body)+len(body)/16 {
				t.Errorf("%d bytes held by %d clients, in a buffer of %d; want the body's %d, one client, a buffer of its size",
					used, clients, cap(body), len(body))
			}
			if v := testutil.ToFloat64(p.m.bodyBytes); v != float64(len(body)) {
				t.Errorf("body_bytes_in_flight %v, want %d", v, len(body))
			}
			release()
			release() // twice is harmless
			if used, clients := p.bodies.inFlight(); used != 0 || clients != 0 {
				t.Errorf("after release: %d bytes held by %d clients", used, clients)
			}
		})
	}
	// A chunked body over the limit is cut off there.
	p := newPub(t)
	r := httptest.NewRequest("POST", "/", io.MultiReader(strings.NewReader(strings.Repeat("x", limit+1))))
	r.ContentLength = -1
	_, release, err := p.ReadBody(httptest.NewRecorder(), r)
	release()
	var tooBig *http.MaxBytesError
	if !errors.As(err, &tooBig) {
		t.Errorf("over the limit: %v", err)
	}
}

// inFlight is the bytes held and the clients holding bodies.
func (b *bodyBudget) inFlight() (bytes int64, clients int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, len(b.clients)
}

// Every refusal of a body that passes with time says so three ways: the
// status and code, Retry-After, and the sentence a person reads; and it is
// counted under its reason.
func TestBodyErrorRetryLater(t *testing.T) {
	p, err := NewGate(testConfig(Config{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err     error
		status  int
		code    string
		message string
		counter prometheus.Counter
	}{
		{errOverloaded, http.StatusServiceUnavailable, CodeOverloaded,
			"the publisher is holding as many request bodies as it may; nothing was sent, retry after the time in Retry-After",
			p.m.overloaded},
		{errUploads, http.StatusServiceUnavailable, CodeOverloaded,
			"the publisher is holding as many uploads as it may; nothing was kept, retry after the time in Retry-After",
			p.m.overloaded},
		{errClientBodies, http.StatusTooManyRequests, CodeTooManyBodies,
			fmt.Sprintf("this client has %d request bodies in flight, as many as it may; nothing was sent, retry after the time in Retry-After",
				p.cfg.MaxBodiesPerClient),
			p.m.bodyRefusals.WithLabelValues(refusedClientBodies)},
		{errClientBytes, http.StatusTooManyRequests, CodeTooManyBodies,
			fmt.Sprintf("this client's request bodies in flight would be over its share of %d bytes; nothing was sent, retry after the time in Retry-After",
				p.cfg.MaxBodyBytesPerClient),
			p.m.bodyRefusals.WithLabelValues(refusedClientBytes)},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			before := testutil.ToFloat64(tc.counter)
			w := httptest.NewRecorder()
			e := p.BodyError(w, tc.err)
			if e.Status != tc.status || e.Code != tc.code || e.Message != tc.message || w.Header().Get("Retry-After") != "1" {
				t.Errorf("bodyError = %d %s %q, Retry-After %q; want %d %s %q, Retry-After 1",
					e.Status, e.Code, e.Message, w.Header().Get("Retry-After"), tc.status, tc.code, tc.message)
			}
			if got := testutil.ToFloat64(tc.counter) - before; got != 1 {
				t.Errorf("counted %v times; want once", got)
			}
		})
	}
}

// An upload stops reading its client while it sends a part to S3 (payload
// .Pauser): the client must not be cut off as too slow for S3's time. A
// pause longer than the grace leaves the body on pace; the grace runs again
// from the resume, and a client that then stalls is cut off as before.
func TestPacePausesWhileAPartGoesToS3(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const grace = time.Second
		var cuts atomic.Int32
		p := StartPace(1<<20, grace, func() { cuts.Add(1) })
		if !p.Arrived(1 << 10) {
			t.Fatal("the first bytes are late")
		}
		p.Pause()
		time.Sleep(10 * grace) // S3 taking its time with a part
		synctest.Wait()
		if cuts.Load() != 0 {
			t.Fatal("the body was cut off while paused")
		}
		p.Resume(1 << 10)
		if !p.Arrived(2 << 10) {
			t.Fatal("the body is late after the pause")
		}
		time.Sleep(grace / 2)
		synctest.Wait()
		if cuts.Load() != 0 || p.Stop() {
			t.Fatal("the body was cut off within the grace after the pause")
		}

		// Without the pause, the same wait cuts it off.
		q := StartPace(1<<20, grace, func() { cuts.Add(1) })
		q.Arrived(1 << 10)
		time.Sleep(10 * grace)
		synctest.Wait()
		if cuts.Load() != 1 || !q.Stop() {
			t.Errorf("%d cuts, want the unpaused body cut off", cuts.Load())
		}

		// Paused and resumed, then stalled: cut off a grace later.
		r := StartPace(1<<20, grace, func() { cuts.Add(1) })
		r.Arrived(1 << 10)
		r.Pause()
		time.Sleep(10 * grace)
		r.Resume(1 << 10)
		time.Sleep(2 * grace)
		synctest.Wait()
		if cuts.Load() != 2 || !r.Stop() {
			t.Errorf("%d cuts, want the body that stalled after its pause cut off", cuts.Load())
		}
	})
}

// testConfig is c with publisher.Config's defaults where c leaves a field
// zero, as publisher.New gives a Gate.
func testConfig(c Config) Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	if c.MaxBodyBytesInFlight == 0 {
		c.MaxBodyBytesInFlight = 2 * c.MaxBodyBytes
	}
	if c.MaxBodyBytesPerClient == 0 {
		c.MaxBodyBytesPerClient = max(c.MaxBodyBytes, c.MaxBodyBytesInFlight/2)
	}
	if c.MaxBodiesPerClient == 0 {
		c.MaxBodiesPerClient = 16
	}
	if c.MinBodyRate == 0 {
		c.MinBodyRate = 16 << 10
	}
	if c.BodyGrace == 0 {
		c.BodyGrace = 10 * time.Second
	}
	if c.IPv6ClientPrefix == 0 {
		c.IPv6ClientPrefix = 56
	}
	if c.RateLimitClients == 0 {
		c.RateLimitClients = 10_000
	}
	if c.UploadHeld == 0 {
		c.UploadHeld = min(payload.UploadPartBytes, 200<<20)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return c
}
