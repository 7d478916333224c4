package infra_test

// These tests read the Terraform in infra/ the way a reviewer would and fail
// when it drifts from what the Go code needs: they parse every .tf file with
// hcl/v2, evaluate what can be evaluated from the variables' defaults (a
// resource's attributes stay unknown), and compare with the queue
// definitions in localstack/queues.json and the subscriber's own flags. No
// provider is needed, so they run wherever go test runs; terraform validate
// needs a networked machine (make infra-validate).

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"

	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/localstack"
)

// ---------------------------------------------------------------------------
// The invariants
// ---------------------------------------------------------------------------

func TestEveryVariableHasATypeAndADescription(t *testing.T) {
	for _, m := range modules(t) {
		if len(m.variables) == 0 {
			t.Errorf("%s: no variables at all; did the parse find the files?", m.dir)
		}
		for name, b := range m.variables {
			if _, ok := b.Body.Attributes["type"]; !ok {
				t.Errorf("%s: variable %q has no type", m.dir, name)
			}
			d, ok := b.Body.Attributes["description"]
			if !ok {
				t.Errorf("%s: variable %q has no description", m.dir, name)
				continue
			}
			if v := m.eval(t, d.Expr, nil); !v.IsKnown() || v.Type() != cty.String || strings.TrimSpace(v.AsString()) == "" {
				t.Errorf("%s: variable %q: the description is empty or not a plain string", m.dir, name)
			}
		}
	}
}

func TestEveryReferenceResolves(t *testing.T) {
	for _, m := range modules(t) {
		for _, tr := range m.traversals() {
			root := tr.RootName()
			name := func(i int) string {
				if len(tr) <= i {
					return ""
				}
				if a, ok := tr[i].(hcl.TraverseAttr); ok {
					return a.Name
				}
				return ""
			}
			var ok bool
			switch {
			case root == "var":
				_, ok = m.variables[name(1)]
			case root == "local":
				_, ok = m.locals[name(1)]
			case root == "data":
				_, ok = m.data[name(1)+"."+name(2)]
			case strings.HasPrefix(root, "aws_"):
				_, ok = m.resources[root+"."+name(1)]
			default:
				continue // path, each, count, module, dynamic iterators, for variables
			}
			if !ok {
				t.Errorf("%s: %s: reference to something not declared", m.dir, tr.SourceRange())
			}
		}
	}
}

func TestEveryQueueIsEncryptedAndTLSOnly(t *testing.T) {
	m := root(t)
	queues := m.resourcesOf("aws_sqs_queue")
	if len(queues) != 3 {
		t.Fatalf("want the 3 queues of queues.json, found %d aws_sqs_queue resources", len(queues))
	}
	for name, b := range queues {
		sse := m.attr(t, b, "sqs_managed_sse_enabled", nil)
		kms := m.attr(t, b, "kms_master_key_id", nil)
		if !(sse.IsKnown() && sse.Type() == cty.Bool && sse.True()) && (kms.IsNull() || !kms.IsKnown()) {
			t.Errorf("aws_sqs_queue.%s: no encryption with the default variables (sqs_managed_sse_enabled = %#v, kms_master_key_id = %#v)", name, sse, kms)
		}
		// With a KMS key, the key and only the key.
		key := cty.StringVal("arn:aws:kms:eu-west-1:111122223333:key/test")
		sse = m.attr(t, b, "sqs_managed_sse_enabled", map[string]cty.Value{"kms_key_arn": key})
		kms = m.attr(t, b, "kms_master_key_id", map[string]cty.Value{"kms_key_arn": key})
		if !kms.RawEquals(key) || !(sse.IsNull() || sse.False()) {
			t.Errorf("aws_sqs_queue.%s with kms_key_arn: kms_master_key_id = %#v, sqs_managed_sse_enabled = %#v; want the key, and SSE-SQS off", name, kms, sse)
		}
	}

	covered := map[string]bool{}
	for name, b := range m.resourcesOf("aws_sqs_queue_policy") {
		if !m.deniesInsecureTransport(t, b) {
			t.Errorf("aws_sqs_queue_policy.%s: its policy document has no Deny on aws:SecureTransport = false", name)
			continue
		}
		for _, tr := range m.deepTraversals(b.Body.Attributes["queue_url"], b.Body.Attributes["for_each"]) {
			if tr.RootName() == "aws_sqs_queue" {
				covered[tr[1].(hcl.TraverseAttr).Name] = true
			}
		}
	}
	for name := range queues {
		if !covered[name] {
			t.Errorf("aws_sqs_queue.%s: no queue policy denying non-TLS access covers it", name)
		}
	}
}

func TestTheBucketIsEncryptedPrivateAndTLSOnly(t *testing.T) {
	m := root(t)
	if len(m.resourcesOf("aws_s3_bucket")) != 1 {
		t.Fatalf("want one aws_s3_bucket (the payload bucket)")
	}
	for _, typ := range []string{"aws_s3_bucket_server_side_encryption_configuration", "aws_s3_bucket_public_access_block", "aws_s3_bucket_ownership_controls", "aws_s3_bucket_lifecycle_configuration"} {
		if len(m.resourcesOf(typ)) != 1 {
			t.Errorf("the payload bucket has no %s", typ)
		}
	}
	for name, b := range m.resourcesOf("aws_s3_bucket_public_access_block") {
		for _, a := range []string{"block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"} {
			if v := m.attr(t, b, a, nil); !v.IsKnown() || v.IsNull() || !v.True() {
				t.Errorf("aws_s3_bucket_public_access_block.%s: %s is not true", name, a)
			}
		}
	}
	policies := m.resourcesOf("aws_s3_bucket_policy")
	if len(policies) != 1 {
		t.Fatalf("want one aws_s3_bucket_policy, found %d", len(policies))
	}
	for name, b := range policies {
		if !m.deniesInsecureTransport(t, b) {
			t.Errorf("aws_s3_bucket_policy.%s: no Deny on aws:SecureTransport = false", name)
		}
	}
	// Every prefix of the bucket layout (internal/payload) expires.
	days := m.eval(t, m.variables["payload_expiration_days"].Body.Attributes["default"].Expr, nil)
	for _, prefix := range []string{"payloads", "jobs", "idempotency", "results", "failed"} {
		if !days.Type().IsObjectType() || !days.Type().HasAttribute(prefix) {
			t.Errorf("payload_expiration_days has no default for %s/", prefix)
		}
	}
}

