package fakeoai

import (
	"bytes"
	"encoding/json"
	"io"
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
	srv *httptest.Server
	mu  sync.Mutex
	// asked is each item content's requests, in order of their answers.
	asked map[string][]asked
}

// asked is one request for an item content: when it arrived, the status
// of its answer (0 when none was written: the client went away first),
// and when the answer was written.
type asked struct {
	arrived, answered time.Time
	status            int
}

// NewRecorder serves s through a Recorder until the test ends.
func NewRecorder(t testing.TB, s *Server) *Recorder {
	r := &Recorder{asked: map[string][]asked{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		arrived := time.Now()
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		sw := &statusWriter{ResponseWriter: w}
		s.ServeHTTP(sw, req)
		if req.Method != http.MethodPost {
			return
		}
		a := asked{arrived: arrived, answered: time.Now(), status: sw.status}
		r.mu.Lock()
		for _, c := range requestContents(body) {
			r.asked[c] = append(r.asked[c], a)
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
	out := make(map[string][]int, len(r.asked))
	for c, as := range r.asked {
		for _, a := range as {
			out[c] = append(out[c], a.status)
		}
	}
	return out
}

// OKSince counts the 200 answers, one an item content a request carried,
// written at or after from (an item answered twice counts twice).
func (r *Recorder) OKSince(from time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, as := range r.asked {
		for _, a := range as {
			if a.status == http.StatusOK && !a.answered.Before(from) {
				n++
			}
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
	first := map[string]time.Time{} // each content's first 200
	for _, r := range recs {
		r.mu.Lock()
		for c, as := range r.asked {
			for _, a := range as {
				if f, ok := first[c]; a.status == http.StatusOK && (!ok || a.answered.Before(f)) {
					first[c] = a.answered
				}
			}
		}
		r.mu.Unlock()
	}
	again := map[string]bool{}
	for _, r := range recs {
		r.mu.Lock()
		for c, as := range r.asked {
			f, ok := first[c]
			if ok && slices.ContainsFunc(as, func(a asked) bool { return a.arrived.After(f) }) {
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
