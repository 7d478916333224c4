package infra_test

// Issue 27, item 6: the subscriber in front of a model server, run as a
// sidecar of its GPU task or reached elsewhere (variables.tf, "Model
// server"; subscriber.tf).

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/vramq/vramq/internal/envflag"
)

const (
	testSecretARN = "arn:aws:secretsmanager:eu-west-1:111122223333:secret:openai-key-AbCdEf"
	testHFToken   = "arn:aws:secretsmanager:eu-west-1:111122223333:secret:hf-token-a1B2c3"
)

// sidecar is a vLLM sidecar as docs/deployment.md deploys it.
func sidecar() map[string]cty.Value {
	return map[string]cty.Value{
		"model_server_image":   cty.StringVal("vllm/vllm-openai:v0.10.1"),
		"model_server_command": strings2("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-utilization", "0.9"),
		"model_server_models":  strings2("meta-llama/Llama-3.1-8B-Instruct"),
		"model_server_secrets": cty.MapVal(map[string]cty.Value{"HF_TOKEN": cty.StringVal(testHFToken)}),
		// A ceiling of output tokens the default timeouts cover.
		"subscriber_environment": cty.MapVal(map[string]cty.Value{"VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS": cty.StringVal("1024")}),
	}
}

// external is OpenAI, its key in Secrets Manager.
func external() map[string]cty.Value {
	return map[string]cty.Value{
		"model_server_url":                cty.StringVal("https://api.openai.com"),
		"model_server_models":             strings2("gpt-4o-mini", "text-embedding-3-small"),
		"model_server_api_key_secret_arn": cty.StringVal(testSecretARN),
		"subscriber_environment":          cty.MapVal(map[string]cty.Value{"VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS": cty.StringVal("1024")}),
	}
}

func with(o map[string]cty.Value, kv ...any) map[string]cty.Value {
	out := map[string]cty.Value{}
	for k, v := range o {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1].(cty.Value)
	}
	return out
}