func TestTheWorkQueueRedrivesToTheDLQ(t *testing.T) {
	m := root(t)
	work := m.resource(t, "aws_sqs_queue", "work")
	policy := m.jsonencoded(t, work, "redrive_policy")
	if policy == nil {
		t.Fatal("aws_sqs_queue.work has no redrive_policy = jsonencode({...})")
	}
	if !refersTo(m.itemExpr(policy, "deadLetterTargetArn"), "aws_sqs_queue", "dlq") {
		t.Errorf("aws_sqs_queue.work: the redrive policy's deadLetterTargetArn is not aws_sqs_queue.dlq.arn")
	}
	if n := m.number(t, m.itemExpr(policy, "maxReceiveCount"), nil); n < 1 {
		t.Errorf("aws_sqs_queue.work: maxReceiveCount %d", n)
	}
	for _, name := range []string{"results", "dlq"} {
		if _, ok := m.resource(t, "aws_sqs_queue", name).Body.Attributes["redrive_policy"]; ok {
			t.Errorf("aws_sqs_queue.%s has a redrive policy; queues.json gives one to the work queue only", name)
		}
	}
}

func TestTheVisibilityTimeoutOutlastsTheHeartbeat(t *testing.T) {
	m := root(t)
	queueVisibility := time.Duration(m.number(t, m.resource(t, "aws_sqs_queue", "work").Body.Attributes["visibility_timeout_seconds"].Expr, nil)) * time.Second

	// The subscriber heartbeats every third of its own -visibility-timeout:
	// the task's VRAMQ_VISIBILITY_TIMEOUT, or the flag's default.
	subscriberVisibility := subscriberFlagDefault(t, "visibility-timeout")
	if v, ok := subscriberEnv(t, m, nil)["VRAMQ_VISIBILITY_TIMEOUT"]; ok {
		subscriberVisibility = parseDuration(t, "VRAMQ_VISIBILITY_TIMEOUT", v)
	}
	heartbeat := subscriberVisibility / 3
	if queueVisibility <= heartbeat {
		t.Errorf("the work queue's visibility timeout %v is not longer than the subscriber's heartbeat interval %v (a third of %v)", queueVisibility, heartbeat, subscriberVisibility)
	}
	if subscriberVisibility < 3*time.Second {
		t.Errorf("the subscriber's visibility timeout %v is below its minimum of 3s", subscriberVisibility)
	}
	// A long poll longer than SQS allows fails every receive.
	if wait, ok := subscriberEnv(t, m, nil)["VRAMQ_WAIT_TIME"]; ok && parseDuration(t, "VRAMQ_WAIT_TIME", wait) > 20*time.Second {
		t.Errorf("VRAMQ_WAIT_TIME %s is longer than the SQS maximum of 20s", wait)
	}
}

func TestTheStopTimeoutCoversTheShutdownGrace(t *testing.T) {
	m := root(t)
	// The default (-1 here), and the extremes the variable's validation allows.
	for _, grace := range []int64{-1, 0, 90} {
		var override map[string]cty.Value
		if grace >= 0 {
			override = map[string]cty.Value{"subscriber_shutdown_grace_seconds": cty.NumberIntVal(grace)}
		}
		setting := "the default subscriber_shutdown_grace_seconds"
		if grace >= 0 {
			setting = fmt.Sprintf("subscriber_shutdown_grace_seconds=%d", grace)
		}
		def := subscriberContainer(t, m, override)
		if !def.Type().IsObjectType() || !def.Type().HasAttribute("stopTimeout") || !def.GetAttr("stopTimeout").IsKnown() {
			t.Fatalf("the subscriber's container definition has no stopTimeout that evaluates from the variables")
		}
		stop := toInt(t, def.GetAttr("stopTimeout"))
		shutdownGrace := subscriberFlagDefault(t, "shutdown-grace")
		if v, ok := subscriberEnv(t, m, override)["VRAMQ_SHUTDOWN_GRACE"]; ok {
			shutdownGrace = parseDuration(t, "VRAMQ_SHUTDOWN_GRACE", v)
		}
		if time.Duration(stop)*time.Second < shutdownGrace {
			t.Errorf("%s: stopTimeout %ds is shorter than the subscriber's shutdown grace %v: ECS would SIGKILL batches it may finish", setting, stop, shutdownGrace)
		}
		if stop > 120 {
			t.Errorf("%s: stopTimeout %ds is over the ECS maximum of 120s", setting, stop)
		}
	}
}

