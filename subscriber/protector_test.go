package subscriber

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/subscriber/taskprotect"
	"github.com/vramq/vramq/subscriber/taskprotect/taskprotecttest"
)

// inMemory returns a task protection client of agent; call it inside the
// bubble.
func inMemory(t *testing.T, agent *taskprotecttest.Agent) *taskprotect.Client {
	t.Helper()
	tp, err := taskprotect.New(taskprotecttest.URI, taskprotecttest.In(agent))
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
		agent := taskprotecttest.NewAgent(t)
		t0 := time.Now()
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent), TaskProtectionExpiry: 10 * time.Minute,
			InferenceTimeout: 20 * time.Minute, MaxHold: 30 * time.Minute})
		time.Sleep(time.Minute)
		if puts := agent.Puts(); len(puts) != 0 {
			t.Fatalf("an idle subscriber called the agent: %+v", puts)
		}
		if counter(h.sub.m.protected) != 0 {
			t.Error("task_protected is 1 with nothing held")
		}

		h.send("long", 0, "mb=4 ms=720000") // 12 minutes on the device
		wait.For(t, time.Minute, "protection on", func() bool { return len(agent.Puts()) == 1 })
		if counter(h.sub.m.protected) != 1 {
			t.Error("task_protected is 0 while a message is held")
		}
		wait.For(t, 20*time.Minute, "the result", func() bool { live, _ := h.results.Stats(); return live == 1 })
		wait.For(t, 2*time.Minute, "protection off", func() bool { return len(agent.Puts()) == 4 })
		time.Sleep(5 * time.Minute)
		h.shutdown()

		// Times are from the start, rounded to the minute and second the
		// events fall in: received at 1m, renewed at 6m and 11m, done at 13m,
		// off 30 s later.
		var got []string
		for _, p := range agent.Puts() {
			got = append(got, p.At.Sub(t0).Truncate(time.Second).String())
		}
		want := []string{"1m0s", "6m0s", "11m0s", "13m30s"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("PUT times (-want +got):\n%s", diff)
		}
		bodies := agent.Puts()
		for i := range bodies {
			bodies[i].At = time.Time{}
		}
		wantBodies := []taskprotecttest.Put{{Enabled: true, Minutes: minutes(10)}, {Enabled: true, Minutes: minutes(10)},
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
		agent := taskprotecttest.NewAgent(t)
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent)})
		for i := range 20 {
			h.send("stream", i, "mb=4 ms=500")
			time.Sleep(10 * time.Second)
		}
		wait.For(t, time.Minute, "20 results", func() bool { live, _ := h.results.Stats(); return live == 20 })
		time.Sleep(time.Minute)
		h.shutdown()
		var enabled []bool
		for _, p := range agent.Puts() {
			enabled = append(enabled, p.Enabled)
		}
		if diff := cmp.Diff([]bool{true, false}, enabled); diff != "" {
			t.Errorf("PUTs over 20 messages 10 s apart (-want +got):\n%s", diff)
		}
	})
}

