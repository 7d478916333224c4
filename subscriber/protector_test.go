package subscriber

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeAgent plays the ECS container agent's task protection endpoint, the
// way the agent answers: a PUT body with fields it does not know is refused,
// state comes back under "protection", ECS failures under "failure" and
// errors under "error".
type fakeAgent struct {
	t *testing.T

	mu        sync.Mutex
	puts      []agentPut
	gets      int
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

type agentPut struct {
	At       time.Time
	Enabled  bool
	Minutes  *int
	Observed string
}

const agentPath = "/api/task-1234/task-protection/v1/state"

func (a *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path != agentPath {
		a.t.Errorf("agent: %s %s; want %s", r.Method, r.URL.Path, agentPath)
		http.NotFound(w, r)
		return
	}
	switch r.Method {
	case http.MethodGet:
		a.gets++
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
		p := agentPut{At: time.Now(), Enabled: *req.ProtectionEnabled, Minutes: req.ExpiresInMinutes}
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

func (a *fakeAgent) recorded() []agentPut {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]agentPut(nil), a.puts...)
}

// handlerTransport sends requests straight to a handler, in memory, so the
// agent can answer inside a synctest bubble.
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

// inMemory returns a TaskProtection client of agent; call it inside the
// bubble.
func inMemory(t *testing.T, agent *fakeAgent) *TaskProtection {
	t.Helper()
	tp, err := NewTaskProtection("http://169.254.170.2/api/task-1234", &http.Client{Transport: handlerTransport{agent}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

func minutes(n int) *int { return &n }

// One long job: protection goes on as the message is received, is renewed at
// half its expiry while the job runs, and goes off once the subscriber has
// held nothing for protectionIdle.
func TestTaskProtectionFollowsHeldMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &fakeAgent{t: t}
		t0 := time.Now()
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent), TaskProtectionExpiry: 10 * time.Minute,
			InferenceTimeout: 20 * time.Minute, MaxHold: 30 * time.Minute})
		time.Sleep(time.Minute)
		if puts := agent.recorded(); len(puts) != 0 {
			t.Fatalf("an idle subscriber called the agent: %+v", puts)
		}
		if counter(h.sub.m.protected) != 0 {
			t.Error("task_protected is 1 with nothing held")
		}

		h.send("long", 0, "mb=4 ms=720000") // 12 minutes on the device
		waitFor(t, time.Minute, "protection on", func() bool { return len(agent.recorded()) == 1 })
		if counter(h.sub.m.protected) != 1 {
			t.Error("task_protected is 0 while a message is held")
		}
		waitFor(t, 20*time.Minute, "the result", func() bool { live, _ := h.results.stats(); return live == 1 })
		waitFor(t, 2*time.Minute, "protection off", func() bool { return len(agent.recorded()) == 4 })
		time.Sleep(5 * time.Minute)
		h.shutdown()

		// Times are from the start, rounded to the minute and second the
		// events fall in: received at 1m, renewed at 6m and 11m, done at 13m,
		// off 30 s later.
		var got []string
		for _, p := range agent.recorded() {
			got = append(got, p.At.Sub(t0).Truncate(time.Second).String())
		}
		want := []string{"1m0s", "6m0s", "11m0s", "13m30s"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("PUT times (-want +got):\n%s", diff)
		}
		bodies := agent.recorded()
		for i := range bodies {
			bodies[i].At = time.Time{}
		}
		wantBodies := []agentPut{{Enabled: true, Minutes: minutes(10)}, {Enabled: true, Minutes: minutes(10)},
			{Enabled: true, Minutes: minutes(10)}, {Enabled: false}}
		if diff := cmp.Diff(wantBodies, bodies); diff != "" {
			t.Errorf("PUT bodies (-want +got):\n%s", diff)
		}
		if counter(h.sub.m.protected) != 0 || counter(h.sub.m.protectionErrors) != 0 {
			t.Errorf("task_protected %d, errors %d; want 0, 0", counter(h.sub.m.protected), counter(h.sub.m.protectionErrors))
		}
	})
}