func TestTheSubscriberEnvironmentNamesRealFlags(t *testing.T) {
	m := root(t)
	names := map[string]bool{}
	for _, f := range subscriberFlags(t) {
		names[envflag.Name(f)] = true
	}
	env := subscriberEnv(t, m, nil)
	for _, want := range []string{"QUEUE_URL", "RESULTS_QUEUE_URL", "DLQ_URL", "PAYLOAD_BUCKET", "VRAMQ_LOG_FORMAT", "VRAMQ_SHUTDOWN_GRACE"} {
		if _, ok := env[want]; !ok {
			t.Errorf("the subscriber task does not set %s", want)
		}
	}
	for name := range env {
		if !names[name] {
			t.Errorf("the subscriber task sets %s, which no flag of cmd/subscriber reads", name)
		}
	}
	if env["VRAMQ_LOG_FORMAT"] != "json" {
		t.Errorf("VRAMQ_LOG_FORMAT = %q: the OOM-retries metric filter reads JSON logs", env["VRAMQ_LOG_FORMAT"])
	}
}

// In Lambda mode the stage throttles the whole API with the variables, which
// refuse values that would shut it (0) or that API Gateway does not take.
func TestThePublisherAPIIsThrottled(t *testing.T) {
	m := root(t)
	stage := m.resource(t, "aws_apigatewayv2_stage", "publisher")
	var settings *hclsyntax.Block
	for _, b := range stage.Body.Blocks {
		if b.Type == "default_route_settings" {
			settings = b
		}
	}
	if settings == nil {
		t.Fatal("aws_apigatewayv2_stage.publisher has no default_route_settings: the API is not throttled")
	}
	for attr, variable := range map[string]string{"throttling_rate_limit": "publisher_throttling_rate_limit", "throttling_burst_limit": "publisher_throttling_burst_limit"} {
		a, ok := settings.Body.Attributes[attr]
		if !ok || !refersTo(a.Expr, "var", variable) {
			t.Errorf("default_route_settings.%s is not var.%s", attr, variable)
			continue
		}
		if n := m.number(t, a.Expr, nil); n < 1 {
			t.Errorf("default_route_settings.%s = %d with the defaults: want at least 1", attr, n)
		}
		for _, tc := range []struct {
			v  cty.Value
			ok bool
		}{{cty.NumberIntVal(0), false}, {cty.NumberIntVal(-5), false}, {cty.NumberIntVal(50), true}} {
			if got := m.validates(t, variable, tc.v); got != tc.ok {
				t.Errorf("var.%s = %s: validation passes %v, want %v", variable, tc.v.AsBigFloat(), got, tc.ok)
			}
		}
	}
}

// In Fargate mode the publisher reads the client's address from the load
// balancer's X-Forwarded-For, trusting the VPC's addresses; that is sound
// only because the tasks take connections from the balancer alone.
func TestThePublisherTrustsOnlyItsLoadBalancer(t *testing.T) {
	m := root(t)
	fargate := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate")}
	td := m.resource(t, "aws_ecs_task_definition", "publisher")
	found := false
	for _, tr := range m.deepTraversals(td.Body.Attributes["container_definitions"]) {
		if tr.RootName() == "data" && len(tr) > 1 && tr[1].(hcl.TraverseAttr).Name == "aws_vpc" {
			found = true
		}
	}
	env := containerEnv(t, m, "publisher", fargate)
	if _, ok := env["VRAMQ_TRUSTED_PROXIES"]; !ok || !found {
		t.Errorf("the publisher task does not set VRAMQ_TRUSTED_PROXIES from the VPC (env %v)", keys(env))
	}
	if !slices.Contains(flagNames(t, "publisher"), "trusted-proxies") {
		t.Error("cmd/publisher has no -trusted-proxies flag for VRAMQ_TRUSTED_PROXIES")
	}
	// A value given in publisher_environment wins.
	override := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"),
		"publisher_environment": cty.MapVal(map[string]cty.Value{"VRAMQ_TRUSTED_PROXIES": cty.StringVal("10.9.0.0/16")})}
	if v := containerEnv(t, m, "publisher", override)["VRAMQ_TRUSTED_PROXIES"]; v != "10.9.0.0/16" {
		t.Errorf("VRAMQ_TRUSTED_PROXIES in publisher_environment: the task has %q", v)
	}

	sg := m.resource(t, "aws_security_group", "publisher_tasks")
	ingress := 0
	for _, b := range sg.Body.Blocks {
		if b.Type != "ingress" {
			continue
		}
		ingress++
		if _, ok := b.Body.Attributes["cidr_blocks"]; ok {
			t.Errorf("%s: the publisher tasks take connections from CIDR blocks, not only from the load balancer", b.DefRange())
		}
		if a, ok := b.Body.Attributes["security_groups"]; !ok || !refersTo(a.Expr, "aws_security_group", "publisher_alb") {
			t.Errorf("%s: an ingress rule of the publisher tasks that is not from the load balancer's security group", b.DefRange())
		}
	}
	if ingress == 0 {
		t.Error("aws_security_group.publisher_tasks has no ingress block")
	}
}

// validates reports whether var.name = v passes the variable's validation
// blocks.
func (m *module) validates(t *testing.T, name string, v cty.Value) bool {
	t.Helper()
	b, ok := m.variables[name]
	if !ok {
		t.Fatalf("no variable %q", name)
	}
	checked := false
	for _, vb := range b.Body.Blocks {
		if vb.Type != "validation" {
			continue
		}
		checked = true
		c := m.eval(t, vb.Body.Attributes["condition"].Expr, map[string]cty.Value{name: v})
		if !c.IsKnown() || c.IsNull() || c.False() {
			return false
		}
	}
	if !checked {
		t.Errorf("variable %q has no validation", name)
	}
	return true
}

