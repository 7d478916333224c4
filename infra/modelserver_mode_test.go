package infra_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/zclconf/go-cty/cty"
)

// Issue 34 item 12: settings sized for a GPU subscriber did not fit one in
// front of a model server, whose waits (a rate limit's refill, a daily
// quota) handed messages back, a receive each. They no longer do (issue 32:
// a wait holds the lease, or hands back a fresh copy), so the receive budget
// is the GPU's, and a model server's messages are not dead-lettered by it
// while the server is busy. Fewer messages wait prefetched, each held in
// this task through a pause.
func TestModelServerModeFitsTheReceiveBudget(t *testing.T) {
	m := root(t)
	gpu := receiveCount(t, m, nil)
	for name, o := range map[string]map[string]cty.Value{"sidecar": sidecar(), "external": external()} {
		if got := receiveCount(t, m, o); got != gpu {
			t.Errorf("%s: maxReceiveCount %d; want the GPU's %d: a model server's waits cost no receive", name, got, gpu)
		}
		env := subscriberEnv(t, m, o)
		prefetch, err := strconv.Atoi(env["VRAMQ_PREFETCH"])
		if def := documentedFlags(t, "subscriber")["prefetch"].def; err != nil {
			t.Errorf("%s: VRAMQ_PREFETCH %q, the subscriber's %s: every prefetched message waits here through each pause", name, env["VRAMQ_PREFETCH"], def)
		} else if prefetch > 10 {
			t.Errorf("%s: VRAMQ_PREFETCH %d; want at most one receive's worth (10)", name, prefetch)
		}
		own := with(o, "subscriber_environment", cty.MapVal(map[string]cty.Value{"VRAMQ_PREFETCH": cty.StringVal("4"), "VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS": cty.StringVal("1024")}))
		if got := subscriberEnv(t, m, own)["VRAMQ_PREFETCH"]; got != "4" {
			t.Errorf("%s: VRAMQ_PREFETCH given as 4 in subscriber_environment is %q", name, got)
		}
	}
	if got := subscriberEnv(t, m, nil)["VRAMQ_PREFETCH"]; got != "" {
		t.Errorf("without a model server VRAMQ_PREFETCH is set (%q); the subscriber's default is for a GPU", got)
	}
}

// seconds reads a Go duration the module writes ("880s").
func seconds(t *testing.T, s string) int64 {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return int64(d / time.Second)
}

// At the subscriber's ceiling of output tokens (16,384 by default), a
// generation at the slowest rate allowed for outlasted both the inference
// timeout (120 s) and one request's (-model-server-timeout, 2 minutes): it
// timed out on every attempt and its message went to the DLQ. The module
// sets the request timeout to cover it, and refuses an inference timeout
// that cannot cover it after the longest wait for the server.
func TestModelServerTimeoutsCoverTheLongestGeneration(t *testing.T) {
	m := root(t)
	td := m.resource(t, "aws_ecs_task_definition", "subscriber")
	maxWait := int64(subscriberFlagDefault(t, "model-server-max-wait") / time.Second)
	ceiling, err := strconv.ParseInt(documentedFlags(t, "subscriber")["model-server-max-output-tokens"].def, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	rateVar, ok := m.variables["model_server_min_output_tokens_per_second"]
	if !ok {
		t.Fatal("no variable model_server_min_output_tokens_per_second: nothing says how slow a generation the timeouts must allow for")
	}
	rate := m.number(t, rateVar.Body.Attributes["default"].Expr, nil)
	for _, tc := range []struct {
		name   string
		tokens int64 // 0: the subscriber's default ceiling
		o      map[string]cty.Value
	}{
		{"sidecar, 1024 tokens", 1024, sidecar()},
		{"external, 1024 tokens", 1024, external()},
		{"sidecar, the default ceiling", 0, with(sidecar(), "subscriber_environment", cty.MapValEmpty(cty.String))},
		{"external, 4096 tokens", 4096, with(external(), "subscriber_environment", cty.MapVal(map[string]cty.Value{"VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS": cty.StringVal("4096")}))},
	} {
		tokens := tc.tokens
		if tokens == 0 {
			tokens = ceiling
		}
		generation := (tokens + rate - 1) / rate
		env := subscriberEnv(t, m, tc.o)
		if got := env["VRAMQ_MODEL_SERVER_TIMEOUT"]; got == "" || seconds(t, got) < generation {
			t.Errorf("%s: VRAMQ_MODEL_SERVER_TIMEOUT %q: a generation of %d tokens at %d a second takes %d s, and times out on every attempt", tc.name, got, tokens, rate, generation)
		}
		for _, timeout := range []int64{120, generation + maxWait - 1, generation + maxWait, 1800} {
			o := with(tc.o, "subscriber_inference_timeout_seconds", cty.NumberIntVal(timeout),
				"subscriber_shutdown_grace_seconds", cty.NumberIntVal(max(130, timeout)),
				"subscriber_max_hold_seconds", cty.NumberIntVal(max(900, timeout+60)))
			want := timeout >= generation+maxWait
			if got := allTrue(m.preconditions(t, td, o)); got != want {
				t.Errorf("%s: an inference timeout of %d s passes the plan: %v; want %v (%d tokens at %d a second after a %d s wait: %d s)",
					tc.name, timeout, got, want, tokens, rate, maxWait, generation+maxWait)
			}
		}
	}
	if got := subscriberEnv(t, m, nil)["VRAMQ_MODEL_SERVER_TIMEOUT"]; got != "" {
		t.Errorf("without a model server VRAMQ_MODEL_SERVER_TIMEOUT is set (%q)", got)
	}
}