// Every variable of the model server is validated: what the subscriber or
// ECS would refuse at start is refused at plan time.
func TestTheModelServerVariablesAreValidated(t *testing.T) {
	m := root(t)
	cases := map[string]struct{ good, bad []cty.Value }{
		"model_server_image": {
			good: []cty.Value{cty.NullVal(cty.String), cty.StringVal("vllm/vllm-openai:v0.10.1"), cty.StringVal("111122223333.dkr.ecr.eu-west-1.amazonaws.com/vllm:1")},
			bad:  []cty.Value{cty.StringVal("vllm openai")},
		},
		"model_server_command": {
			good: []cty.Value{cty.ListValEmpty(cty.String), strings2("--model", "m"), strings2("--model", "m", "--api-key-header", "x")},
			// Issue 34 item 12: a key in the command is plain text in the
			// task definition and the state; VLLM_API_KEY is a secret.
			bad: []cty.Value{strings2("--model", ""), strings2("--model", "m", "--api-key", "sk-1"), strings2("--api-key=sk-1"),
				strings2("vllm serve m --api-key sk-1")},
		},
		"model_server_min_output_tokens_per_second": {
			good: []cty.Value{cty.NumberIntVal(1), cty.NumberIntVal(20), cty.NumberFloatVal(2.5)},
			bad:  []cty.Value{cty.NumberIntVal(0), cty.NumberIntVal(1001)},
		},
		"model_server_shared_memory_size": {
			good: []cty.Value{cty.NumberIntVal(64), cty.NumberIntVal(4096), cty.NumberIntVal(16384)},
			bad:  []cty.Value{cty.NumberIntVal(0), cty.NumberIntVal(63), cty.NumberFloatVal(1024.5)},
		},
		"model_server_weights_volume": {
			good: []cty.Value{cty.NullVal(cty.Object(map[string]cty.Type{"host_path": cty.String, "container_path": cty.String})),
				cty.ObjectVal(map[string]cty.Value{"host_path": cty.StringVal("/var/lib/vramq/weights"), "container_path": cty.StringVal("/root/.cache/huggingface")})},
			bad: []cty.Value{
				cty.ObjectVal(map[string]cty.Value{"host_path": cty.StringVal("weights"), "container_path": cty.StringVal("/root/.cache/huggingface")}),
				cty.ObjectVal(map[string]cty.Value{"host_path": cty.StringVal("/"), "container_path": cty.StringVal("/root/.cache/huggingface")}),
				cty.ObjectVal(map[string]cty.Value{"host_path": cty.StringVal("/w"), "container_path": cty.StringVal("/a:b")}),
			},
		},
		"model_server_port": {
			good: []cty.Value{cty.NumberIntVal(8000), cty.NumberIntVal(8080)},
			bad:  []cty.Value{cty.NumberIntVal(9090), cty.NumberIntVal(80), cty.NumberIntVal(70000), cty.NumberFloatVal(8000.5)},
		},
		"model_server_health_check_command": {
			good: []cty.Value{cty.ListValEmpty(cty.String), strings2("CMD-SHELL", "curl -f http://localhost:8080/health"), strings2("CMD", "/bin/check")},
			bad:  []cty.Value{strings2("curl", "-f", "http://localhost:8080/health")},
		},
		"model_server_health_check_start_period": {
			good: []cty.Value{cty.NumberIntVal(0), cty.NumberIntVal(300)},
			bad:  []cty.Value{cty.NumberIntVal(301), cty.NumberIntVal(-1)},
		},
		"model_server_gpus": {
			good: []cty.Value{cty.NumberIntVal(1), cty.NumberIntVal(4)},
			bad:  []cty.Value{cty.NumberIntVal(0), cty.NumberIntVal(9), cty.NumberFloatVal(1.5)},
		},
		"model_server_environment": {
			good: []cty.Value{cty.MapVal(map[string]cty.Value{"HF_HUB_OFFLINE": cty.StringVal("1")})},
			bad:  []cty.Value{cty.MapVal(map[string]cty.Value{"HF_TOKEN": cty.StringVal("hf_x")}), cty.MapVal(map[string]cty.Value{"VLLM_API_KEY": cty.StringVal("k")})},
		},
		"model_server_secrets": {
			good: []cty.Value{cty.MapVal(map[string]cty.Value{"HF_TOKEN": cty.StringVal(testHFToken), "VLLM_API_KEY": cty.StringVal("arn:aws:ssm:eu-west-1:111122223333:parameter/vllm/key")})},
			bad: []cty.Value{
				cty.MapVal(map[string]cty.Value{"HF_TOKEN": cty.StringVal("arn:aws:secretsmanager:eu-west-1:111122223333:secret:hf-token")}), // partial
				cty.MapVal(map[string]cty.Value{"HF_TOKEN": cty.StringVal("hf_abc")}),
				cty.MapVal(map[string]cty.Value{"1BAD": cty.StringVal(testHFToken)}),
			},
		},
		"model_server_url": {
			good: []cty.Value{cty.NullVal(cty.String), cty.StringVal("https://api.openai.com"), cty.StringVal("http://vllm.internal:8000"), cty.StringVal("https://example.com/openai")},
			bad:  []cty.Value{cty.StringVal("api.openai.com"), cty.StringVal("https://user:key@api.openai.com"), cty.StringVal("https://api.openai.com/?key=x"), cty.StringVal("ftp://x")},
		},
		"model_server_models": {
			good: []cty.Value{cty.ListValEmpty(cty.String), strings2("gpt-4o-mini", "meta-llama/Llama-3.1-8B-Instruct")},
			bad:  []cty.Value{strings2("a,b"), strings2(""), strings2("a b")},
		},
		"model_server_api_key_secret_arn": {
			good: []cty.Value{cty.NullVal(cty.String), cty.StringVal(testSecretARN), cty.StringVal("arn:aws:ssm:eu-west-1:111122223333:parameter/openai/key")},
			bad:  []cty.Value{cty.StringVal("arn:aws:secretsmanager:eu-west-1:111122223333:secret:openai-key"), cty.StringVal("sk-abc")},
		},
	}
	for name := range m.variables {
		if _, ok := cases[name]; strings.HasPrefix(name, "model_server_") && !ok {
			t.Errorf("variable %s: no case in this test", name)
		}
	}
	for name, c := range cases {
		if _, ok := m.variables[name]; !ok {
			t.Errorf("no variable %s", name)
			continue
		}
		for _, v := range c.good {
			if !m.validates(t, name, v) {
				t.Errorf("%s = %#v refused", name, v)
			}
		}
		for _, v := range c.bad {
			if m.validates(t, name, v) {
				t.Errorf("%s = %#v accepted", name, v)
			}
		}
	}
	// The subscriber's own variables for what the module sets.
	for _, env := range []string{"VRAMQ_MODEL_SERVER", "VRAMQ_MODEL_SERVER_MODELS", "VRAMQ_MODEL_SERVER_API_KEY", "VRAMQ_MODEL_SERVER_API_KEY_ENV", "VRAMQ_MODEL_SERVER_API_KEY_FILE"} {
		if m.validates(t, "subscriber_environment", cty.MapVal(map[string]cty.Value{env: cty.StringVal("x")})) {
			t.Errorf("subscriber_environment accepts %s, which the module sets (or which would hold the key in plain text)", env)
		}
	}
	if !m.validates(t, "subscriber_environment", cty.MapVal(map[string]cty.Value{"VRAMQ_MODEL_SERVER_TPM": cty.StringVal("2000000")})) {
		t.Error("subscriber_environment refuses the model server's tuning (VRAMQ_MODEL_SERVER_TPM)")
	}
}