func TestNoIAMStatementAllowsAWildcard(t *testing.T) {
	checked := 0
	for _, m := range modules(t) {
		for name, b := range m.data {
			if !strings.HasPrefix(name, "aws_iam_policy_document.") {
				continue
			}
			for _, st := range statements(b.Body) {
				checked++
				m.checkStatement(t, name, st)
			}
		}
		// Every policy goes through a policy document, so the check above
		// sees every statement; AWS managed policies attached must not be
		// about SQS or S3.
		for name, b := range m.resources {
			if a, ok := b.Body.Attributes["policy"]; ok && !refersTo(a.Expr, "data", "aws_iam_policy_document") {
				t.Errorf("%s: %s: policy is not a data.aws_iam_policy_document, so its statements go unchecked", m.dir, name)
			}
			if a, ok := b.Body.Attributes["policy_arn"]; ok {
				if arn := literalText(a.Expr); regexp.MustCompile(`(?i)sqs|s3|fullaccess|administrator|poweruser`).MatchString(arn) {
					t.Errorf("%s: %s attaches %s: grant SQS and S3 in a statement of its own", m.dir, name, arn)
				}
			}
		}
	}
	if checked < 10 {
		t.Errorf("only %d statements checked; the parse missed some", checked)
	}
}

func TestTheQueuesMatchTheLocalDefinitions(t *testing.T) {
	m := root(t)
	defs := localstack.Definitions()
	// The provider's defaults for what a resource leaves out (its
	// max_message_size default is the old 256 KiB), and SQS's for what
	// queues.json leaves out.
	providerDefault := map[string]int64{"DelaySeconds": 0, "VisibilityTimeout": 30, "MaximumMessageSize": 262144, "MessageRetentionPeriod": 345600, "ReceiveMessageWaitTimeSeconds": 0}
	sqsDefault := map[string]int64{"DelaySeconds": 0, "VisibilityTimeout": 30, "MaximumMessageSize": 1048576, "MessageRetentionPeriod": 345600, "ReceiveMessageWaitTimeSeconds": 0}
	tfName := map[string]string{
		"DelaySeconds": "delay_seconds", "VisibilityTimeout": "visibility_timeout_seconds", "MaximumMessageSize": "max_message_size",
		"MessageRetentionPeriod": "message_retention_seconds", "ReceiveMessageWaitTimeSeconds": "receive_wait_time_seconds",
	}
	for _, role := range []string{localstack.RoleWork, localstack.RoleResults, localstack.RoleDLQ} {
		def, _ := defs.Role(role)
		b := m.resource(t, "aws_sqs_queue", role)

		for prefix, want := range map[string]string{"": def.Name, "dev-": "dev-" + def.Name} {
			got := m.attr(t, b, "name", map[string]cty.Value{"name_prefix": cty.StringVal(prefix)})
			if !got.IsKnown() || got.AsString() != want {
				t.Errorf("aws_sqs_queue.%s with name_prefix %q: name %#v, queues.json (with bin/queues -prefix) says %q", role, prefix, got, want)
			}
		}
		for attr, tf := range tfName {
			want := sqsDefault[attr]
			if s, in := def.Attributes[attr]; in {
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					t.Fatalf("queues.json %s %s = %q", role, attr, s)
				}
				want = n
			}
			got := providerDefault[attr]
			if a, in := b.Body.Attributes[tf]; in {
				got = m.number(t, a.Expr, nil)
			}
			if got != want {
				t.Errorf("aws_sqs_queue.%s: %s = %d, queues.json (or SQS's default) says %s = %d", role, tf, got, attr, want)
			}
		}

		policy := m.jsonencoded(t, b, "redrive_policy")
		switch p := def.RedrivePolicy; {
		case p == nil && policy != nil:
			t.Errorf("aws_sqs_queue.%s has a redrive policy queues.json does not", role)
		case p != nil && policy == nil:
			t.Errorf("aws_sqs_queue.%s has no redrive policy; queues.json has one to %s", role, p.DeadLetterQueue)
		case p != nil:
			if !refersTo(m.itemExpr(policy, "deadLetterTargetArn"), "aws_sqs_queue", p.DeadLetterQueue) {
				t.Errorf("aws_sqs_queue.%s redrives elsewhere than aws_sqs_queue.%s", role, p.DeadLetterQueue)
			}
			if got := m.number(t, m.itemExpr(policy, "maxReceiveCount"), nil); got != int64(p.MaxReceiveCount) {
				t.Errorf("aws_sqs_queue.%s: maxReceiveCount %d, queues.json says %d", role, got, p.MaxReceiveCount)
			}
		}

		var allow *hclsyntax.ObjectConsExpr
		for _, rb := range m.resourcesOf("aws_sqs_queue_redrive_allow_policy") {
			if refersTo(rb.Body.Attributes["queue_url"].Expr, "aws_sqs_queue", role) {
				allow = m.jsonencoded(t, rb, "redrive_allow_policy")
			}
		}
		if a, ok := b.Body.Attributes["redrive_allow_policy"]; ok && allow == nil {
			allow = jsonencodeArg(a.Expr)
		}
		switch p := def.RedriveAllowPolicy; {
		case p == nil && allow != nil:
			t.Errorf("aws_sqs_queue.%s has a redrive-allow policy queues.json does not", role)
		case p != nil && allow == nil:
			t.Errorf("aws_sqs_queue.%s has no redrive-allow policy; queues.json says %s", role, p.RedrivePermission)
		case p != nil:
			if got := m.eval(t, m.itemExpr(allow, "redrivePermission"), nil); !got.RawEquals(cty.StringVal(p.RedrivePermission)) {
				t.Errorf("aws_sqs_queue.%s: redrivePermission %#v, queues.json says %q", role, got, p.RedrivePermission)
			}
			var sources []string
			if e := m.itemExpr(allow, "sourceQueueArns"); e != nil {
				for _, tr := range e.Variables() {
					if tr.RootName() == "aws_sqs_queue" {
						sources = append(sources, tr[1].(hcl.TraverseAttr).Name)
					}
				}
			}
			if !slices.Equal(sorted(sources), sorted(p.SourceQueues)) {
				t.Errorf("aws_sqs_queue.%s: redrive-allow source queues %v, queues.json says %v", role, sources, p.SourceQueues)
			}
		}
	}
}