// A steady stream of short messages, with gaps shorter than protectionIdle,
// keeps protection on without a call per message.
func TestTaskProtectionDoesNotFlapBetweenMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &fakeAgent{t: t}
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent)})
		for i := range 20 {
			h.send("stream", i, "mb=4 ms=500")
			time.Sleep(10 * time.Second)
		}
		waitFor(t, time.Minute, "20 results", func() bool { live, _ := h.results.stats(); return live == 20 })
		time.Sleep(time.Minute)
		h.shutdown()
		var enabled []bool
		for _, p := range agent.recorded() {
			enabled = append(enabled, p.Enabled)
		}
		if diff := cmp.Diff([]bool{true, false}, enabled); diff != "" {
			t.Errorf("PUTs over 20 messages 10 s apart (-want +got):\n%s", diff)
		}
	})
}

// Shutdown clears protection, and only once every message is settled: a
// running message is released first.
func TestTaskProtectionClearedAtShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &fakeAgent{t: t}
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent), ShutdownGrace: time.Second,
			InferenceTimeout: 20 * time.Minute, MaxHold: 30 * time.Minute})
		agent.mu.Lock()
		agent.observe = func() string {
			l := h.sub.Ledger()
			live, invisible := h.work.stats()
			return strings.Join([]string{"held=" + itoa(h.sub.keeper.held.Load()), "released=" + itoa(l.Released),
				"live=" + itoa(int64(live)), "invisible=" + itoa(int64(invisible))}, " ")
		}
		agent.mu.Unlock()
		h.send("long", 0, "mb=4 ms=600000")
		waitFor(t, time.Minute, "the job to start", func() bool { return h.model.runs.Load() == 1 })
		h.shutdown()

		puts := agent.recorded()
		if len(puts) != 2 || !puts[0].Enabled || puts[1].Enabled {
			t.Fatalf("PUTs %+v; want on, then off at shutdown", puts)
		}
		if want := "held=0 released=1 live=1 invisible=0"; puts[1].Observed != want {
			t.Errorf("at the shutdown PUT: %s; want %s (the message back on the queue first)", puts[1].Observed, want)
		}
		if counter(h.sub.m.protected) != 0 {
			t.Error("task_protected still 1 after shutdown")
		}
	})
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// Errors from the agent, in each of its shapes, are counted and retried with
// backoff, and the work is done as if nothing had happened.
func TestTaskProtectionErrorsAreCountedAndRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
	}{
		{"throttled", http.StatusBadRequest, `{"requestID":"r-1","error":{"Arn":"arn:task","Code":"ThrottlingException","Message":"Rate exceeded"}}`},
		{"access denied", http.StatusBadRequest, `{"requestID":"r-2","error":{"Arn":"arn:task","Code":"AccessDeniedException","Message":"not authorized to perform: ecs:UpdateTaskProtection"}}`},
		{"ECS unreachable", http.StatusGatewayTimeout, `{"error":{"Arn":"arn:task","Code":"RequestCanceled","Message":"Timed out calling ECS Task Protection API"}}`},
		{"failure", http.StatusOK, `{"failure":{"Arn":"arn:task","Detail":null,"Reason":"DEPLOYMENT_BLOCKED"}}`},
		{"not JSON", http.StatusServiceUnavailable, `agent restarting`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				agent := &fakeAgent{t: t, fail: 3, failStatus: tc.status, failBody: tc.body}
				h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent)})
				h.send("a", 0, "mb=4 ms=60000")
				for i := 1; i <= 5; i++ {
					h.send("b", i, "mb=4 ms=100")
				}
				waitFor(t, 3*time.Minute, "6 results", func() bool { live, _ := h.results.stats(); return live == 6 })
				waitFor(t, 2*time.Minute, "protection off", func() bool {
					puts := agent.recorded()
					return len(puts) > 0 && !puts[len(puts)-1].Enabled
				})
				h.shutdown()

				if got, dups := h.resultsByKey(); len(got) != 6 || dups != 0 {
					t.Errorf("%d results, %d duplicates; want 6, 0", len(got), dups)
				}
				if n := counter(h.sub.m.protectionErrors); n != 3 {
					t.Errorf("task_protection_errors_total %d, want 3", n)
				}
				puts := agent.recorded()
				if len(puts) != 5 || !puts[3].Enabled || puts[4].Enabled {
					t.Fatalf("PUTs %+v; want 3 failed enables, 1 that worked, 1 disable", puts)
				}
				// Backoff: 1 s, then 2 s, then 4 s.
				for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
					if gap := puts[i+1].At.Sub(puts[i].At); gap != want {
						t.Errorf("retry %d after %v, want %v", i+1, gap, want)
					}
				}
			})
		})
	}
}

