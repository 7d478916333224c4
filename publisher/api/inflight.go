package api

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Bodies in flight: every POST /v1/jobs holds its body, the items decoded
// from it and the messages cut from them until it is answered, 5 to 6
// times the body's size at its peak (BenchmarkConcurrentMaxBodies). So the
// bytes of bodies held at once are bounded, over all requests by
// MaxBodyBytesInFlight and for one client by MaxBodyBytesPerClient, and one
// client's bodies in flight by MaxBodiesPerClient. A body is charged only
// for the bytes that have arrived, as they arrive (see ReadBody), and keeps
// the charge until it is answered: a connection that declares a length and
// sends nothing holds none of the budget, only one of its client's bodies.
// A body that stops coming, or comes slower than MinBodyRate, is cut off
// (BodyPace), so what it did send is not held for long either.
//
// A request that finds the budget spent is answered 503 overloaded, one whose
// client is over its share 429 too_many_bodies, both with Retry-After and at
// once, and nothing of it is enqueued. It never waits, since a waiting
// request would hold its connection and its charge, and a queue in order
// (semaphore.Weighted's) would stall the small bodies behind a large one.

var (
	// errOverloaded: the bodies in flight, all clients together, cannot
	// take more.
	errOverloaded = errors.New("bodies in flight over the budget")
	// errClientBodies and errClientBytes: the client has as many bodies, or
	// bytes of bodies, in flight as it may.
	errClientBodies = errors.New("the client's bodies in flight at its limit")
	errClientBytes  = errors.New("the client's bytes of bodies in flight over its share")
	// ErrTooSlow: the body stalled or came slower than MinBodyRate.
	ErrTooSlow = errors.New("the body came too slowly")
	// errUploads and errClientUploads: uploads, all clients' or the
	// client's, hold as much of the budget as they may (see bodyBudget).
	errUploads       = errors.New("uploads in flight over their part of the budget")
	errClientUploads = errors.New("the client's uploads in flight over its share")
)

// bodyBudget is the bytes of bodies in flight, all clients together and per
// client, and each client's bodies in flight. One lock guards the whole and
// the shares, so that a charge is taken from both or neither. Safe for
// concurrent use.
//
// Uploads (POST /v1/files) are bodies that may take FileUploadTimeout, 30
// minutes, where a job's is cut off by the server's read timeout within a
// minute: so clients trickling uploads at the minimum rate could hold the
// whole budget for that long. An upload is charged for what it holds (see
// uploadBody), and uploads hold at most half the budget, all clients
// together (uploads), so that the POSTs of jobs and batches always find room
// for a body at the limit; and one client's uploads at most half of that
// (perClientUploads), besides its share of the whole, so that one client's
// uploads cannot take the rest from others'. Each is at least what one
// upload holds (Config.UploadHeld), or a large file could never come.
type bodyBudget struct {
	total, perClient          int64
	uploads, perClientUploads int64
	perClientBodies           int
	held                      prometheus.Gauge

	mu          sync.Mutex
	used        int64
	uploadsUsed int64
	clients     map[string]*clientBodies // only clients with a body in flight
}

type clientBodies struct {
	bytes   int64
	uploads int64 // of bytes, those of uploads
	bodies  int
}

func newBodyBudget(c *Config, m *metrics) *bodyBudget {
	held := c.UploadHeld
	uploads := min(c.MaxBodyBytesInFlight, max(held, c.MaxBodyBytesInFlight/2))
	return &bodyBudget{total: c.MaxBodyBytesInFlight, perClient: c.MaxBodyBytesPerClient, perClientBodies: c.MaxBodiesPerClient,
		uploads: uploads, perClientUploads: max(held, uploads/2), held: m.bodyBytes, clients: map[string]*clientBodies{}}
}

// openUpload admits one more body of client that is an upload.
func (b *bodyBudget) openUpload(client string) (*BodyCharge, error) {
	c, err := b.open(client)
	if c != nil {
		c.upload = true
	}
	return c, err
}

