package fakeoai

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// Recorder serves a Server through a URL of its own and keeps, for each
// item content a model route's request carried (a chat's first message,
// each embeddings input), the status of every answer to it, in order: 0
// when none was written (the client went away first). Tests read it to
// tell which items reached the server, and how often; and when each 200
// was written, to count a client's answers over part of a run; and when
// each request arrived and each 200 was written, to tell an item asked
// again after its answer (AskedAfterAnswer) from a retry of a refusal.
type Recorder struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen map[string][]int
	oks  []time.Time // when each 200 answer was written, per item content
	// arrived is when each content's requests arrived; answered when the
	// first 200 to it was written.
	arrived  map[string][]time.Time
	answered map[string]time.Time
}

// NewRecorder serves s through a Recorder until the test ends.
func NewRecorder(t testing.TB, s *Server) *Recorder {
	r := &Recorder{seen: map[string][]int{}, arrived: map[string][]time.Time{}, answered: map[string]time.Time{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		arrived := time.Now()
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		sw := &statusWriter{ResponseWriter: w}
		s.ServeHTTP(sw, req)
		if req.Method != http.MethodPost {
			return
		}
		contents := requestContents(body)
		now := time.Now()
		r.mu.Lock()
		for _, c := range contents {
			r.seen[c] = append(r.seen[c], sw.status)
			r.arrived[c] = append(r.arrived[c], arrived)
			if sw.status == http.StatusOK {
				r.oks = append(r.oks, now)
				if _, ok := r.answered[c]; !ok {
					r.answered[c] = now
				}
			}
		}
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// URL is the recorder's base URL, to give a client in place of the server's.
func (r *Recorder) URL() string { return r.srv.URL }

// Answers returns the statuses answered to each content's requests.
func (r *Recorder) Answers() map[string][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := maps.Clone(r.seen)
	for k, v := range out {
		out[k] = slices.Clone(v)
	}
	return out
}

// OKSince counts the 200 answers, one an item content a request carried,
// written at or after from (an item answered twice counts twice).
func (r *Recorder) OKSince(from time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, at := range r.oks {
		if !at.Before(from) {
			n++
		}
	}
	return n
}

// AskedAfterAnswer counts the item contents requested, through any of
// recs (each client of one server has its own), after a 200 to them was
// written: an answer asked for again, which issue 33 item 5 forbids. A
// refusal's retry (a 429, a 503) is not one: no answer was written before
// it.
func AskedAfterAnswer(recs ...*Recorder) int {
	first := map[string]time.Time{}
	for _, r := range recs {
		r.mu.Lock()
		for c, at := range r.answered {
			if f, ok := first[c]; !ok || at.Before(f) {
				first[c] = at
			}
		}
		r.mu.Unlock()
	}
	again := map[string]bool{}
	for _, r := range recs {
		r.mu.Lock()
		for c, times := range r.arrived {
			f, ok := first[c]
			if ok && slices.ContainsFunc(times, f.Before) {
				again[c] = true
			}
		}
		r.mu.Unlock()
	}
	return len(again)
}

// requestContents is what a request body asks about: a chat's first
// message, an embeddings request's input or inputs.
func requestContents(body []byte) []string {
	var b struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
		Input json.RawMessage `json:"input"`
	}
	_ = json.Unmarshal(body, &b)
	var contents []string
	if len(b.Messages) > 0 {
		contents = append(contents, b.Messages[0].Content)
	}
	var one string
	if json.Unmarshal(b.Input, &one) == nil {
		return append(contents, one)
	}
	var many []string
	_ = json.Unmarshal(b.Input, &many)
	return append(contents, many...)
}

// statusWriter keeps the status of the answer it writes.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
