// Package taskprotecttest plays the ECS container agent's task protection
// endpoint for tests, as net/http/httptest plays a server.
package taskprotecttest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// Path is where Agent serves: the task protection endpoint under the
// ECS_AGENT_URI of URI.
const Path = "/api/task-1234/task-protection/v1/state"

// URI is an ECS_AGENT_URI whose endpoint is Path, for clients whose
// transport is In.
const URI = "http://169.254.170.2/api/task-1234"

// An Agent answers the way the agent does: a PUT body with fields it does
// not know is refused, state comes back under "protection", ECS failures
// under "failure" and errors under "error". A request the real agent would
// refuse fails the test.
type Agent struct {
	t testing.TB

	mu        sync.Mutex
	puts      []Put
	protected bool
	expires   time.Time
	// fail, while positive, answers that many calls with an error and
	// counts down; failStatus and failBody are the answer.
	fail       int
	failStatus int
	failBody   string
	// observe, when set, is called on every PUT; what it returns is kept
	// with the PUT.
	observe func() string
}

// Put is one PUT the agent received.
type Put struct {
	At       time.Time
	Enabled  bool
	Minutes  *int // ExpiresInMinutes, nil when not sent
	Observed string
}

// NewAgent returns an agent, unprotected, that answers every call.
func NewAgent(t testing.TB) *Agent { return &Agent{t: t} }

// Fail makes the next n calls fail with status and body.
func (a *Agent) Fail(n, status int, body string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail, a.failStatus, a.failBody = n, status, body
}

// Observe calls f on every PUT and keeps what it returns with the PUT.
func (a *Agent) Observe(f func() string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.observe = f
}

// Puts returns the PUTs received so far.
func (a *Agent) Puts() []Put {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Put(nil), a.puts...)
}

// ClearPuts forgets the PUTs received so far.
func (a *Agent) ClearPuts() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.puts = nil
}

func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path != Path {
		a.t.Errorf("agent: %s %s; want %s", r.Method, r.URL.Path, Path)
		http.NotFound(w, r)
		return
	}
	switch r.Method {
	case http.MethodGet:
	case http.MethodPut:
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			a.t.Errorf("agent: PUT with Content-Type %q", ct)
		}
		var req struct {
			ProtectionEnabled *bool
			ExpiresInMinutes  *int
		}
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.ProtectionEnabled == nil {
			a.t.Errorf("agent: bad PUT body: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"error":{"Code":"InvalidParameterException","Message":"UpdateTaskProtection: failed to decode request"}}`))
			return
		}
		p := Put{At: time.Now(), Enabled: *req.ProtectionEnabled, Minutes: req.ExpiresInMinutes}
		if a.observe != nil {
			p.Observed = a.observe()
		}
		a.puts = append(a.puts, p)
		if a.fail > 0 {
			break
		}
		a.protected = p.Enabled
		if p.Enabled {
			minutes := 120
			if p.Minutes != nil {
				minutes = *p.Minutes
			}
			a.expires = time.Now().Add(time.Duration(minutes) * time.Minute).UTC().Truncate(time.Second)
		}
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	if a.fail > 0 {
		a.fail--
		w.WriteHeader(a.failStatus)
		w.Write([]byte(a.failBody))
		return
	}
	var exp any
	if a.protected {
		exp = a.expires.Format(time.RFC3339)
	}
	json.NewEncoder(w).Encode(map[string]any{"protection": map[string]any{
		"ExpirationDate": exp, "ProtectionEnabled": a.protected,
		"TaskArn": "arn:aws:ecs:us-east-1:111122223333:task/vramq/1234",
	}})
}

// In returns an HTTP client whose requests go straight to h, in memory, so
// that the agent can answer inside a synctest bubble; call it inside the
// bubble.
func In(h http.Handler) *http.Client {
	return &http.Client{Transport: handlerTransport{h}, Timeout: 5 * time.Second}
}

type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	if r.Body != nil {
		r.Body.Close()
	}
	return rec.Result(), nil
}