// An agent that always fails costs nothing but log lines and a counter.
func TestTaskProtectionAgentDownDoesNotStopWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &fakeAgent{t: t, fail: 1 << 30, failStatus: http.StatusInternalServerError, failBody: `{"error":{"Code":"ServerException","Message":"boom"}}`}
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent)})
		h.mixed(20)
		waitFor(t, 5*time.Minute, "20 results", func() bool { live, _ := h.results.stats(); return live == 20 })
		h.shutdown()
		if n := counter(h.sub.m.protectionErrors); n == 0 {
			t.Error("no errors counted")
		}
		if counter(h.sub.m.protected) != 0 {
			t.Error("task_protected is 1 though the agent never agreed")
		}
		if live, _ := h.work.stats(); live != 0 {
			t.Errorf("%d messages left on the work queue", live)
		}
	})
}

// Protection whose renewals keep failing is reported as lapsed once its
// expiry has passed.
func TestTaskProtectionLapsesWhenRenewalsFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &fakeAgent{t: t}
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent), TaskProtectionExpiry: 4 * time.Minute,
			InferenceTimeout: 20 * time.Minute, MaxHold: 30 * time.Minute})
		h.send("long", 0, "mb=4 ms=600000")
		waitFor(t, time.Minute, "protection on", func() bool { return len(agent.recorded()) == 1 })
		agent.mu.Lock()
		agent.fail, agent.failStatus, agent.failBody = 1<<30, http.StatusInternalServerError, `{"error":{"Code":"ServerException"}}`
		agent.mu.Unlock()
		time.Sleep(3 * time.Minute) // renewals from 2 m fail
		if counter(h.sub.m.protected) != 1 {
			t.Error("task_protected is 0 before the expiry")
		}
		time.Sleep(2 * time.Minute) // past the 4 m expiry
		if counter(h.sub.m.protected) != 0 {
			t.Error("task_protected is still 1 after the protection expired")
		}
		h.shutdown()
	})
}