// open admits one more body of client, charged nothing yet.
func (b *bodyBudget) open(client string) (*BodyCharge, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cb := b.clients[client]
	if cb == nil {
		cb = &clientBodies{}
		b.clients[client] = cb
	}
	if cb.bodies >= b.perClientBodies {
		return nil, errClientBodies
	}
	cb.bodies++
	return &BodyCharge{b: b, client: client, cb: cb}, nil
}

// BodyCharge is what one body holds of the budget.
type BodyCharge struct {
	b      *bodyBudget
	client string
	cb     *clientBodies
	bytes  int64
	upload bool
	done   bool
}

// Add charges n more bytes, from the client's share and the whole (and, for
// an upload, from the uploads' part and the client's share of it), or
// nothing and says which is spent: the whole first, which would refuse the
// body whatever its client holds.
func (c *BodyCharge) Add(n int64) error {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.used+n > b.total:
		return errOverloaded
	case c.upload && b.uploadsUsed+n > b.uploads:
		return errUploads
	case c.cb.bytes+n > b.perClient:
		return errClientBytes
	case c.upload && c.cb.uploads+n > b.perClientUploads:
		return errClientUploads
	}
	c.move(n)
	return nil
}

// Sub gives back n of what the body was charged: an upload's, once the
// part that held them has gone to S3.
func (c *BodyCharge) Sub(n int64) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !c.done {
		c.move(-min(n, c.bytes))
	}
}

// move charges n (given back, when negative); b.mu is held.
func (c *BodyCharge) move(n int64) {
	b := c.b
	c.cb.bytes += n
	c.bytes += n
	b.used += n
	if c.upload {
		c.cb.uploads += n
		b.uploadsUsed += n
	}
	b.held.Set(float64(b.used))
}

// Release gives back the charge and the body's place; once, however often
// it is called.
func (c *BodyCharge) Release() {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.done {
		return
	}
	c.move(-c.bytes)
	c.done = true
	c.cb.bodies--
	if c.cb.bodies == 0 {
		delete(b.clients, c.client)
	}
}

// BodyStep is the first buffer of a body, allocated before any of it has
// arrived and so not charged: as much as net/http's own buffer of the
// connection, so that a connection whose body never comes costs what an
// idle one does. A body larger than it doubles from here.
const BodyStep = 4 << 10

// ReadBody reads the body of r, which is at most MaxBodyBytes, charging its
// client (ClientKey) for each byte as it arrives, and returns it with the
// function that gives the charge back (to call whatever the error). The
// buffer doubles up to the declared length, or the limit without one, and is
// at most twice what is charged while the body comes; a body read whole is
// held in a buffer of its own size, and charged exactly that, so a body at
// the limit fits an idle budget. The error is an *http.MaxBytesError over the
// limit, errClientBodies or errClientBytes when the client is at its share,
// errOverloaded when the budget is spent, ErrTooSlow when the body stalled or
// trickled (BodyPace), or the connection's error.
func (g *Gate) ReadBody(w http.ResponseWriter, r *http.Request) (body []byte, release func(), err error) {
	limit := g.cfg.MaxBodyBytes
	release = func() {}
	want, known := limit, r.ContentLength >= 0
	if known {
		if r.ContentLength > limit {
			return nil, release, &http.MaxBytesError{Limit: limit}
		}
		want = r.ContentLength
	}
	charge, err := g.bodies.open(g.ClientKey(r))
	if err != nil {
		return nil, release, err
	}
	release = charge.Release
	pace := StartPace(float64(g.cfg.MinBodyRate), g.cfg.BodyGrace, CutRead(w))
	fail := func(err error) ([]byte, func(), error) {
		if pace.Stop() || errors.Is(err, os.ErrDeadlineExceeded) {
			// Cut off here, or by the server's ReadTimeout.
			err = ErrTooSlow
		}
		return nil, release, err
	}
	rd := http.MaxBytesReader(w, r.Body, limit)
	for !known || int64(len(body)) < want {
		if int64(len(body)) == want {
			// No length, and the buffer is full at the limit: one byte
			// more is over it (MaxBytesReader says so), or the body ends.
			var one [1]byte
			n, err := rd.Read(one[:])
			if n > 0 {
				return fail(&http.MaxBytesError{Limit: limit})
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return fail(err)
			}
			continue
		}
		if len(body) == cap(body) {
			nb := make([]byte, len(body), min(max(2*int64(cap(body)), BodyStep), want))
			copy(nb, body)
			body = nb
		}
		n, err := rd.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if n > 0 {
			if e := charge.Add(int64(n)); e != nil {
				return fail(e)
			}
			if !pace.Arrived(int64(len(body))) {
				return fail(ErrTooSlow)
			}
		}
		switch {
		case err == io.EOF && known && int64(len(body)) < want:
			return fail(io.ErrUnexpectedEOF) // short of the declared length
		case err == io.EOF:
			known, want = true, int64(len(body))
		case err != nil:
			return fail(err)
		}
	}
	if pace.Stop() {
		// Cut off as the last bytes came: the connection can no longer be
		// read, so the request is refused as it would have been a moment
		// earlier.
		return nil, release, ErrTooSlow
	}
	if cap(body) > len(body) {
		// Read without a length: the buffer grew past the body, and what
		// is held is what is charged.
		body = bytes.Clone(body)
	}
	return body, release, nil
}