// The two ways are exclusive, and every combination the preconditions
// accept is one the subscriber starts with.
func TestTheModelServerModesAreExclusive(t *testing.T) {
	m := root(t)
	td := m.resource(t, "aws_ecs_task_definition", "subscriber")
	maxWait := subscriberFlagDefault(t, "model-server-max-wait")
	for _, c := range []struct {
		name string
		o    map[string]cty.Value
		want bool
	}{
		{"none", nil, true},
		{"sidecar", sidecar(), true},
		{"external", external(), true},
		{"both", with(sidecar(), "model_server_url", cty.StringVal("https://api.openai.com")), false},
		{"sidecar without models", with(sidecar(), "model_server_models", cty.ListValEmpty(cty.String)), false},
		{"external without models", with(external(), "model_server_models", cty.ListValEmpty(cty.String)), false},
		{"sidecar settings without a sidecar", with(external(), "model_server_command", strings2("--model", "m")), false},
		{"sidecar secrets without a sidecar", with(external(), "model_server_secrets", cty.MapVal(map[string]cty.Value{"HF_TOKEN": cty.StringVal(testHFToken)})), false},
		{"a key without a server", map[string]cty.Value{"model_server_api_key_secret_arn": cty.StringVal(testSecretARN)}, false},
		// -model-server-max-wait must be below -inference-timeout.
		{"inference timeout at the max wait", with(external(), "subscriber_inference_timeout_seconds", cty.NumberIntVal(int64(maxWait.Seconds()))), false},
		{"inference timeout above the max wait", with(external(), "subscriber_inference_timeout_seconds", cty.NumberIntVal(int64(maxWait.Seconds())+1),
			"subscriber_environment", cty.MapVal(map[string]cty.Value{"VRAMQ_MODEL_SERVER_MAX_OUTPUT_TOKENS": cty.StringVal("16")})), true},
		{"inference timeout at the max wait, no model server", map[string]cty.Value{"subscriber_inference_timeout_seconds": cty.NumberIntVal(int64(maxWait.Seconds()))}, true},
	} {
		if got := allTrue(m.preconditions(t, td, c.o)); got != c.want {
			t.Errorf("%s: the preconditions pass %v, want %v", c.name, got, c.want)
		}
	}
}

