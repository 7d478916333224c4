package fakeoai

import (
	"container/list"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Server is a running double. Its methods are safe for concurrent use.
type Server struct {
	clock   clock
	mux     *http.ServeMux
	metrics http.Handler
	srv     *http.Server
	url     string
	client  *http.Client

	mu       sync.Mutex
	cfg      Config
	rng      *rand.Rand
	faults   []*armedFault
	limits   limiter
	stats    Stats
	minutes  []*minuteAcc
	seconds  []Second
	running  []*job // in the order they were scheduled
	waiting  []*job
	used     int                     // KV blocks held by running sequences
	cache    map[uint64]*cachedBlock // the prefix cache's blocks by hash
	idle     *list.List              // of hashes: cached blocks no one holds, the next to evict first
	online   *online                 // StartOnline's load
	ttft     prometheus.Histogram    // of every generation, server seconds
	kvLast   time.Time
	inflight int      // requests between admission and answer, for TGI's limit
	kvUsage  *float64 // SetKVUsage's
	ids      uint64

	wake      chan struct{}
	quit      chan struct{}
	loopDone  chan struct{}
	closeOnce sync.Once
}

// New starts a server on 127.0.0.1 at a free port. It panics if cfg does not
// Validate, as httptest.NewServer panics when it cannot listen: a test's
// setup is wrong.
func New(cfg Config) *Server {
	s := NewUnstarted(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.Close()
		panic(fmt.Sprintf("fakeoai: listen: %v", err))
	}
	s.url = "http://" + ln.Addr().String()
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	s.client = &http.Client{Transport: tr}
	go func() { _ = s.srv.Serve(ln) }()
	return s
}

// NewUnstarted returns a server that listens nowhere: Client reaches its
// Handler in process, which lets a test run it inside a testing/synctest
// bubble (a listener would keep the bubble's clock from advancing). It
// panics as New does.
func NewUnstarted(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.withDefaults()
	cfg.Models = slices.Clone(cfg.Models)
	now := time.Now()
	s := &Server{
		clock:    clock{start: now, speed: cfg.Speed},
		url:      "http://fakeoai.invalid",
		cfg:      cfg,
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		stats:    Stats{ByStatus: map[int]int64{}, Faults: map[FaultKind]int64{}},
		kvLast:   now,
		cache:    map[uint64]*cachedBlock{},
		ttft:     newTTFT(cfg.Models[0]),
		idle:     list.New(),
		wake:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	s.limits = newLimiter(cfg.Limits, now)
	s.setFaults(cfg.Faults)
	s.client = &http.Client{Transport: inProcess{s}}
	s.metrics = s.metricsHandler()
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/chat/completions", s.serveModel)
	s.mux.HandleFunc("POST /v1/completions", s.serveModel)
	s.mux.HandleFunc("POST /v1/embeddings", s.serveModel)
	s.mux.HandleFunc("POST /v1/messages", s.serveModel)
	s.mux.HandleFunc("POST /v1/responses", s.serveModel)
	s.mux.HandleFunc("POST /v1/moderations", s.serveModel)
	s.mux.HandleFunc("GET /v1/models", s.serveModels)
	if !cfg.NoMetrics {
		s.mux.Handle("GET /metrics", s.metrics)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeOpenAI(w, http.StatusNotFound, fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path), "invalid_request_error", "", "")
	})
	go s.schedule()
	return s
}

// URL is the base URL, without /v1 (the SDK's base URL is URL()+"/v1/").
func (s *Server) URL() string { return s.url }

// Client is an HTTP client for the server: a pooled one for New's, an
// in-process one for NewUnstarted's.
func (s *Server) Client() *http.Client { return s.client }

// Now is the server's clock.
func (s *Server) Now() time.Time { return s.clock.now() }

// ServeHTTP makes the Server its own http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close stops the listener and the scheduler; requests still waiting are
// answered 503. It may be called more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.quit)
		if s.srv != nil {
			s.srv.Close()
		}
		<-s.loopDone
		if tr, ok := s.client.Transport.(*http.Transport); ok {
			tr.CloseIdleConnections()
		}
	})
}

// SetFaults replaces the faults to inject; their counts start over.
func (s *Server) SetFaults(faults ...Fault) error {
	for _, f := range faults {
		if err := f.validate(); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setFaults(faults)
	return nil
}

func (s *Server) setFaults(faults []Fault) {
	s.faults = s.faults[:0]
	for _, f := range faults {
		f.Paths = slices.Clone(f.Paths)
		s.faults = append(s.faults, &armedFault{Fault: f})
	}
}

// SetRateLimits replaces the rate limits from now on; what was used of the
// old buckets stays used.
func (s *Server) SetRateLimits(l RateLimits) error {
	if err := l.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits.replace(l, s.clock.now())
	return nil
}

// SetQuotaExhausted makes every model request answer 429
// insufficient_quota (true) or stops it (false), as an account out of
// credit does until someone pays.
func (s *Server) SetQuotaExhausted(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits.exhausted = on
}

// SetKVUsage makes /metrics report v as vllm:kv_cache_usage_perc, whatever
// the pool holds, as a broken exporter might (a NaN, say); a nil v reports
// the pool's usage again.
func (s *Server) SetKVUsage(v *float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kvUsage = v
}

// SetTokenLatency changes the scheduler's step from the next step on.
func (s *Server) SetTokenLatency(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("fakeoai: token latency %v: want 0 or more", d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.TokenLatency = d
	return nil
}

func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	s.mu.Lock()
	key := s.cfg.APIKey
	s.mu.Unlock()
	if key == "" || r.Header.Get("Authorization") == "Bearer "+key {
		return true
	}
	writeOpenAI(w, http.StatusUnauthorized, "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
		"invalid_request_error", "", "invalid_api_key")
	return false
}

func (s *Server) serveModels(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	list := modelList{Object: "list"}
	for _, m := range s.cfg.Models {
		list.Data = append(list.Data, modelCard{ID: m, Object: "model", Created: s.clock.start.Unix(), OwnedBy: "fakeoai"})
	}
	writeJSON(w, http.StatusOK, list)
}

// answer wraps a model route's ResponseWriter: the first WriteHeader adds
// the rate-limit headers as they are then, and the answer goes to the
// ledger.
type answer struct {
	http.ResponseWriter
	s      *Server
	status int
	start  time.Time
	extra  http.Header // a fault's, set over the others (Fault.Header)
}

func (a *answer) WriteHeader(status int) {
	if a.status != 0 {
		return
	}
	a.status = status
	h := a.Header()
	a.s.mu.Lock()
	a.s.ids++
	h.Set("x-request-id", "req_"+strconv.FormatUint(a.s.ids, 16))
	a.s.limits.headers(h, a.s.clock.now(), a.s.clock)
	a.s.mu.Unlock()
	for k, v := range a.extra {
		h[http.CanonicalHeaderKey(k)] = v
	}
	h.Set("openai-processing-ms", strconv.FormatInt(time.Since(a.start).Milliseconds(), 10))
	a.ResponseWriter.WriteHeader(status)
}

func (a *answer) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	return a.ResponseWriter.Write(b)
}

func (a *answer) Flush() {
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// drop closes the client's connection without an answer.
func (a *answer) drop() {
	if d, ok := a.ResponseWriter.(interface{ drop() }); ok {
		d.drop()
		return
	}
	if hj, ok := a.ResponseWriter.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// record puts an answer (status 0: a dropped connection) in the counters
// and the ledger.
func (s *Server) record(status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.ByStatus[status]++
	s.minute(s.clock.now()).Answers++
}

var errClosed = errors.New("fakeoai: server closed")