// BodyError is the answer to a body ReadBody refused.
func (g *Gate) BodyError(w http.ResponseWriter, err error) *Error {
	var tooBig *http.MaxBytesError
	// retryLater counts a refusal that passes with time and asks the client
	// to come back in a second.
	retryLater := func(c prometheus.Counter, status int, code, format string, a ...any) *Error {
		c.Inc()
		w.Header().Set("Retry-After", "1")
		return Err(status, code, format+", retry after the time in Retry-After", a...)
	}
	switch {
	case errors.As(err, &tooBig):
		return Err(http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "the request body is over the limit of %d bytes", g.cfg.MaxBodyBytes)
	case errors.Is(err, errOverloaded):
		return retryLater(g.m.overloaded, http.StatusServiceUnavailable, CodeOverloaded,
			"the publisher is holding as many request bodies as it may; nothing was sent")
	case errors.Is(err, errUploads):
		return retryLater(g.m.overloaded, http.StatusServiceUnavailable, CodeOverloaded,
			"the publisher is holding as many uploads as it may; nothing was kept")
	case errors.Is(err, errClientUploads):
		return retryLater(g.m.bodyRefusals.WithLabelValues(refusedClientBytes), http.StatusTooManyRequests, CodeTooManyBodies,
			"this client's uploads in flight would hold more than its share of %d bytes; nothing was kept", g.bodies.perClientUploads)
	case errors.Is(err, errClientBodies):
		return retryLater(g.m.bodyRefusals.WithLabelValues(refusedClientBodies), http.StatusTooManyRequests, CodeTooManyBodies,
			"this client has %d request bodies in flight, as many as it may; nothing was sent", g.cfg.MaxBodiesPerClient)
	case errors.Is(err, errClientBytes):
		return retryLater(g.m.bodyRefusals.WithLabelValues(refusedClientBytes), http.StatusTooManyRequests, CodeTooManyBodies,
			"this client's request bodies in flight would be over its share of %d bytes; nothing was sent", g.cfg.MaxBodyBytesPerClient)
	case errors.Is(err, ErrTooSlow):
		g.m.bodyRefusals.WithLabelValues(refusedTooSlow).Inc()
		return Err(http.StatusRequestTimeout, CodeBodyTooSlow,
			"the request body stopped for %s or came slower than %d bytes a second; nothing was sent",
			g.cfg.BodyGrace, g.cfg.MinBodyRate)
	default:
		// The error names the connection's addresses: logged, not sent.
		g.log.Debug("reading a request body", "err", err)
		return Err(http.StatusBadRequest, CodeMalformedJSON, "the request body could not be read whole")
	}
}