// The sidecar: the task's GPUs, a health check, and the subscriber waiting
// for it to be healthy, pointed at it on localhost.
func TestTheModelServerSidecarIsHealthyBeforeTheSubscriber(t *testing.T) {
	m := root(t)
	if got := keys(containers(t, m, "subscriber", nil)); len(got) != 1 {
		t.Fatalf("without a model server the task has containers %v, want the subscriber alone", got)
	}
	o := sidecar()
	cs := containers(t, m, "subscriber", o)
	if len(cs) != 2 {
		t.Fatalf("with model_server_image the task has containers %v, want the subscriber and the model server", sorted(keys(cs)))
	}
	sub := cs["subscriber"]
	var server cty.Value
	var serverName string
	for name, c := range cs {
		if name != "subscriber" {
			server, serverName = c, name
		}
	}
	if !server.GetAttr("image").RawEquals(o["model_server_image"]) || !server.GetAttr("essential").True() {
		t.Errorf("the sidecar %s: image %#v, essential %#v", serverName, server.GetAttr("image"), server.GetAttr("essential"))
	}
	if !server.GetAttr("command").RawEquals(cty.TupleVal(o["model_server_command"].AsValueSlice())) && !server.GetAttr("command").RawEquals(o["model_server_command"]) {
		t.Errorf("the sidecar's command is %#v, want model_server_command", server.GetAttr("command"))
	}

	// Its health check, without which HEALTHY never comes.
	if !server.Type().HasAttribute("healthCheck") || server.GetAttr("healthCheck").IsNull() {
		t.Fatal("the sidecar has no health check: the subscriber's dependsOn HEALTHY would never be met")
	}
	hc := server.GetAttr("healthCheck")
	cmd := hc.GetAttr("command").AsValueSlice()
	if len(cmd) < 2 || !slices.Contains([]string{"CMD", "CMD-SHELL"}, cmd[0].AsString()) || !strings.Contains(cmd[1].AsString(), "localhost:8000/health") {
		t.Errorf("the sidecar's health check %#v does not ask /health on its port", hc.GetAttr("command"))
	}
	if own := with(o, "model_server_health_check_command", strings2("CMD", "/check")); !containers(t, m, "subscriber", own)[serverName].GetAttr("healthCheck").GetAttr("command").RawEquals(cty.TupleVal(strings2("CMD", "/check").AsValueSlice())) &&
		!containers(t, m, "subscriber", own)[serverName].GetAttr("healthCheck").GetAttr("command").RawEquals(strings2("CMD", "/check")) {
		t.Error("model_server_health_check_command is not the sidecar's health check")
	}
	start, interval, retries := toInt(t, hc.GetAttr("startPeriod")), toInt(t, hc.GetAttr("interval")), toInt(t, hc.GetAttr("retries"))
	if start != 300 || interval < 5 || interval > 300 || retries < 1 || retries > 10 {
		t.Errorf("the sidecar's health check: startPeriod %d (want model_server_health_check_start_period), interval %d, retries %d: outside what ECS takes", start, interval, retries)
	}
	if st := toInt(t, server.GetAttr("startTimeout")); st < start+interval*retries {
		t.Errorf("the sidecar's startTimeout %ds ends before its health check can first fail for good (%ds): the subscriber gives up on a server still loading", st, start+interval*retries)
	}

	// The subscriber waits for it.
	deps := sub.GetAttr("dependsOn")
	if deps.IsNull() || deps.LengthInt() != 1 {
		t.Fatalf("the subscriber's dependsOn is %#v, want the model server HEALTHY", deps)
	}
	d := deps.AsValueSlice()[0]
	if d.GetAttr("containerName").AsString() != serverName || d.GetAttr("condition").AsString() != "HEALTHY" {
		t.Errorf("the subscriber depends on %#v, want %s HEALTHY", d, serverName)
	}
	if !sub.GetAttr("dependsOn").RawEquals(cty.NullVal(sub.GetAttr("dependsOn").Type())) && containers(t, m, "subscriber", nil)["subscriber"].GetAttr("dependsOn").IsKnown() &&
		!containers(t, m, "subscriber", nil)["subscriber"].GetAttr("dependsOn").IsNull() {
		t.Error("without a sidecar the subscriber still depends on one")
	}

	// The GPUs are the server's; the subscriber sends HTTP.
	if gpus(server) != 1 {
		t.Errorf("the sidecar has %d GPUs, want model_server_gpus (1)", gpus(server))
	}
	if n := gpus(containers(t, m, "subscriber", with(o, "model_server_gpus", cty.NumberIntVal(4)))[serverName]); n != 4 {
		t.Errorf("model_server_gpus = 4: the sidecar has %d GPUs", n)
	}
	if gpus(sub) != 0 {
		t.Errorf("the subscriber container asks for %d GPUs beside the sidecar; ECS gives a GPU to one container", gpus(sub))
	}
	if gpus(containers(t, m, "subscriber", nil)["subscriber"]) != 1 {
		t.Error("without a model server the subscriber has no GPU")
	}

	// Pointed at it; with no -device, which -model-server refuses.
	env := subscriberEnv(t, m, o)
	if env["VRAMQ_MODEL_SERVER"] != "http://localhost:8000" || env["VRAMQ_MODEL_SERVER_MODELS"] != "meta-llama/Llama-3.1-8B-Instruct" {
		t.Errorf("the subscriber's VRAMQ_MODEL_SERVER = %q, VRAMQ_MODEL_SERVER_MODELS = %q", env["VRAMQ_MODEL_SERVER"], env["VRAMQ_MODEL_SERVER_MODELS"])
	}
	if e := subscriberEnv(t, m, with(o, "model_server_port", cty.NumberIntVal(8080))); e["VRAMQ_MODEL_SERVER"] != "http://localhost:8080" {
		t.Errorf("model_server_port = 8080: VRAMQ_MODEL_SERVER = %q", e["VRAMQ_MODEL_SERVER"])
	}
	if d, ok := env["VRAMQ_DEVICE"]; ok && d != "auto" {
		t.Errorf("with a model server the subscriber gets VRAMQ_DEVICE=%s, and exits at start (-model-server and -device)", d)
	}
	if subscriberEnv(t, m, nil)["VRAMQ_DEVICE"] != "cuda:0" {
		t.Error("without a model server the subscriber lost its VRAMQ_DEVICE")
	}

	// The sidecar's token is a secret, read by the execution role.
	sec := server.GetAttr("secrets")
	if sec.IsNull() || sec.LengthInt() != 1 || sec.AsValueSlice()[0].GetAttr("name").AsString() != "HF_TOKEN" || sec.AsValueSlice()[0].GetAttr("valueFrom").AsString() != testHFToken {
		t.Errorf("the sidecar's secrets are %#v, want HF_TOKEN from %s", sec, testHFToken)
	}
	if arns := executionSecretARNs(t, m, o); !slices.Equal(arns, []string{testHFToken}) {
		t.Errorf("the subscriber's execution role reads %v, want the sidecar's secret", arns)
	}
	// An image in ECR: pull rights on it too.
	ecr := with(o, "model_server_image", cty.StringVal("111122223333.dkr.ecr.eu-west-1.amazonaws.com/vllm-openai:v0.10.1"),
		"subscriber_image", cty.StringVal("111122223333.dkr.ecr.eu-west-1.amazonaws.com/vramq-subscriber:v1"))
	images := m.eval(t, m.locals["ecs_services"].Expr, ecr).GetAttr("subscriber").GetAttr("images")
	if !images.IsKnown() || images.LengthInt() != 2 || !images.AsValueSlice()[1].RawEquals(ecr["model_server_image"]) {
		t.Errorf("the subscriber's execution role pulls %#v, want the subscriber's and the model server's images", images)
	}
	if images := m.eval(t, m.locals["ecs_services"].Expr, map[string]cty.Value{"subscriber_image": ecr["subscriber_image"]}).GetAttr("subscriber").GetAttr("images"); !images.IsKnown() || images.LengthInt() != 1 {
		t.Errorf("without a sidecar the subscriber's execution role pulls %#v", images)
	}
	pulls := false
	_ = hclsyntax.VisitAll(m.locals["ecr_repository_arns"].Expr, func(n hclsyntax.Node) hcl.Diagnostics {
		if e, ok := n.(*hclsyntax.ScopeTraversalExpr); ok && len(e.Traversal) > 1 {
			if a, ok := e.Traversal[1].(hcl.TraverseAttr); ok && a.Name == "images" {
				pulls = true
			}
		}
		return nil
	})
	if !pulls {
		t.Error("local.ecr_repository_arns does not read each service's images")
	}
}

