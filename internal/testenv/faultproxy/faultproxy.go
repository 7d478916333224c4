// Package faultproxy is a fault-injecting reverse proxy for SQS and S3
// endpoints: it sits between AWS SDK clients and an emulator (or any endpoint
// that does not check signatures) and, at configured rates, answers with the
// errors real services give under stress, delays requests, drops connections
// before or after the endpoint acts, fails some entries of batch calls, or
// fails everything while "down". Tests and the soak program use it to show
// that the pipeline survives these faults without losing work.
//
// Choices are drawn from a seeded math/rand/v2 generator, so a run with the
// same seed and the same order of requests injects the same faults.
//
// Requests go on with the Host the client signed. A partial batch rewrites
// the request body, which breaks its SigV4 signature: that fault is for
// endpoints that do not check signatures, as emulators do not.
package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Fault kinds, the keys of Injected.
const (
	KindThrottle     = "throttle"       // a throttling error, not forwarded
	KindServerError  = "server_error"   // a 500, not forwarded
	KindSlow         = "slow"           // a delay before forwarding (combines with the others)
	KindDropBefore   = "drop_before"    // connection dropped, not forwarded
	KindDropAfter    = "drop_after"     // forwarded, then the connection dropped instead of the response
	KindPartialBatch = "partial_batch"  // a batch call answered with some entries in Failed
	KindFailedEntry  = "failed_entries" // entries so failed, in all
	KindDown         = "down"           // requests and connections refused while Down(true)
)

// ActionS3 is the action name under which Injected counts S3 requests.
const ActionS3 = "S3"

// Faults says what to inject. Throttle, ServerError, DropBefore, DropAfter
// and PartialBatch are the probabilities (0 to 1) of each fault per request;
// at most one of them applies to a request, so they must not add up to more
// than 1. Slow is the probability of a delay of SlowDelay before the request
// goes on (to the endpoint or to one of the other faults).
//
// PartialBatch applies only to SendMessageBatch, DeleteMessageBatch and
// ChangeMessageVisibilityBatch: the chosen entries (each with probability
// 1/2, at least one) are taken out of the request before it is forwarded, so
// the endpoint really does not process them, and are added to the response's
// Failed list as InternalError with SenderFault false. When every entry is
// chosen the proxy answers itself.
type Faults struct {
	Throttle, ServerError, Slow, DropBefore, DropAfter, PartialBatch float64

	SlowDelay time.Duration

	// Actions limits faults to these SQS actions (the part of the
	// X-Amz-Target header after "AmazonSQS."), and ActionS3 for S3
	// requests; empty for every SQS action.
	Actions []string
	// S3 injects faults into S3 requests (any request without an SQS
	// X-Amz-Target) too; without it, and without ActionS3 in Actions, they
	// pass through untouched. PartialBatch does not apply to S3.
	S3 bool

	// Seed seeds the generator; New reads it, Set does not reseed.
	Seed uint64
}

// Validate reports what is wrong with f.
func (f Faults) Validate() error {
	var errs []error
	for _, r := range []struct {
		name string
		p    float64
	}{{"throttle", f.Throttle}, {"server error", f.ServerError}, {"slow", f.Slow},
		{"drop before", f.DropBefore}, {"drop after", f.DropAfter}, {"partial batch", f.PartialBatch}} {
		if !(r.p >= 0 && r.p <= 1) { // also refuses NaN
			errs = append(errs, fmt.Errorf("faultproxy: %s rate %v: want 0 to 1", r.name, r.p))
		}
	}
	if sum := f.Throttle + f.ServerError + f.DropBefore + f.DropAfter + f.PartialBatch; sum > 1 {
		errs = append(errs, fmt.Errorf("faultproxy: exclusive fault rates add up to %v: want at most 1", sum))
	}
	if f.SlowDelay < 0 || (f.Slow > 0 && f.SlowDelay == 0) {
		errs = append(errs, fmt.Errorf("faultproxy: slow delay %v: want positive when slow is set", f.SlowDelay))
	}
	return errors.Join(errs...)
}

// Proxy is a running fault-injecting proxy. Its methods are safe for
// concurrent use.
type Proxy struct {
	rp  *httputil.ReverseProxy
	srv *http.Server
	ln  *listener
	url string

	mu      sync.Mutex
	faults  Faults
	actions map[string]bool
	rng     *rand.Rand
	counts  map[count]int64
	ids     int64 // request ids of the answers the proxy makes itself

	requests atomic.Int64
}