// Reasons of vramq_publisher_body_refusals_total.
const (
	refusedClientBodies = "client_bodies"
	refusedClientBytes  = "client_bytes"
	refusedTooSlow      = "too_slow"
)

// BodyPace holds a body to a minimum data rate: its bytes must start within
// the grace period, never pause for longer than it, and once it is over
// have come at rate bytes a second on average since the body began. A body
// that falls behind is cut off: cut makes the read waiting on it fail at
// once. So a stalled body gives back its charge and its client's place within
// the grace period, and one that trickles cannot hold them much longer,
// where the server's ReadTimeout alone would leave both held for a minute.
type BodyPace struct {
	rate  float64 // bytes a second
	grace time.Duration
	start time.Time
	cut   func()

	mu      sync.Mutex
	timer   *time.Timer
	due     time.Time // the body falls behind if no more has come by then
	over    bool      // read whole, or fallen behind
	tooSlow bool
	paused  time.Time // when pause stopped the watch; zero while it runs
}

func StartPace(rate float64, grace time.Duration, cut func()) *BodyPace {
	p := &BodyPace{rate: rate, grace: grace, cut: cut, start: time.Now()}
	p.due = p.start.Add(grace)
	p.timer = time.AfterFunc(grace, p.expire)
	return p
}

// expire runs on the timer: the body has fallen behind unless more of it
// came meanwhile (arrived moved the due time on).
func (p *BodyPace) expire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.over || time.Now().Before(p.due) {
		return
	}
	p.over, p.tooSlow = true, true
	p.cut()
}

// Arrived notes that total bytes of the body have come, and reports whether
// the body is still on pace.
func (p *BodyPace) Arrived(total int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.over {
		return !p.tooSlow
	}
	now := time.Now()
	// The whole so far, at the rate, was due grace after the start; the
	// next byte is due within the grace from now, whatever the average.
	owed := time.Duration(min(float64(total)/p.rate, float64(24*time.Hour/time.Second)) * float64(time.Second))
	p.due = p.start.Add(p.grace + owed)
	if next := now.Add(p.grace); next.Before(p.due) {
		p.due = next
	}
	if !p.due.After(now) {
		p.over, p.tooSlow = true, true
		p.timer.Stop()
		return false
	}
	p.timer.Reset(p.due.Sub(now))
	return true
}

// Pause stops the watch while the body is not being read for the server's
// own reasons (an upload sending a part to S3): the client is held neither
// to its pauses nor to its average rate for that time. resume goes on, total
// bytes of the body having come.
func (p *BodyPace) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.over || !p.paused.IsZero() {
		return
	}
	p.paused = time.Now()
	p.timer.Stop()
}

func (p *BodyPace) Resume(total int64) {
	p.mu.Lock()
	if p.over || p.paused.IsZero() {
		p.mu.Unlock()
		return
	}
	// The time paused is taken off the body's, as if it had started later.
	p.start = p.start.Add(time.Since(p.paused))
	p.paused = time.Time{}
	p.mu.Unlock()
	if !p.Arrived(total) {
		p.cut() // it was due as the pause began
	}
}

// Stop ends the watch, and reports whether the body had fallen behind first.
func (p *BodyPace) Stop() (tooSlow bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.over = true
	p.timer.Stop()
	return p.tooSlow
}

// longAgo is a read deadline that has passed.
var longAgo = time.Unix(1, 0)

// CutRead is the cut of a body read from w's connection: its read deadline,
// put in the past, makes the read waiting on the client fail at once. Where
// the connection has no deadline (under Lambda the body is in memory
// already) it does nothing, and a body that is late is refused when its read
// returns.
func CutRead(w http.ResponseWriter) func() {
	rc := http.NewResponseController(w)
	return func() { _ = rc.SetReadDeadline(longAgo) }
}