func gpus(c cty.Value) int64 {
	rr := c.GetAttr("resourceRequirements")
	if rr.IsNull() {
		return 0
	}
	var n int64
	for _, r := range rr.AsValueSlice() {
		if r.GetAttr("type").AsString() == "GPU" {
			v, err := strconv.ParseInt(r.GetAttr("value").AsString(), 10, 64)
			if err != nil {
				panic(err)
			}
			n += v
		}
	}
	return n
}

// executionSecretARNs are the secrets the subscriber's execution role reads.
func executionSecretARNs(t *testing.T, m *module, o map[string]cty.Value) []string {
	t.Helper()
	sub := m.eval(t, m.locals["ecs_services"].Expr, o).GetAttr("subscriber").GetAttr("secret_arns")
	var out []string
	for _, v := range sub.AsValueSlice() {
		out = append(out, v.AsString())
	}
	return out
}

// An external endpoint: its URL and models, its key from Secrets Manager in
// the container's secrets (never its environment) under the name the
// subscriber reads, its port open.
func TestTheExternalModelServerKeyIsASecret(t *testing.T) {
	m := root(t)
	o := external()
	if cs := containers(t, m, "subscriber", o); len(cs) != 1 {
		t.Errorf("an external model server adds containers: %v", sorted(keys(cs)))
	}
	sub := subscriberContainer(t, m, o)
	env := subscriberEnv(t, m, o)
	if env["VRAMQ_MODEL_SERVER"] != "https://api.openai.com" || env["VRAMQ_MODEL_SERVER_MODELS"] != "gpt-4o-mini,text-embedding-3-small" {
		t.Errorf("VRAMQ_MODEL_SERVER = %q, VRAMQ_MODEL_SERVER_MODELS = %q", env["VRAMQ_MODEL_SERVER"], env["VRAMQ_MODEL_SERVER_MODELS"])
	}
	for k, v := range env {
		if strings.Contains(v, testSecretARN) || strings.Contains(k, "API_KEY") {
			t.Errorf("the subscriber's environment holds %s=%s", k, v)
		}
	}
	if gpus(sub) != 0 {
		t.Error("with an external model server the subscriber still takes a GPU")
	}
	// The secret's name is what -model-server-api-key-env reads by default.
	keyEnv := documentedFlags(t, "subscriber")["model-server-api-key-env"].def
	if keyEnv == "" {
		t.Fatal("cmd/subscriber has no -model-server-api-key-env default")
	}
	found := false
	if sec := sub.GetAttr("secrets"); !sec.IsNull() {
		for _, s := range sec.AsValueSlice() {
			if s.GetAttr("name").AsString() == keyEnv && s.GetAttr("valueFrom").AsString() == testSecretARN {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("the subscriber's container has no secret %s from %s: %#v", keyEnv, testSecretARN, sub.GetAttr("secrets"))
	}
	if !subscriberContainer(t, m, nil).GetAttr("secrets").IsNull() {
		t.Error("without a key the subscriber's container has secrets")
	}
	if arns := executionSecretARNs(t, m, o); !slices.Equal(arns, []string{testSecretARN}) {
		t.Errorf("the subscriber's execution role reads %v, want exactly the key's secret", arns)
	}
	if arns := executionSecretARNs(t, m, nil); len(arns) != 0 {
		t.Errorf("without a model server the execution role reads %v", arns)
	}

	// The URL's port, opened where it is not 443.
	for url, want := range map[string]int64{"https://api.openai.com": 443, "http://vllm.internal:8000": 8000, "http://vllm.internal/v1": 80, "https://x.example:8443/": 8443} {
		if got := m.number(t, m.locals["model_server_url_port"].Expr, with(o, "model_server_url", cty.StringVal(url))); got != want {
			t.Errorf("model_server_url = %s: port %d, want %d", url, got, want)
		}
	}
}

// What the module and the docs set for the subscriber are its flags: the
// environment it writes, the names it refuses in subscriber_environment and
// the -model-server flags docs/deployment.md and README.md use.
func TestTheModelServerFlagsExist(t *testing.T) {
	m := root(t)
	flags := documentedFlags(t, "subscriber")
	envs := map[string]bool{}
	for name, f := range flags {
		envs[f.env] = true
		if envflag.Name(name) != f.env {
			t.Errorf("-%s: documented variable %s, envflag says %s", name, f.env, envflag.Name(name))
		}
	}
	for _, o := range []map[string]cty.Value{sidecar(), external()} {
		for name := range subscriberEnv(t, m, o) {
			if !envs[name] {
				t.Errorf("the subscriber task sets %s, which no flag of cmd/subscriber reads", name)
			}
		}
	}
	for _, f := range []string{"model-server", "model-server-models", "model-server-api-key-env", "model-server-api-key-file", "model-server-max-wait"} {
		if _, ok := flags[f]; !ok {
			t.Errorf("cmd/subscriber has no -%s, which the module relies on", f)
		}
	}
	flagRef := regexp.MustCompile("`-(model-server(?:-[a-z]+)*)")
	envRef := regexp.MustCompile(`\bVRAMQ_MODEL_SERVER(?:_[A-Z]+)*`)
	for _, path := range []string{"../docs/deployment.md", "../README.md", "variables.tf", "README.md", "examples/complete/main.tf"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mm := range flagRef.FindAllStringSubmatch(string(b), -1) {
			n++
			if _, ok := flags[mm[1]]; !ok {
				t.Errorf("%s names -%s, which cmd/subscriber does not have", path, mm[1])
			}
		}
		for _, e := range envRef.FindAllString(string(b), -1) {
			n++
			if !envs[e] && e != "VRAMQ_MODEL_SERVER_API_KEY" {
				t.Errorf("%s names %s, which no flag of cmd/subscriber reads", path, e)
			}
		}
		if n == 0 {
			t.Errorf("%s says nothing of the subscriber's -model-server flags", path)
		}
	}
}