// The client against a real local HTTP server playing the agent.
func TestTaskProtectionClient(t *testing.T) {
	agent := &fakeAgent{t: t}
	srv := httptest.NewServer(agent)
	defer srv.Close()
	tp, err := NewTaskProtection(srv.URL+"/api/task-1234/", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	for _, tc := range []struct {
		enabled bool
		expiry  time.Duration
		want    *int
	}{
		{true, time.Hour, minutes(60)},
		{true, 90 * time.Second, minutes(2)}, // rounded up
		{true, 0, minutes(1)},
		{true, 72 * time.Hour, minutes(2880)}, // the ECS maximum
		{false, time.Hour, nil},               // no expiry when turning it off
	} {
		agent.mu.Lock()
		agent.puts = nil
		agent.mu.Unlock()
		if err := tp.Set(ctx, tc.enabled, tc.expiry); err != nil {
			t.Fatalf("Set(%v, %v): %v", tc.enabled, tc.expiry, err)
		}
		puts := agent.recorded()
		if len(puts) != 1 || puts[0].Enabled != tc.enabled || !cmp.Equal(puts[0].Minutes, tc.want) {
			t.Errorf("Set(%v, %v) sent %+v; want ExpiresInMinutes %v", tc.enabled, tc.expiry, puts, tc.want)
		}
	}

	if err := tp.Set(ctx, true, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	st, err := tp.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ProtectionEnabled || st.ExpirationDate == nil || !strings.HasSuffix(st.TaskArn, "task/vramq/1234") {
		t.Errorf("Get = %+v", st)
	}
	if d := time.Until(*st.ExpirationDate); d < 29*time.Minute || d > 31*time.Minute {
		t.Errorf("expires in %v, want about 30m", d)
	}

	for _, tc := range []struct {
		status     int
		body       string
		wantCode   string
		wantInText []string
	}{
		{http.StatusOK, `{"failure":{"Arn":"arn:task","Detail":null,"Reason":"TASK_NOT_VALID"}}`, "TASK_NOT_VALID",
			[]string{"TASK_NOT_VALID", "only tasks of an ECS service"}},
		{http.StatusBadRequest, `{"requestID":"r-9","error":{"Arn":"arn:task","Code":"AccessDeniedException","Message":"not authorized"}}`,
			"AccessDeniedException", []string{"HTTP 400", "not authorized", "r-9", "ecs:UpdateTaskProtection and ecs:GetTaskProtection"}},
		{http.StatusBadGateway, `bad gateway`, "", []string{"HTTP 502", "bad gateway"}},
	} {
		agent.mu.Lock()
		agent.fail, agent.failStatus, agent.failBody = 1, tc.status, tc.body
		agent.mu.Unlock()
		err := tp.Set(ctx, true, time.Hour)
		var pe *ProtectionError
		if !errors.As(err, &pe) || pe.Code != tc.wantCode || pe.StatusCode != tc.status {
			t.Errorf("answer %d %s: err %v; want a ProtectionError with code %q", tc.status, tc.body, err, tc.wantCode)
			continue
		}
		for _, s := range tc.wantInText {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
	}

	// A 200 that is not the agent's answer is an error, not protection.
	odd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{}`)) }))
	defer odd.Close()
	tp2, _ := NewTaskProtection(odd.URL, nil)
	if err := tp2.Set(ctx, true, time.Hour); err == nil {
		t.Error("an empty answer was taken for protection")
	}

	for _, bad := range []string{"", "169.254.170.2/api/x", "ftp://host/x"} {
		if _, err := NewTaskProtection(bad, nil); err == nil {
			t.Errorf("NewTaskProtection(%q) accepted", bad)
		}
	}
}

// Under load that never stops, protection takes a break after
// TaskProtectionMaxHold, with the message still held, so that a deployment
// waiting for the task is not blocked for ever; after the break it goes back
// on, and the held message is not disturbed.
func TestTaskProtectionTakesBreaksUnderSteadyLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &fakeAgent{t: t}
		t0 := time.Now()
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent), TaskProtectionExpiry: 10 * time.Minute,
			TaskProtectionMaxHold: 12 * time.Minute, InferenceTimeout: time.Hour, MaxHold: 2 * time.Hour})
		h.send("long", 0, "mb=4 ms=1800000") // 30 minutes on the device
		waitFor(t, time.Minute, "protection on", func() bool { return len(agent.recorded()) == 1 })
		waitFor(t, 40*time.Minute, "the result", func() bool { live, _ := h.results.stats(); return live == 1 })
		waitFor(t, 2*time.Minute, "protection off", func() bool {
			puts := agent.recorded()
			return !puts[len(puts)-1].Enabled && puts[len(puts)-1].At.Sub(t0) > 30*time.Minute
		})
		h.shutdown()

		// On at 0, renewed at 5m and 10m; a break at 12m (on for MaxHold);
		// on again at 14m, renewed at 19m and 24m; a break at 26m; on at 28m;
		// done at 30m and off 30 s later.
		var got []string
		for _, p := range agent.recorded() {
			state := "off"
			if p.Enabled {
				state = "on"
			}
			got = append(got, state+"@"+p.At.Sub(t0).Truncate(time.Second).String())
		}
		want := []string{"on@0s", "on@5m0s", "on@10m0s", "off@12m0s", "on@14m0s", "on@19m0s", "on@24m0s",
			"off@26m0s", "on@28m0s", "off@30m30s"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("PUTs (-want +got):\n%s", diff)
		}
		if got, dups := h.resultsByKey(); len(got) != 1 || dups != 0 {
			t.Errorf("%d results, %d duplicates; want 1, 0", len(got), dups)
		}
	})
}