// Shutdown clears protection, and only once every message has ended: a
// running message is released first.
func TestTaskProtectionClearedAtShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := taskprotecttest.NewAgent(t)
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent), ShutdownGrace: time.Second,
			InferenceTimeout: 20 * time.Minute, MaxHold: 30 * time.Minute})
		agent.Observe(func() string {
			l := h.sub.Ledger()
			live, invisible := h.work.Stats()
			return strings.Join([]string{"held=" + itoa(h.sub.keeper.held.Load()), "released=" + itoa(l.Released),
				"live=" + itoa(int64(live)), "invisible=" + itoa(int64(invisible))}, " ")
		})
		h.send("long", 0, "mb=4 ms=600000")
		wait.For(t, time.Minute, "the job to start", func() bool { return h.model.runs.Load() == 1 })
		h.shutdown()

		puts := agent.Puts()
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
		{"throttled", http.StatusBadRequest,
			`{"requestID":"r-1","error":{"Arn":"arn:task","Code":"ThrottlingException","Message":"Rate exceeded"}}`},
		{"access denied", http.StatusBadRequest, `{"requestID":"r-2","error":{"Arn":"arn:task","Code":"AccessDeniedException",` +
			`"Message":"not authorized to perform: ecs:UpdateTaskProtection"}}`},
		{"ECS unreachable", http.StatusGatewayTimeout,
			`{"error":{"Arn":"arn:task","Code":"RequestCanceled","Message":"Timed out calling ECS Task Protection API"}}`},
		{"failure", http.StatusOK, `{"failure":{"Arn":"arn:task","Detail":null,"Reason":"DEPLOYMENT_BLOCKED"}}`},
		{"not JSON", http.StatusServiceUnavailable, `agent restarting`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				agent := taskprotecttest.NewAgent(t)
				agent.Fail(3, tc.status, tc.body)
				h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent)})
				h.send("a", 0, "mb=4 ms=60000")
				for i := 1; i <= 5; i++ {
					h.send("b", i, "mb=4 ms=100")
				}
				wait.For(t, 3*time.Minute, "6 results", func() bool { live, _ := h.results.Stats(); return live == 6 })
				wait.For(t, 2*time.Minute, "protection off", func() bool {
					puts := agent.Puts()
					return len(puts) > 0 && !puts[len(puts)-1].Enabled
				})
				h.shutdown()

				if got, dups := h.resultsByKey(); len(got) != 6 || dups != 0 {
					t.Errorf("%d results, %d duplicates; want 6, 0", len(got), dups)
				}
				if n := counter(h.sub.m.protectionErrors); n != 3 {
					t.Errorf("task_protection_errors_total %d, want 3", n)
				}
				puts := agent.Puts()
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
		agent := taskprotecttest.NewAgent(t)
		agent.Fail(1<<30, http.StatusInternalServerError, `{"error":{"Code":"ServerException","Message":"boom"}}`)
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent)})
		h.mixed(20)
		wait.For(t, 5*time.Minute, "20 results", func() bool { live, _ := h.results.Stats(); return live == 20 })
		h.shutdown()
		if n := counter(h.sub.m.protectionErrors); n == 0 {
			t.Error("no errors counted")
		}
		if counter(h.sub.m.protected) != 0 {
			t.Error("task_protected is 1 though the agent never agreed")
		}
		if live, _ := h.work.Stats(); live != 0 {
			t.Errorf("%d messages left on the work queue", live)
		}
	})
}

// Protection whose renewals keep failing is reported as lapsed once its
// expiry has passed.
func TestTaskProtectionLapsesWhenRenewalsFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := taskprotecttest.NewAgent(t)
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent), TaskProtectionExpiry: 4 * time.Minute,
			InferenceTimeout: 20 * time.Minute, MaxHold: 30 * time.Minute})
		h.send("long", 0, "mb=4 ms=600000")
		wait.For(t, time.Minute, "protection on", func() bool { return len(agent.Puts()) == 1 })
		agent.Fail(1<<30, http.StatusInternalServerError, `{"error":{"Code":"ServerException"}}`)
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

// Under load that never stops, protection takes a break after
// TaskProtectionMaxHold, with the message still held, so that a deployment
// waiting for the task is not blocked for ever; after the break it goes back
// on, and the held message is not disturbed.
func TestTaskProtectionTakesBreaksUnderSteadyLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := taskprotecttest.NewAgent(t)
		t0 := time.Now()
		h := start(t, 64*mib, Config{TaskProtection: inMemory(t, agent), TaskProtectionExpiry: 10 * time.Minute,
			TaskProtectionMaxHold: 12 * time.Minute, InferenceTimeout: time.Hour, MaxHold: 2 * time.Hour})
		h.send("long", 0, "mb=4 ms=1800000") // 30 minutes on the device
		wait.For(t, time.Minute, "protection on", func() bool { return len(agent.Puts()) == 1 })
		wait.For(t, 40*time.Minute, "the result", func() bool { live, _ := h.results.Stats(); return live == 1 })
		wait.For(t, 2*time.Minute, "protection off", func() bool {
			puts := agent.Puts()
			return !puts[len(puts)-1].Enabled && puts[len(puts)-1].At.Sub(t0) > 30*time.Minute
		})
		h.shutdown()

		// On at 0, renewed at 5m and 10m; a break at 12m (on for MaxHold);
		// on again at 14m, renewed at 19m and 24m; a break at 26m; on at 28m;
		// done at 30m and off 30 s later.
		var got []string
		for _, p := range agent.Puts() {
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