type count struct{ kind, action string }

// New starts a proxy to target (for example "http://127.0.0.1:4566") on
// 127.0.0.1 at a free port, injecting f.
func New(target string, f Faults) (*Proxy, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	u, err := url.Parse(target)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("faultproxy: target %q is not an absolute URL", target)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{
		ln:     &listener{Listener: ln},
		url:    "http://" + ln.Addr().String(),
		rng:    rand.New(rand.NewPCG(f.Seed, f.Seed^0x9e3779b97f4a7c15)),
		counts: map[count]int64{},
	}
	p.setFaults(f)
	quiet := log.New(io.Discard, "", 0)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// A subscriber makes many calls at once; keep their connections.
	tr.MaxIdleConnsPerHost = 64
	// Never ask for gzip on the client's behalf: batch responses are
	// rewritten, and the client's own Accept-Encoding passes through.
	tr.DisableCompression = true
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			// The client signed the Host it sent to; keep it.
			r.Out.Host = r.In.Host
		},
		Transport:      tr,
		ModifyResponse: p.addFailed,
		ErrorLog:       quiet, // an unreachable endpoint is a 502 to the client, as a load balancer gives
	}
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          quiet,
	}
	go func() { _ = p.srv.Serve(p.ln) }()
	return p, nil
}

// URL is the proxy's base URL, for a client's BaseEndpoint.
func (p *Proxy) URL() string { return p.url }

// Set replaces the faults from now on. The generator goes on from where it
// is; Seed is ignored.
func (p *Proxy) Set(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setFaults(f)
	return nil
}

// Faults returns the faults in force.
func (p *Proxy) Faults() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults
	f.Actions = slices.Clone(f.Actions)
	return f
}

func (p *Proxy) setFaults(f Faults) {
	f.Actions = slices.Clone(f.Actions)
	p.faults = f
	p.actions = nil
	if len(f.Actions) > 0 {
		p.actions = make(map[string]bool, len(f.Actions))
		for _, a := range f.Actions {
			p.actions[a] = true
		}
	}
}

// Down makes every request fail as a dropped connection while down is true,
// and new connections be closed as soon as they are accepted, as when the
// endpoint's process is gone. Requests already forwarded finish normally.
func (p *Proxy) Down(down bool) { p.ln.down.Store(down) }

// Injected returns how many faults of each kind were injected so far. Under
// KindDown it counts requests refused while down and also connections closed
// at accept, which carry no request and so no action for InjectedFor.
func (p *Proxy) Injected() map[string]int64 { return p.injected("") }

// InjectedFor is Injected for one action: an SQS action name, or ActionS3.
// A DropAfter of ReceiveMessage strands up to ten messages until their
// visibility timeout: the endpoint handed them out and the client never saw
// them.
func (p *Proxy) InjectedFor(action string) map[string]int64 { return p.injected(action) }

func (p *Proxy) injected(action string) map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]int64{}
	for c, n := range p.counts {
		if action == "" || c.action == action {
			m[c.kind] += n
		}
	}
	if n := p.ln.refused.Load(); n > 0 && action == "" {
		m[KindDown] += n // connections refused while down, before any request
	}
	return m
}

// Requests is how many requests reached the proxy, faulted or not.
func (p *Proxy) Requests() int64 { return p.requests.Load() }

// Close stops the proxy and closes its connections. It may be called more
// than once.
func (p *Proxy) Close() error {
	err := p.srv.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) count(kind, action string, n int64) {
	p.mu.Lock()
	p.counts[count{kind, action}] += n
	p.mu.Unlock()
}

// decision is what happens to one request.
type decision struct {
	slow  time.Duration
	fault string // one of the exclusive kinds, or "" to forward
}