func TestTheOOMMetricFilterMatchesTheSubscriberLogs(t *testing.T) {
	m := root(t)
	msgs := m.eval(t, m.locals["oom_log_messages"].Expr, nil)
	if !msgs.IsKnown() || !msgs.CanIterateElements() || msgs.LengthInt() == 0 {
		t.Fatal("local.oom_log_messages does not evaluate to a list of messages")
	}
	src, err := os.ReadFile(filepath.Join("..", "subscriber", "run.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range msgs.AsValueSlice() {
		if !strings.Contains(string(src), "s.log.Warn("+strconv.Quote(v.AsString())) {
			t.Errorf("the metric filter counts %q, which subscriber/run.go no longer logs at WARN", v.AsString())
		}
	}
}

// ---------------------------------------------------------------------------
// The subscriber's side: its flags and their defaults, read from the code
// ---------------------------------------------------------------------------

// subscriberFlags returns the names of cmd/subscriber's flags: the string
// literal every fs.XxxVar / fs.Xxx / fs.Var call takes before its default.
func subscriberFlags(t *testing.T) []string { return flagNames(t, "subscriber") }

// flagNames returns the names of cmd/<command>'s flags.
func flagNames(t *testing.T, command string) []string {
	var names []string
	for name := range flagCalls(t, command) {
		names = append(names, name)
	}
	if len(names) < 10 {
		t.Fatalf("found only %d flags in cmd/%s/main.go", len(names), command)
	}
	return names
}

func subscriberFlagCalls(t *testing.T) map[string]*ast.CallExpr { return flagCalls(t, "subscriber") }

func flagCalls(t *testing.T, command string) map[string]*ast.CallExpr {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "cmd", command, "main.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]*ast.CallExpr{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !isIdent(sel.X, "fs") {
			return true
		}
		for _, a := range call.Args {
			if lit, ok := a.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				name, _ := strconv.Unquote(lit.Value)
				calls[name] = call
				break
			}
		}
		return true
	})
	return calls
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// subscriberFlagDefault is the default of a duration flag of cmd/subscriber,
// written like 25*time.Second.
func subscriberFlagDefault(t *testing.T, flag string) time.Duration {
	t.Helper()
	call, ok := subscriberFlagCalls(t)[flag]
	if !ok || len(call.Args) < 3 {
		t.Fatalf("cmd/subscriber has no flag -%s", flag)
	}
	d, ok := goDuration(call.Args[2])
	if !ok {
		t.Fatalf("cmd/subscriber -%s: default is not written as N*time.Unit", flag)
	}
	return d
}

func goDuration(e ast.Expr) (time.Duration, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		n, err := strconv.ParseInt(e.Value, 0, 64)
		return time.Duration(n), err == nil
	case *ast.SelectorExpr:
		if !isIdent(e.X, "time") {
			return 0, false
		}
		d, ok := map[string]time.Duration{"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond, "Millisecond": time.Millisecond,
			"Second": time.Second, "Minute": time.Minute, "Hour": time.Hour}[e.Sel.Name]
		return d, ok
	case *ast.BinaryExpr:
		x, ok1 := goDuration(e.X)
		y, ok2 := goDuration(e.Y)
		if e.Op == token.MUL && ok1 && ok2 {
			return x * y, true
		}
	case *ast.ParenExpr:
		return goDuration(e.X)
	}
	return 0, false
}

func parseDuration(t *testing.T, name, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s = %q: %v", name, s, err)
	}
	return d
}

// ---------------------------------------------------------------------------
// The subscriber's task definition
// ---------------------------------------------------------------------------

// subscriberContainer evaluates the subscriber's container definition (the
// argument of jsonencode in container_definitions).
func subscriberContainer(t *testing.T, m *module, override map[string]cty.Value) cty.Value {
	return container(t, m, "subscriber", override)
}

// container evaluates the container definition of the task definition name.
func container(t *testing.T, m *module, name string, override map[string]cty.Value) cty.Value {
	t.Helper()
	td := m.resource(t, "aws_ecs_task_definition", name)
	a, ok := td.Body.Attributes["container_definitions"]
	if !ok {
		t.Fatalf("aws_ecs_task_definition.%s has no container_definitions", name)
	}
	call, ok := a.Expr.(*hclsyntax.FunctionCallExpr)
	if !ok || call.Name != "jsonencode" || len(call.Args) != 1 {
		t.Fatalf("aws_ecs_task_definition.%s: container_definitions is not jsonencode([...])", name)
	}
	defs := m.eval(t, call.Args[0], override)
	if !defs.IsKnown() || !defs.CanIterateElements() || defs.LengthInt() != 1 {
		t.Fatalf("aws_ecs_task_definition.%s: want one container definition, got %#v", name, defs)
	}
	return defs.AsValueSlice()[0]
}

// subscriberEnv is the environment of the subscriber container, name to
// value, for every value known from the variables (queue URLs are not).
func subscriberEnv(t *testing.T, m *module, override map[string]cty.Value) map[string]string {
	return containerEnv(t, m, "subscriber", override)
}

// containerEnv is the environment of the task definition name's container,
// name to value; "" where the value is known only after apply.
func containerEnv(t *testing.T, m *module, name string, override map[string]cty.Value) map[string]string {
	t.Helper()
	def := container(t, m, name, override)
	if !def.Type().IsObjectType() || !def.Type().HasAttribute("environment") {
		t.Fatalf("the %s's container definition has no environment", name)
	}
	env := def.GetAttr("environment")
	if !env.IsKnown() || !env.CanIterateElements() {
		t.Fatalf("the %s's environment does not evaluate to a list", name)
	}
	out := map[string]string{}
	for _, e := range env.AsValueSlice() {
		k, value := e.GetAttr("name"), e.GetAttr("value")
		if !k.IsKnown() {
			t.Fatal("an environment variable has a name that depends on a resource")
		}
		if value.IsKnown() && !value.IsNull() {
			out[k.AsString()] = value.AsString()
		} else {
			out[k.AsString()] = ""
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// IAM statements
// ---------------------------------------------------------------------------

// statements returns the statement blocks of a policy document, with the
// content blocks of dynamic "statement" blocks.
func statements(body *hclsyntax.Body) []*hclsyntax.Body {
	var out []*hclsyntax.Body
	for _, b := range body.Blocks {
		switch {
		case b.Type == "statement":
			out = append(out, b.Body)
		case b.Type == "dynamic" && len(b.Labels) == 1 && b.Labels[0] == "statement":
			for _, c := range b.Body.Blocks {
				if c.Type == "content" {
					out = append(out, c.Body)
				}
			}
		}
	}
	return out
}

var (
	// An ARN that names every queue or bucket of some account or region.
	wildSQSOrS3ARN = regexp.MustCompile(`^arn:[^:]*:(sqs:[^:]*:[^:]*:.*\*|s3:::[^/]*\*)`)
)

func (m *module) checkStatement(t *testing.T, doc string, st *hclsyntax.Body) {
	t.Helper()
	effect := "Allow"
	if a, ok := st.Attributes["effect"]; ok {
		effect = m.eval(t, a.Expr, nil).AsString()
	}
	if effect == "Deny" {
		return // a Deny with a wildcard only narrows access (the TLS-only policies)
	}
	where := m.dir + ": " + doc + " " + st.SrcRange.String()
	for _, neg := range []string{"not_actions", "not_resources"} {
		if _, ok := st.Attributes[neg]; ok {
			t.Errorf("%s: an Allow with %s grants everything else", where, neg)
		}
	}
	a, ok := st.Attributes["actions"]
	if !ok {
		t.Errorf("%s: a statement without actions", where)
		return
	}
	actions := m.eval(t, a.Expr, nil)
	if !actions.IsKnown() || !actions.CanIterateElements() {
		t.Errorf("%s: actions are not a literal list", where)
		return
	}
	storage := false
	for _, v := range actions.AsValueSlice() {
		act := v.AsString()
		if strings.Contains(act, "*") {
			t.Errorf("%s: wildcard action %q", where, act)
		}
		storage = storage || strings.HasPrefix(act, "sqs:") || strings.HasPrefix(act, "s3:")
	}
	r, ok := st.Attributes["resources"]
	if !ok {
		// A trust policy: who may assume the role, which has no resource.
		if trust := slices.ContainsFunc(st.Blocks, func(b *hclsyntax.Block) bool { return b.Type == "principals" }); !trust || storage {
			t.Errorf("%s: a statement without resources", where)
		}
		return
	}
	tuple, ok := r.Expr.(*hclsyntax.TupleConsExpr)
	if !ok {
		t.Errorf("%s: resources are not a list literal", where)
		return
	}
	for _, e := range tuple.Exprs {
		v := m.eval(t, e, nil)
		if !v.IsKnown() {
			continue // built from a resource's ARN: a specific queue, bucket or key
		}
		res := v.AsString()
		if storage && (res == "*" || wildSQSOrS3ARN.MatchString(res)) {
			t.Errorf("%s: SQS or S3 actions on the wildcard resource %q", where, res)
		}
	}
}

func (m *module) deniesInsecureTransport(t *testing.T, b *hclsyntax.Block) bool {
	a, ok := b.Body.Attributes["policy"]
	if !ok {
		return false
	}
	for _, tr := range a.Expr.Variables() {
		if tr.RootName() != "data" || len(tr) < 3 {
			continue
		}
		doc, ok := m.data[tr[1].(hcl.TraverseAttr).Name+"."+tr[2].(hcl.TraverseAttr).Name]
		if !ok {
			continue
		}
		for _, st := range statements(doc.Body) {
			if e, ok := st.Attributes["effect"]; !ok || m.eval(t, e.Expr, nil).AsString() != "Deny" {
				continue
			}
			for _, c := range st.Blocks {
				if c.Type != "condition" {
					continue
				}
				variable := m.eval(t, c.Body.Attributes["variable"].Expr, nil)
				values := m.eval(t, c.Body.Attributes["values"].Expr, nil)
				if variable.RawEquals(cty.StringVal("aws:SecureTransport")) && values.IsKnown() && values.LengthInt() == 1 && values.AsValueSlice()[0].RawEquals(cty.StringVal("false")) {
					return true
				}
			}
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Reading the modules
// ---------------------------------------------------------------------------

// module is one Terraform module directory: its blocks by kind and name.
type module struct {
	dir       string
	bodies    []*hclsyntax.Body
	variables map[string]*hclsyntax.Block
	locals    map[string]*hclsyntax.Attribute
	resources map[string]*hclsyntax.Block // "type.name"
	data      map[string]*hclsyntax.Block // "type.name"
}

// modules returns every module under infra/: the root and the examples.
func modules(t *testing.T) []*module {
	t.Helper()
	byDir := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "." {
			return filepath.SkipDir // .terraform
		}
		if !d.IsDir() && strings.HasSuffix(path, ".tf") {
			byDir[filepath.Dir(path)] = append(byDir[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := byDir["."]; !ok {
		t.Fatal("no .tf files in infra/")
	}
	var out []*module
	for _, dir := range sorted(keys(byDir)) {
		out = append(out, load(t, dir, byDir[dir]))
	}
	return out
}

func root(t *testing.T) *module {
	t.Helper()
	return modules(t)[0]
}

func load(t *testing.T, dir string, files []string) *module {
	t.Helper()
	m := &module{dir: dir, variables: map[string]*hclsyntax.Block{}, locals: map[string]*hclsyntax.Attribute{},
		resources: map[string]*hclsyntax.Block{}, data: map[string]*hclsyntax.Block{}}
	p := hclparse.NewParser()
	for _, path := range files {
		f, diags := p.ParseHCLFile(path)
		if diags.HasErrors() {
			t.Fatalf("%s: %v", path, diags)
		}
		body := f.Body.(*hclsyntax.Body)
		m.bodies = append(m.bodies, body)
		for _, b := range body.Blocks {
			switch {
			case b.Type == "variable" && len(b.Labels) == 1:
				m.variables[b.Labels[0]] = b
			case b.Type == "locals":
				for name, a := range b.Body.Attributes {
					if _, dup := m.locals[name]; dup {
						t.Errorf("%s: local %q defined twice", path, name)
					}
					m.locals[name] = a
				}
			case b.Type == "resource" && len(b.Labels) == 2:
				m.resources[b.Labels[0]+"."+b.Labels[1]] = b
			case b.Type == "data" && len(b.Labels) == 2:
				m.data[b.Labels[0]+"."+b.Labels[1]] = b
			}
		}
	}
	return m
}

func (m *module) resource(t *testing.T, typ, name string) *hclsyntax.Block {
	t.Helper()
	b, ok := m.resources[typ+"."+name]
	if !ok {
		t.Fatalf("%s: no resource %s.%s", m.dir, typ, name)
	}
	return b
}

func (m *module) resourcesOf(typ string) map[string]*hclsyntax.Block {
	out := map[string]*hclsyntax.Block{}
	for _, b := range m.resources {
		if b.Labels[0] == typ {
			out[b.Labels[1]] = b
		}
	}
	return out
}

// traversals returns every variable reference in the module's expressions.
func (m *module) traversals() []hcl.Traversal {
	var out []hcl.Traversal
	for _, body := range m.bodies {
		_ = hclsyntax.VisitAll(body, func(n hclsyntax.Node) hcl.Diagnostics {
			if e, ok := n.(*hclsyntax.ScopeTraversalExpr); ok {
				out = append(out, e.Traversal)
			}
			return nil
		})
	}
	return out
}

// deepTraversals returns the references of the attributes' expressions, and
// of the locals they use, followed through.
func (m *module) deepTraversals(attrs ...*hclsyntax.Attribute) []hcl.Traversal {
	var out []hcl.Traversal
	seen := map[string]bool{}
	var walk func(e hcl.Expression)
	walk = func(e hcl.Expression) {
		for _, tr := range e.Variables() {
			out = append(out, tr)
			if tr.RootName() == "local" && len(tr) > 1 {
				name := tr[1].(hcl.TraverseAttr).Name
				if a, ok := m.locals[name]; ok && !seen[name] {
					seen[name] = true
					walk(a.Expr)
				}
			}
		}
	}
	for _, a := range attrs {
		if a != nil {
			walk(a.Expr)
		}
	}
	return out
}

// jsonencoded returns the object literal an attribute jsonencodes, or nil.
func (m *module) jsonencoded(t *testing.T, b *hclsyntax.Block, attr string) *hclsyntax.ObjectConsExpr {
	t.Helper()
	a, ok := b.Body.Attributes[attr]
	if !ok {
		return nil
	}
	obj := jsonencodeArg(a.Expr)
	if obj == nil {
		t.Fatalf("%s: %s is not jsonencode({...})", b.DefRange(), attr)
	}
	return obj
}

func jsonencodeArg(e hclsyntax.Expression) *hclsyntax.ObjectConsExpr {
	call, ok := e.(*hclsyntax.FunctionCallExpr)
	if !ok || call.Name != "jsonencode" || len(call.Args) != 1 {
		return nil
	}
	obj, _ := call.Args[0].(*hclsyntax.ObjectConsExpr)
	return obj
}

// itemExpr is the value expression of an object literal's key, or nil.
func (m *module) itemExpr(obj *hclsyntax.ObjectConsExpr, key string) hclsyntax.Expression {
	if obj == nil {
		return nil
	}
	for _, it := range obj.Items {
		if k, diags := it.KeyExpr.Value(nil); !diags.HasErrors() && k.Type() == cty.String && k.AsString() == key {
			return it.ValueExpr
		}
		if hcl.ExprAsKeyword(it.KeyExpr) == key {
			return it.ValueExpr
		}
	}
	return nil
}

// literalText is the literal text of a string template, its interpolations
// left out: what an ARN says whatever the partition or account.
func literalText(e hclsyntax.Expression) string {
	var b strings.Builder
	_ = hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
		if l, ok := n.(*hclsyntax.LiteralValueExpr); ok && l.Val.Type() == cty.String {
			b.WriteString(l.Val.AsString())
		}
		return nil
	})
	return b.String()
}

// refersTo says whether e references root.name (aws_sqs_queue.dlq, or
// data.aws_iam_policy_document with name the type).
func refersTo(e hcl.Expression, root, name string) bool {
	if e == nil {
		return false
	}
	for _, tr := range e.Variables() {
		if tr.RootName() == root && len(tr) > 1 {
			if a, ok := tr[1].(hcl.TraverseAttr); ok && a.Name == name {
				return true
			}
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Evaluation: variables at their defaults (or overridden), locals from them,
// everything a resource or data source knows only after apply unknown.
// ---------------------------------------------------------------------------

func (m *module) attr(t *testing.T, b *hclsyntax.Block, name string, override map[string]cty.Value) cty.Value {
	t.Helper()
	a, ok := b.Body.Attributes[name]
	if !ok {
		return cty.NullVal(cty.DynamicPseudoType)
	}
	return m.eval(t, a.Expr, override)
}

func (m *module) number(t *testing.T, e hcl.Expression, override map[string]cty.Value) int64 {
	t.Helper()
	if e == nil {
		t.Fatal("no expression where a number was expected")
	}
	return toInt(t, m.eval(t, e, override))
}

func toInt(t *testing.T, v cty.Value) int64 {
	t.Helper()
	if !v.IsKnown() || v.IsNull() || v.Type() != cty.Number {
		t.Fatalf("%#v is not a known number", v)
	}
	n, acc := v.AsBigFloat().Int64()
	if acc != big.Exact {
		t.Fatalf("%#v is not a whole number", v)
	}
	return n
}

func (m *module) eval(t *testing.T, e hcl.Expression, override map[string]cty.Value) cty.Value {
	t.Helper()
	if e == nil {
		return cty.NullVal(cty.DynamicPseudoType)
	}
	v, diags := e.Value(m.context(t, override))
	if diags.HasErrors() {
		t.Fatalf("%s: %v", e.Range(), diags)
	}
	return v
}

func (m *module) context(t *testing.T, override map[string]cty.Value) *hcl.EvalContext {
	t.Helper()
	vars := map[string]cty.Value{}
	for name, b := range m.variables {
		v := cty.DynamicVal // required: known only to the caller
		if d, ok := b.Body.Attributes["default"]; ok {
			dv, diags := d.Expr.Value(&hcl.EvalContext{Functions: functions()})
			if diags.HasErrors() {
				t.Fatalf("variable %q: default: %v", name, diags)
			}
			v = dv
		}
		if o, ok := override[name]; ok {
			v = o
		}
		vars[name] = v
	}
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{"var": cty.ObjectVal(vars)}, Functions: functions()}
	for _, body := range m.bodies {
		_ = hclsyntax.VisitAll(body, func(n hclsyntax.Node) hcl.Diagnostics {
			if call, ok := n.(*hclsyntax.FunctionCallExpr); ok {
				if _, known := ctx.Functions[call.Name]; !known {
					ctx.Functions[call.Name] = unknownFunc
				}
			}
			return nil
		})
	}
	for _, tr := range m.traversals() {
		if _, ok := ctx.Variables[tr.RootName()]; !ok {
			ctx.Variables[tr.RootName()] = cty.DynamicVal // resources, data, path, each, count, ...
		}
	}
	// Locals in dependency order, by evaluating all of them until nothing
	// changes; one that cannot be evaluated stays unknown.
	locals := map[string]cty.Value{}
	for name := range m.locals {
		locals[name] = cty.DynamicVal
	}
	for range len(m.locals) + 1 {
		ctx.Variables["local"] = cty.ObjectVal(locals)
		changed := false
		for name, a := range m.locals {
			v, diags := a.Expr.Value(ctx)
			if diags.HasErrors() {
				v = cty.DynamicVal
			}
			if !v.RawEquals(locals[name]) {
				locals[name], changed = v, true
			}
		}
		if !changed {
			break
		}
	}
	ctx.Variables["local"] = cty.ObjectVal(locals)
	return ctx
}

// functions are the Terraform functions the configuration uses that go-cty
// implements the same way; any other is unknownFunc.
func functions() map[string]function.Function {
	fs := map[string]function.Function{
		"can":             tryfunc.CanFunc,
		"coalesce":        stdlib.CoalesceFunc,
		"compact":         stdlib.CompactFunc,
		"concat":          stdlib.ConcatFunc,
		"contains":        stdlib.ContainsFunc,
		"floor":           stdlib.FloorFunc,
		"format":          stdlib.FormatFunc,
		"jsonencode":      stdlib.JSONEncodeFunc,
		"keys":            stdlib.KeysFunc,
		"length":          stdlib.LengthFunc,
		"max":             stdlib.MaxFunc,
		"merge":           stdlib.MergeFunc,
		"min":             stdlib.MinFunc,
		"regex":           stdlib.RegexFunc,
		"setintersection": stdlib.SetIntersectionFunc,
		"tostring":        stdlib.MakeToFunc(cty.String),
		"try":             tryfunc.TryFunc,
	}
	return fs
}

// unknownFunc stands for a Terraform function go-cty lacks (filebase64sha256,
// alltrue, ...): its result is unknown.
var unknownFunc = function.New(&function.Spec{
	VarParam: &function.Parameter{Type: cty.DynamicPseudoType, AllowNull: true, AllowUnknown: true, AllowDynamicType: true},
	Type:     func([]cty.Value) (cty.Type, error) { return cty.DynamicPseudoType, nil },
	Impl:     func([]cty.Value, cty.Type) (cty.Value, error) { return cty.DynamicVal, nil },
})

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