func (p *Proxy) decide(action string, sqs bool) decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults
	if (sqs && p.actions != nil && !p.actions[action]) || (!sqs && !f.S3 && !p.actions[ActionS3]) {
		return decision{}
	}
	var d decision
	// Draw both numbers whatever the rates, so that the sequence of
	// decisions depends only on the seed and the order of requests.
	slow, u := p.rng.Float64(), p.rng.Float64()
	if slow < f.Slow {
		d.slow = f.SlowDelay
	}
	for _, k := range []struct {
		kind string
		p    float64
	}{{KindThrottle, f.Throttle}, {KindServerError, f.ServerError}, {KindDropBefore, f.DropBefore},
		{KindDropAfter, f.DropAfter}, {KindPartialBatch, f.PartialBatch}} {
		if u < k.p {
			d.fault = k.kind
			break
		}
		u -= k.p
	}
	if d.fault == KindPartialBatch && !(sqs && batchActions[action]) {
		d.fault = ""
	}
	return d
}

// ServeHTTP applies the faults to one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	action, sqs := sqsAction(r)
	if !sqs {
		action = ActionS3
	}
	if p.ln.down.Load() {
		p.count(KindDown, action, 1)
		drop(w)
		return
	}
	if !p.buffer(w, r) {
		return
	}
	d := p.decide(action, sqs)
	if d.slow > 0 {
		p.count(KindSlow, action, 1)
		t := time.NewTimer(d.slow)
		select {
		case <-t.C:
		case <-r.Context().Done():
			// The client gave up: nothing reaches the endpoint.
			t.Stop()
			return
		}
	}
	switch d.fault {
	case KindThrottle:
		p.count(KindThrottle, action, 1)
		p.throttle(w, r, sqs)
	case KindServerError:
		p.count(KindServerError, action, 1)
		p.serverError(w, r, sqs)
	case KindDropBefore:
		p.count(KindDropBefore, action, 1)
		drop(w)
	case KindDropAfter:
		p.count(KindDropAfter, action, 1)
		p.rp.ServeHTTP(&discard{header: http.Header{}}, r)
		drop(w)
	case KindPartialBatch:
		p.partial(w, r, action)
	default:
		p.rp.ServeHTTP(w, r)
	}
}

// buffer replaces r's body with a copy in memory, and reports false (having
// dropped the client's connection) when the body cannot be read whole.
//
// Forwarding the server's own request body races net/http with itself: the
// transport's writer, having sent a body of known length, reads it once more
// to check that nothing is left; the server closes that body as soon as the
// handler writes the response's headers, which it does when the endpoint
// answers; a writer descheduled until then (a busy machine, an endpoint that
// answers in a millisecond) reads "invalid Read on closed Body", takes it for
// a failed upload and closes the connection to the endpoint under the answer
// being copied. The client then gets a 200 whose body stops short, which the
// SDK does not retry ("deserialization failed, unexpected EOF"): it broke
// about a fifth of the connections of `bench overhead -latency` and aborted
// most of its runs. A body in memory reads io.EOF however often it is asked.
// SQS bodies are at most 1 MiB; this proxy is for tests.
func (p *Proxy) buffer(w http.ResponseWriter, r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return true
	}
	body, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		drop(w) // the client's connection broke while sending
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return true
}

// sqsAction reads the action of an SQS JSON-protocol request.
func sqsAction(r *http.Request) (string, bool) {
	return strings.CutPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
}

// drop closes the client's connection without a response, with a reset
// rather than an orderly close where it can, as when the peer has crashed.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2): abort the stream instead.
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// discard is a ResponseWriter that throws the response away: the endpoint
// has acted, and the client will never know.
type discard struct{ header http.Header }

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// listener closes connections as soon as they are accepted while down.
type listener struct {
	net.Listener
	down    atomic.Bool
	refused atomic.Int64
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || !l.down.Load() {
			return c, err
		}
		l.refused.Add(1)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}

// requestID makes the x-amzn-RequestId of an answer the proxy makes itself.
func (p *Proxy) requestID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids++
	return fmt.Sprintf("faultproxy-%08d", p.ids)
}

// pick chooses each of n entries with probability 1/2, at least one.
func (p *Proxy) pick(n int) []bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	chosen := make([]bool, n)
	some := false
	for i := range chosen {
		chosen[i] = p.rng.IntN(2) == 0
		some = some || chosen[i]
	}
	if !some && n > 0 {
		chosen[p.rng.IntN(n)] = true
	}
	return chosen
}

// coinFlip is a fair draw from the generator.
func (p *Proxy) coinFlip() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.IntN(2) == 0
}

var _ http.Handler = (*Proxy)(nil)
