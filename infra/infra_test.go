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
	"github.com/hashicorp/hcl/v2/hclwrite"
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
	days := expirationDays(t, m, nil)
	for _, prefix := range []string{"payloads", "jobs", "idempotency", "results", "failed", "cancel", "cancelled", "itemerrors", "answers"} {
		if _, ok := days[prefix]; !ok {
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

// On EC2 capacity ECS takes a stopTimeout over 120 s (the cap is Fargate's),
// so the grace covers the longest batch and the stop timeout covers the grace
// and the final flush (issue 19, item 6).
func TestTheStopTimeoutCoversTheShutdownGrace(t *testing.T) {
	m := root(t)
	if td := m.resource(t, "aws_ecs_task_definition", "subscriber"); !m.attr(t, td, "requires_compatibilities", nil).RawEquals(cty.TupleVal([]cty.Value{cty.StringVal("EC2")})) {
		t.Fatalf("the subscriber's task definition is not for EC2 only; a Fargate task could not take the stop timeout below")
	}
	// The default (-1 here), and the extremes the variable's validation allows.
	for _, grace := range []int64{-1, 0, 3600} {
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
		// The subscriber flushes deletes and releases for up to 30 s after
		// the grace.
		if time.Duration(stop)*time.Second < shutdownGrace+30*time.Second {
			t.Errorf("%s: stopTimeout %ds is shorter than the subscriber's shutdown grace %v and its 30s flush: ECS would SIGKILL batches it may finish", setting, stop, shutdownGrace)
		}
		if grace == -1 {
			inference := subscriberFlagDefault(t, "inference-timeout")
			if v, ok := subscriberEnv(t, m, nil)["VRAMQ_INFERENCE_TIMEOUT"]; ok {
				inference = parseDuration(t, "VRAMQ_INFERENCE_TIMEOUT", v)
			}
			if shutdownGrace < inference {
				t.Errorf("the default shutdown grace %v is shorter than the inference timeout %v: a deployment or a scale-in cuts batches short", shutdownGrace, inference)
			}
		}
	}
	// A grace shorter than the inference timeout is refused at plan time.
	short := map[string]cty.Value{"subscriber_shutdown_grace_seconds": cty.NumberIntVal(60), "subscriber_inference_timeout_seconds": cty.NumberIntVal(120)}
	if allTrue(m.preconditions(t, m.resource(t, "aws_ecs_task_definition", "subscriber"), short)) {
		t.Error("a shutdown grace of 60s with an inference timeout of 120s passes every precondition of the subscriber's task definition")
	}
	// Fargate's cap does hold for the publisher.
	fargate := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"), "publisher_shutdown_grace_seconds": cty.NumberIntVal(115)}
	if stop := toInt(t, container(t, m, "publisher", fargate).GetAttr("stopTimeout")); stop > 120 {
		t.Errorf("the publisher's stopTimeout %ds is over Fargate's maximum of 120s", stop)
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
// balancer's X-Forwarded-For, from the right, skipping trusted proxies. Only
// the balancer's own subnets may be trusted: trusting the VPC's block skips
// the true address of any client inside the VPC and takes what the client
// wrote further left (issue 14, item 12).
func TestThePublisherTrustsOnlyItsLoadBalancer(t *testing.T) {
	m := root(t)
	fargate := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate")}
	td := m.resource(t, "aws_ecs_task_definition", "publisher")
	var fromSubnets, fromVPC bool
	for _, tr := range m.deepTraversals(td.Body.Attributes["container_definitions"]) {
		if tr.RootName() == "data" && len(tr) > 2 {
			switch tr[1].(hcl.TraverseAttr).Name + "." + tr[2].(hcl.TraverseAttr).Name {
			case "aws_subnet.publisher_alb":
				fromSubnets = true
			case "aws_vpc.this":
				fromVPC = true
			}
		}
	}
	env := containerEnv(t, m, "publisher", fargate)
	if _, ok := env["VRAMQ_TRUSTED_PROXIES"]; !ok || !fromSubnets || fromVPC {
		t.Errorf("the publisher task's VRAMQ_TRUSTED_PROXIES is not built from the load balancer's subnets alone (from them: %v, from the VPC: %v, env %v)", fromSubnets, fromVPC, keys(env))
	}
	subnets := m.data["aws_subnet.publisher_alb"]
	if subnets == nil || !refersTo(subnets.Body.Attributes["for_each"].Expr, "var", "publisher_alb_subnet_ids") {
		t.Error("no data.aws_subnet.publisher_alb over var.publisher_alb_subnet_ids")
	}
	lb := m.resource(t, "aws_lb", "publisher")
	if a := lb.Body.Attributes["subnets"]; a == nil || !refersTo(a.Expr, "var", "publisher_alb_subnet_ids") || refersTo(a.Expr, "var", "subnet_ids") {
		t.Error("aws_lb.publisher is not placed in var.publisher_alb_subnet_ids alone")
	}
	// Nothing of this module may sit in the trusted subnets.
	shared := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"), "publisher_alb_subnet_ids": strings2("subnet-a", "subnet-b"), "subnet_ids": strings2("subnet-b", "subnet-c")}
	apart := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"), "publisher_alb_subnet_ids": strings2("subnet-a", "subnet-b"), "subnet_ids": strings2("subnet-c", "subnet-d")}
	if allTrue(m.preconditions(t, lb, shared)) {
		t.Error("aws_lb.publisher accepts load balancer subnets that are also subnet_ids (tasks and instances there would be trusted proxies)")
	}
	if !allTrue(m.preconditions(t, lb, apart)) {
		t.Error("aws_lb.publisher refuses load balancer subnets apart from subnet_ids")
	}
	if !slices.Contains(flagNames(t, "publisher"), "trusted-proxies") {
		t.Error("cmd/publisher has no -trusted-proxies flag for VRAMQ_TRUSTED_PROXIES")
	}
	// A value given in publisher_environment wins (another proxy in front).
	override := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"),
		"publisher_environment": cty.MapVal(map[string]cty.Value{"VRAMQ_TRUSTED_PROXIES": cty.StringVal("10.9.0.0/16")})}
	if v := containerEnv(t, m, "publisher", override)["VRAMQ_TRUSTED_PROXIES"]; v != "10.9.0.0/16" {
		t.Errorf("VRAMQ_TRUSTED_PROXIES in publisher_environment: the task has %q", v)
	}

	// The job API's port takes connections from the balancer only, so the
	// connection's peer is always the balancer.
	port := m.number(t, m.locals["publisher_port"].Expr, nil)
	sg := m.resource(t, "aws_security_group", "publisher_tasks")
	api := 0
	for _, b := range blocksOf(sg.Body, "ingress") {
		if m.number(t, b.Body.Attributes["from_port"].Expr, fargate) > port || m.number(t, b.Body.Attributes["to_port"].Expr, fargate) < port {
			continue
		}
		api++
		if _, ok := b.Body.Attributes["cidr_blocks"]; ok {
			t.Errorf("%s: the publisher's API port takes connections from CIDR blocks, not only from the load balancer", b.DefRange())
		}
		if a, ok := b.Body.Attributes["security_groups"]; !ok || !refersTo(a.Expr, "aws_security_group", "publisher_alb") {
			t.Errorf("%s: an ingress rule of the publisher's API port that is not from the load balancer's security group", b.DefRange())
		}
	}
	if api == 0 {
		t.Error("aws_security_group.publisher_tasks has no ingress rule for the API port")
	}
}

func strings2(v ...string) cty.Value {
	var out []cty.Value
	for _, s := range v {
		out = append(out, cty.StringVal(s))
	}
	return cty.ListVal(out)
}

func blocksOf(body *hclsyntax.Body, typ string) []*hclsyntax.Block {
	var out []*hclsyntax.Block
	for _, b := range body.Blocks {
		if b.Type == typ {
			out = append(out, b)
		}
	}
	return out
}

// preconditions evaluates the conditions of a block's lifecycle
// preconditions; an unknown one counts as passing (it depends on a resource).
func (m *module) preconditions(t *testing.T, b *hclsyntax.Block, override map[string]cty.Value) []bool {
	t.Helper()
	var out []bool
	for _, lc := range blocksOf(b.Body, "lifecycle") {
		for _, pc := range blocksOf(lc.Body, "precondition") {
			v := m.eval(t, pc.Body.Attributes["condition"].Expr, override)
			out = append(out, !v.IsKnown() || (!v.IsNull() && v.True()))
		}
	}
	if len(out) == 0 {
		t.Errorf("%s: no preconditions", b.DefRange())
	}
	return out
}

func allTrue(v []bool) bool {
	for _, b := range v {
		if !b {
			return false
		}
	}
	return true
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
			// queues.json's count is a default callers override (bin/queues
			// -max-receive-count): low for fast local tests. A deployment
			// needs at least as many (TestTheReceiveCountOutlastsRetriesAndHandbacks).
			if got := m.number(t, m.itemExpr(policy, "maxReceiveCount"), nil); got < int64(p.MaxReceiveCount) {
				t.Errorf("aws_sqs_queue.%s: maxReceiveCount %d, below queues.json's %d", role, got, p.MaxReceiveCount)
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

// The binaries' flags are read from docs/configuration.md: its tables are
// generated from the flag sets themselves, and TestConfigurationDoc in
// cmd/subscriber and cmd/publisher fails when they drift, so the table is
// what the binary parses (flags are no longer literals in one main.go:
// their defaults come from subscriber.DefaultConfig and
// publisher.DefaultConfig).

// flagDoc is one flag's row of the configuration reference.
type flagDoc struct{ env, def, usage string }

// subscriberFlags returns the names of cmd/subscriber's flags.
func subscriberFlags(t *testing.T) []string { return flagNames(t, "subscriber") }

// flagNames returns the names of cmd/<command>'s flags.
func flagNames(t *testing.T, command string) []string {
	var names []string
	for name := range documentedFlags(t, command) {
		names = append(names, name)
	}
	return names
}

// documentedFlags parses the generated table of cmd/<command>'s flags.
func documentedFlags(t *testing.T, command string) map[string]flagDoc {
	t.Helper()
	const path = "../docs/configuration.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "<!-- BEGIN "+command+" flags:")
	table, _, ok2 := strings.Cut(table, "<!-- END "+command+" flags -->")
	if !ok || !ok2 {
		t.Fatalf("%s has no generated table of cmd/%s's flags", path, command)
	}
	row := regexp.MustCompile("(?m)^\\| `-([a-z0-9-]+)` \\| (.*?) \\| (.*?) \\| (.*) \\|$")
	flags := map[string]flagDoc{}
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		flags[m[1]] = flagDoc{env: strings.Trim(m[2], "`"), def: strings.Trim(m[3], "`"), usage: m[4]}
	}
	if len(flags) < 10 {
		t.Fatalf("found only %d flags of cmd/%s in %s", len(flags), command, path)
	}
	return flags
}

// subscriberFlagDefault is the default of a duration flag of cmd/subscriber.
func subscriberFlagDefault(t *testing.T, flag string) time.Duration {
	t.Helper()
	f, ok := documentedFlags(t, "subscriber")[flag]
	if !ok {
		t.Fatalf("cmd/subscriber has no flag -%s", flag)
	}
	d, err := time.ParseDuration(f.def)
	if err != nil {
		t.Fatalf("cmd/subscriber -%s: default %q is not a duration", flag, f.def)
	}
	return d
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
	if !defs.IsKnown() || !defs.CanIterateElements() || defs.LengthInt() == 0 {
		t.Fatalf("aws_ecs_task_definition.%s: want container definitions, got %#v", name, defs)
	}
	// The task's own container is named after it; a sidecar (the subscriber's
	// model server) is another.
	for _, d := range defs.AsValueSlice() {
		if n := d.GetAttr("name"); n.IsKnown() && !n.IsNull() && n.AsString() == name {
			return d
		}
	}
	t.Fatalf("aws_ecs_task_definition.%s: no container named %q", name, name)
	return cty.NilVal
}

// containers evaluates every container definition of the task definition
// name, by container name.
func containers(t *testing.T, m *module, name string, override map[string]cty.Value) map[string]cty.Value {
	t.Helper()
	call := m.resource(t, "aws_ecs_task_definition", name).Body.Attributes["container_definitions"].Expr.(*hclsyntax.FunctionCallExpr)
	out := map[string]cty.Value{}
	for _, d := range m.eval(t, call.Args[0], override).AsValueSlice() {
		out[d.GetAttr("name").AsString()] = d
	}
	return out
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
		"alltrue":         allTrueFunc,
		"ceil":            stdlib.CeilFunc,
		"can":             tryfunc.CanFunc,
		"coalesce":        stdlib.CoalesceFunc,
		"compact":         stdlib.CompactFunc,
		"concat":          stdlib.ConcatFunc,
		"contains":        stdlib.ContainsFunc,
		"distinct":        stdlib.DistinctFunc,
		"floor":           stdlib.FloorFunc,
		"format":          stdlib.FormatFunc,
		"join":            stdlib.JoinFunc,
		"jsonencode":      stdlib.JSONEncodeFunc,
		"keys":            stdlib.KeysFunc,
		"length":          stdlib.LengthFunc,
		"lookup":          stdlib.LookupFunc,
		"lower":           stdlib.LowerFunc,
		"max":             stdlib.MaxFunc,
		"merge":           stdlib.MergeFunc,
		"min":             stdlib.MinFunc,
		"regex":           stdlib.RegexFunc,
		"regexall":        stdlib.RegexAllFunc,
		"setintersection": stdlib.SetIntersectionFunc,
		"sort":            stdlib.SortFunc,
		"startswith":      startsWithFunc,
		"tonumber":        stdlib.MakeToFunc(cty.Number),
		"tostring":        stdlib.MakeToFunc(cty.String),
		"toset":           stdlib.MakeToFunc(cty.Set(cty.DynamicPseudoType)),
		"try":             tryfunc.TryFunc,
		"values":          stdlib.ValuesFunc,
	}
	return fs
}

// allTrueFunc is Terraform's alltrue: true when every element of a list or
// tuple of bools is (and for none), unknown if any is.
var allTrueFunc = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "list", Type: cty.DynamicPseudoType, AllowUnknown: true}},
	Type:   func([]cty.Value) (cty.Type, error) { return cty.Bool, nil },
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		if !args[0].IsWhollyKnown() {
			return cty.UnknownVal(cty.Bool), nil
		}
		for _, v := range args[0].AsValueSlice() {
			if v.IsNull() || v.Type() != cty.Bool || v.False() {
				return cty.False, nil
			}
		}
		return cty.True, nil
	},
})

// startsWithFunc is Terraform's startswith.
var startsWithFunc = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "str", Type: cty.String}, {Name: "prefix", Type: cty.String}},
	Type:   function.StaticReturnType(cty.Bool),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		return cty.BoolVal(strings.HasPrefix(args[0].AsString(), args[1].AsString())), nil
	},
})

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

// ---------------------------------------------------------------------------
// Issue 19: what a platform team would apply
// ---------------------------------------------------------------------------

// Provider 6.0 to 6.7 refuse a max_message_size above 262144 at plan time;
// 6.8.0 (PR #43710) takes SQS's 1 MiB (item 1).
func TestTheProviderAcceptsTheQueueSize(t *testing.T) {
	largest := int64(0)
	r := root(t)
	for name, b := range r.resourcesOf("aws_sqs_queue") {
		if a, ok := b.Body.Attributes["max_message_size"]; ok {
			if n := r.number(t, a.Expr, nil); n > largest {
				largest = n
			}
		} else {
			t.Errorf("aws_sqs_queue.%s: no max_message_size", name)
		}
	}
	if largest <= 262144 {
		t.Fatalf("the queues take at most %d bytes; this check is about 1 MiB queues", largest)
	}
	for _, m := range modules(t) {
		constraint := m.awsProviderConstraint(t)
		if constraint == "" {
			t.Errorf("%s: no required_providers aws version", m.dir)
			continue
		}
		for v, want := range map[string]bool{"6.0.0": false, "6.3.0": false, "6.7.0": false, "6.7.9": false, "6.8.0": true, "6.30.1": true, "7.0.0": false} {
			if got := satisfies(t, constraint, v); got != want {
				t.Errorf("%s: aws provider %q admits %s: %v, want %v (6.8.0 is the first that takes a max_message_size of %d)", m.dir, constraint, v, got, want, largest)
			}
		}
	}
}

func (m *module) awsProviderConstraint(t *testing.T) string {
	for _, body := range m.bodies {
		for _, tf := range blocksOf(body, "terraform") {
			for _, rp := range blocksOf(tf.Body, "required_providers") {
				a, ok := rp.Body.Attributes["aws"]
				if !ok {
					continue
				}
				v := m.eval(t, a.Expr, nil)
				if v.Type().IsObjectType() && v.Type().HasAttribute("version") {
					return v.GetAttr("version").AsString()
				}
			}
		}
	}
	return ""
}

// satisfies evaluates a Terraform version constraint of comparisons joined
// by commas (">= 6.8.0, < 7.0.0"); "~>" is refused so the check stays exact.
func satisfies(t *testing.T, constraint, version string) bool {
	t.Helper()
	parse := func(s string) [3]int {
		var v [3]int
		for i, p := range strings.SplitN(strings.TrimSpace(s), ".", 3) {
			n, err := strconv.Atoi(p)
			if err != nil {
				t.Fatalf("version %q in %q", s, constraint)
			}
			v[i] = n
		}
		return v
	}
	cmp := func(a, b [3]int) int {
		for i := range a {
			if a[i] != b[i] {
				return a[i] - b[i]
			}
		}
		return 0
	}
	have := parse(version)
	for _, part := range strings.Split(constraint, ",") {
		part = strings.TrimSpace(part)
		op := strings.TrimRight(part, "0123456789. ")
		c := cmp(have, parse(strings.TrimPrefix(part, op)))
		var ok bool
		switch strings.TrimSpace(op) {
		case ">=":
			ok = c >= 0
		case ">":
			ok = c > 0
		case "<=":
			ok = c <= 0
		case "<":
			ok = c < 0
		case "=", "":
			ok = c == 0
		case "!=":
			ok = c != 0
		default:
			t.Fatalf("constraint %q: operator %q not handled here", constraint, op)
		}
		if !ok {
			return false
		}
	}
	return true
}

// "integration_method must be specified if integration_type is not MOCK";
// a Lambda proxy integration takes POST (item 2).
func TestTheAPIIntegrationHasAMethod(t *testing.T) {
	m := root(t)
	integrations := m.resourcesOf("aws_apigatewayv2_integration")
	if len(integrations) == 0 {
		t.Fatal("no aws_apigatewayv2_integration")
	}
	for name, b := range integrations {
		typ := m.attr(t, b, "integration_type", nil)
		if typ.RawEquals(cty.StringVal("MOCK")) {
			continue
		}
		method := m.attr(t, b, "integration_method", nil)
		if method.IsNull() || !method.IsKnown() {
			t.Errorf("aws_apigatewayv2_integration.%s (%#v): no integration_method", name, typ)
			continue
		}
		if typ.RawEquals(cty.StringVal("AWS_PROXY")) && !method.RawEquals(cty.StringVal("POST")) {
			t.Errorf("aws_apigatewayv2_integration.%s: AWS_PROXY integration_method %#v, API Gateway invokes Lambda with POST", name, method)
		}
	}
}

// A deployment of the GPU service must fit in the Auto Scaling group at every
// task count it can run at, and must be able to make progress (item 3). One
// GPU task per instance.
func TestADeploymentFitsTheGPUGroup(t *testing.T) {
	m := root(t)
	if n := m.number(t, m.variables["subscriber_gpus_per_task"].Body.Attributes["default"].Expr, nil); n != 1 {
		t.Fatalf("subscriber_gpus_per_task defaults to %d; this check assumes one GPU task per one-GPU instance", n)
	}
	svc := m.resource(t, "aws_ecs_service", "subscriber")
	asg := m.resource(t, "aws_autoscaling_group", "gpu")
	for _, surge := range []cty.Value{cty.NilVal, cty.True, cty.False} {
		for _, most := range []int64{1, 2, 3, 10} {
			o := map[string]cty.Value{"subscriber_max_count": cty.NumberIntVal(most)}
			if surge != cty.NilVal {
				o["subscriber_deployment_surge"] = surge
			}
			maxPct := m.number(t, svc.Body.Attributes["deployment_maximum_percent"].Expr, o)
			minPct := m.number(t, svc.Body.Attributes["deployment_minimum_healthy_percent"].Expr, o)
			instances := m.number(t, asg.Body.Attributes["max_size"].Expr, o)
			for n := int64(1); n <= most; n++ {
				upper := n * maxPct / 100      // ECS rounds the maximum down
				lower := (n*minPct + 99) / 100 // and the minimum up
				if upper > instances {
					t.Errorf("surge %v, max count %d: a deployment at %d tasks may run %d (maximum %d %%), the group holds %d instances", surge, most, n, upper, maxPct, instances)
				}
				if upper <= n && lower >= n {
					t.Errorf("surge %v, max count %d: at %d tasks a deployment can neither start a task (maximum %d %%) nor stop one (minimum healthy %d %%)", surge, most, n, maxPct, minPct)
				}
			}
		}
	}
}

// Target tracking divides by the tasks the scaler asked for, not those
// already running: a GPU task takes minutes to run, and dividing by the
// running ones keeps asking for the same tasks (item 4).
func TestScalingDividesByTheDesiredCount(t *testing.T) {
	m := root(t)
	found := false
	for name, p := range m.resourcesOf("aws_appautoscaling_policy") {
		for _, tt := range blocksOf(p.Body, "target_tracking_scaling_policy_configuration") {
			for _, cm := range blocksOf(tt.Body, "customized_metric_specification") {
				found = true
				ids := map[string]string{}
				var expr string
				for _, mb := range blocksOf(cm.Body, "metrics") {
					id := m.attr(t, mb, "id", nil).AsString()
					for _, ms := range blocksOf(mb.Body, "metric_stat") {
						for _, mm := range blocksOf(ms.Body, "metric") {
							ids[id] = m.attr(t, mm, "metric_name", nil).AsString()
						}
					}
					if r := m.attr(t, mb, "return_data", nil); r.IsKnown() && !r.IsNull() && r.True() {
						expr = m.attr(t, mb, "expression", nil).AsString()
					}
				}
				var denominator bool
				for id, metric := range ids {
					if metric == "RunningTaskCount" {
						t.Errorf("aws_appautoscaling_policy.%s: metric %q is RunningTaskCount, which lags the scaler's decisions by a GPU task's start time", name, id)
					}
					if metric == "DesiredTaskCount" && regexp.MustCompile(`/\s*`+id+`\b`).MatchString(expr) {
						denominator = true
					}
				}
				if !denominator {
					t.Errorf("aws_appautoscaling_policy.%s: the expression %q does not divide by DesiredTaskCount (metrics %v)", name, expr, ids)
				}
			}
		}
	}
	if !found {
		t.Fatal("no target tracking policy with a customized metric")
	}
}

// With subscriber_min_count = 0 the service can leave zero: a step policy on
// an alarm for "messages visible, no task wanted" (item 5).
func TestTheSubscriberScalesFromZero(t *testing.T) {
	m := root(t)
	if !m.validates(t, "subscriber_min_count", cty.NumberIntVal(0)) {
		t.Fatal("subscriber_min_count = 0 is refused")
	}
	zero := map[string]cty.Value{"subscriber_min_count": cty.NumberIntVal(0)}
	target := m.resource(t, "aws_appautoscaling_target", "subscriber")
	if n := m.number(t, target.Body.Attributes["min_capacity"].Expr, zero); n != 0 {
		t.Errorf("with subscriber_min_count = 0 the scalable target's minimum is %d", n)
	}
	var step string
	for name, p := range m.resourcesOf("aws_appautoscaling_policy") {
		if !m.attr(t, p, "policy_type", nil).RawEquals(cty.StringVal("StepScaling")) || !refersTo(p.Body.Attributes["resource_id"].Expr, "aws_appautoscaling_target", "subscriber") {
			continue
		}
		for _, c := range blocksOf(p.Body, "step_scaling_policy_configuration") {
			for _, adj := range blocksOf(c.Body, "step_adjustment") {
				if m.number(t, adj.Body.Attributes["scaling_adjustment"].Expr, nil) > 0 {
					step = name
				}
			}
		}
	}
	if step == "" {
		t.Fatal("no step scaling policy on the subscriber's scalable target that adds a task")
	}
	alarmed := false
	for name, a := range m.resourcesOf("aws_cloudwatch_metric_alarm") {
		if aa, ok := a.Body.Attributes["alarm_actions"]; !ok || !refersTo(aa.Expr, "aws_appautoscaling_policy", step) {
			continue
		}
		alarmed = true
		metrics := map[string]string{}
		var expr string
		for _, q := range blocksOf(a.Body, "metric_query") {
			id := m.attr(t, q, "id", nil).AsString()
			for _, mb := range blocksOf(q.Body, "metric") {
				metrics[id] = m.attr(t, mb, "metric_name", nil).AsString()
				if metrics[id] == "ApproximateNumberOfMessagesVisible" && !refersTo(m.itemExpr(mb.Body.Attributes["dimensions"].Expr.(*hclsyntax.ObjectConsExpr), "QueueName"), "aws_sqs_queue", "work") {
					t.Errorf("aws_cloudwatch_metric_alarm.%s: visible messages of another queue than the work queue", name)
				}
			}
			if r := m.attr(t, q, "return_data", nil); r.IsKnown() && !r.IsNull() && r.True() {
				expr = m.attr(t, q, "expression", nil).AsString()
			}
		}
		for _, want := range []string{"ApproximateNumberOfMessagesVisible", "DesiredTaskCount"} {
			ok := false
			for id, metric := range metrics {
				ok = ok || (metric == want && regexp.MustCompile(`\b`+id+`\b`).MatchString(expr))
			}
			if !ok {
				t.Errorf("aws_cloudwatch_metric_alarm.%s: its expression %q does not use %s", name, expr, want)
			}
		}
	}
	if !alarmed {
		t.Errorf("no alarm triggers aws_appautoscaling_policy.%s", step)
	}
}

// Receives count releases too; the redrive count must outlast the retries of
// a short outage and the hand-backs of deployments, scale-in and
// backpressure (item 6).
func TestTheReceiveCountOutlastsRetriesAndHandbacks(t *testing.T) {
	m := root(t)
	const outage = 10 * time.Minute // what a transient failure should ride out
	const handbacks = 3             // deployment or scale-in, drained instance, backpressure
	delay := subscriberFlagDefault(t, "retry-delay")
	// The subscriber retries after delay * 2^(receives-1): n failing receives
	// span delay * (2^(n-1) - 1).
	n, span := int64(1), time.Duration(0)
	for ; span < outage; n++ {
		span += delay << (n - 1)
	}
	want := n + handbacks
	got := receiveCount(t, m, nil)
	if got < want {
		t.Errorf("max_receive_count defaults to %d: %d receives ride out %v of failures with -retry-delay %v, plus %d hand-backs, is %d", got, n, outage, delay, handbacks, want)
	}
}

// receiveCount is the work queue's maxReceiveCount with override.
func receiveCount(t *testing.T, m *module, override map[string]cty.Value) int64 {
	t.Helper()
	return m.number(t, m.itemExpr(m.jsonencoded(t, m.resource(t, "aws_sqs_queue", "work"), "redrive_policy"), "maxReceiveCount"), override)
}

// Task scale-in protection, renewed while a task holds messages, would keep
// old tasks from ever being replaced under steady load: off unless asked for,
// and then without the permissions it needs only when on (item 7).
func TestTaskProtectionCannotStallDeployments(t *testing.T) {
	m := root(t)
	if !slices.Contains(subscriberFlags(t), "task-protection") {
		t.Fatal("cmd/subscriber has no -task-protection flag")
	}
	if v := subscriberEnv(t, m, nil)["VRAMQ_TASK_PROTECTION"]; v != "off" {
		t.Errorf("the subscriber's VRAMQ_TASK_PROTECTION is %q by default (the flag's default auto turns it on under ECS): a deployment under steady load would never stop the old tasks", v)
	}
	on := map[string]cty.Value{"subscriber_task_protection": cty.True}
	if v := subscriberEnv(t, m, on)["VRAMQ_TASK_PROTECTION"]; v != "on" {
		t.Errorf("subscriber_task_protection = true: VRAMQ_TASK_PROTECTION is %q", v)
	}
	for _, tc := range []struct {
		override map[string]cty.Value
		want     bool
	}{{nil, false}, {on, true}} {
		granted := false
		for _, st := range blocksOf(m.data["aws_iam_policy_document.subscriber"].Body, "dynamic") {
			for _, c := range blocksOf(st.Body, "content") {
				acts := m.eval(t, c.Body.Attributes["actions"].Expr, nil)
				if !acts.IsKnown() || !slices.ContainsFunc(acts.AsValueSlice(), func(v cty.Value) bool { return v.RawEquals(cty.StringVal("ecs:UpdateTaskProtection")) }) {
					continue
				}
				each := m.eval(t, st.Body.Attributes["for_each"].Expr, tc.override)
				granted = each.IsKnown() && each.LengthInt() > 0
			}
		}
		for _, st := range blocksOf(m.data["aws_iam_policy_document.subscriber"].Body, "statement") {
			if a, ok := st.Body.Attributes["actions"]; ok && strings.Contains(literalText(a.Expr), "ecs:UpdateTaskProtection") {
				granted = true
			}
		}
		if granted != tc.want {
			t.Errorf("subscriber_task_protection %v: the task role may update its protection: %v", tc.override, granted)
		}
	}
}

// SQS stops reporting a queue nobody touches, even one holding messages, so
// a DLQ alarm must not read missing data as "empty" (item 8).
func TestTheDLQAlarmsCannotGoQuiet(t *testing.T) {
	m := root(t)
	metrics := map[string]bool{}
	for name, a := range m.resourcesOf("aws_cloudwatch_metric_alarm") {
		d, ok := a.Body.Attributes["dimensions"]
		if !ok {
			continue
		}
		obj, ok := d.Expr.(*hclsyntax.ObjectConsExpr)
		if !ok || !refersTo(m.itemExpr(obj, "QueueName"), "aws_sqs_queue", "dlq") {
			continue
		}
		metrics[m.attr(t, a, "metric_name", nil).AsString()] = true
		if v := m.attr(t, a, "treat_missing_data", nil); !v.RawEquals(cty.StringVal("ignore")) && !v.RawEquals(cty.StringVal("breaching")) {
			t.Errorf("aws_cloudwatch_metric_alarm.%s: treat_missing_data %#v turns a quiet, full DLQ to OK", name, v)
		}
	}
	for _, want := range []string{"ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage"} {
		if !metrics[want] {
			t.Errorf("no alarm on the DLQ's %s", want)
		}
	}
}

// A message the subscriber dead-lettered itself records no source queue, so
// a redrive without a destination cannot move it (item 9).
func TestTheRedriveCommandNamesItsDestination(t *testing.T) {
	seen := 0
	for _, path := range []string{filepath.Join("..", "docs", "deployment.md"), "README.md", filepath.Join("examples", "complete", "README.md")} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for i := strings.Index(text, "start-message-move-task"); i >= 0; i = next(text, i) {
			seen++
			end := min(len(text), i+400)
			if !strings.Contains(text[i:end], "--destination-arn") {
				t.Errorf("%s: start-message-move-task without --destination-arn: %q", path, text[i:end])
			}
		}
	}
	if seen == 0 {
		t.Error("no README tells how to redrive the DLQ")
	}
}

func next(text string, i int) int {
	j := strings.Index(text[i+1:], "start-message-move-task")
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// ECS refuses capacity provider names that start with aws, ecs or fargate;
// the provider is named after its group, which starts with name_prefix, and
// replaced before the old one is destroyed (item 10).
func TestTheCapacityProviderNameIsLegalAndReplaceable(t *testing.T) {
	m := root(t)
	for prefix, ok := range map[string]bool{"": true, "prod-": true, "dev-": true, "aws": false, "aws-": false, "awsome-": false, "ecs-": false, "fargate-": false} {
		if got := m.validates(t, "name_prefix", cty.StringVal(prefix)); got != ok {
			t.Errorf("name_prefix %q: validation passes %v, want %v", prefix, got, ok)
		}
	}
	cp := m.resource(t, "aws_ecs_capacity_provider", "gpu")
	asg := m.resource(t, "aws_autoscaling_group", "gpu")
	for _, prefix := range []string{"", "prod-"} {
		o := map[string]cty.Value{"name_prefix": cty.StringVal(prefix)}
		name := m.attr(t, cp, "name", o)
		if !name.IsKnown() && refersTo(cp.Body.Attributes["name"].Expr, "aws_autoscaling_group", "gpu") {
			name = m.attr(t, asg, "name_prefix", o) // the group's name starts with it
		}
		if !name.IsKnown() || regexp.MustCompile(`^(?i)(aws|ecs|fargate)`).MatchString(name.AsString()) {
			t.Errorf("name_prefix %q: the capacity provider's name starts %#v", prefix, name)
		}
	}
	if !refersTo(cp.Body.Attributes["name"].Expr, "aws_autoscaling_group", "gpu") {
		t.Error("the capacity provider's name is not its group's (unique) name: a replacement would clash with the provider it replaces")
	}
	// A new provider name in the service's strategy replaces the service
	// unless force_new_deployment lets the provider update it in place.
	if v := m.attr(t, m.resource(t, "aws_ecs_service", "subscriber"), "force_new_deployment", nil); !v.IsKnown() || v.IsNull() || !v.True() {
		t.Error("aws_ecs_service.subscriber: no force_new_deployment, so a replaced capacity provider replaces the service")
	}
	for _, b := range []*hclsyntax.Block{cp, asg} {
		cbd := false
		for _, lc := range blocksOf(b.Body, "lifecycle") {
			if a, ok := lc.Body.Attributes["create_before_destroy"]; ok && m.eval(t, a.Expr, nil).True() {
				cbd = true
			}
		}
		if !cbd {
			t.Errorf("%s: no create_before_destroy: ECS refuses to delete a capacity provider still attached to the cluster", b.DefRange())
		}
	}
}

// An internet-facing load balancer carries the job API and its bearer keys:
// HTTPS only (item 11).
func TestAPublicLoadBalancerNeedsACertificate(t *testing.T) {
	m := root(t)
	lb := m.resource(t, "aws_lb", "publisher")
	base := func(internal bool, cert cty.Value) map[string]cty.Value {
		return map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"), "publisher_alb_internal": cty.BoolVal(internal), "publisher_certificate_arn": cert,
			"publisher_alb_subnet_ids": strings2("subnet-a", "subnet-b"), "subnet_ids": strings2("subnet-c", "subnet-d")}
	}
	cert := cty.StringVal("arn:aws:acm:eu-west-1:111122223333:certificate/x")
	if allTrue(m.preconditions(t, lb, base(false, cty.NullVal(cty.String)))) {
		t.Error("an internet-facing load balancer without a certificate passes every precondition")
	}
	for _, o := range []map[string]cty.Value{base(false, cert), base(true, cty.NullVal(cty.String)), base(true, cert)} {
		if !allTrue(m.preconditions(t, lb, o)) {
			t.Errorf("aws_lb.publisher refuses internal=%#v certificate=%#v", o["publisher_alb_internal"], o["publisher_certificate_arn"])
		}
	}
	l := m.resource(t, "aws_lb_listener", "publisher")
	if p := m.attr(t, l, "protocol", base(false, cert)); !p.RawEquals(cty.StringVal("HTTPS")) {
		t.Errorf("with a certificate the listener's protocol is %#v", p)
	}
}

// Bearer keys never sit in an environment variable (plain text in the task
// definition, the function's configuration and the state): ECS reads them
// from a secret, and the execution role may read exactly that secret
// (item 11).
func TestAPIKeysAreSecrets(t *testing.T) {
	m := root(t)
	keysEnv := cty.MapVal(map[string]cty.Value{"VRAMQ_API_KEYS": cty.StringVal("k1,k2")})
	if m.validates(t, "publisher_environment", keysEnv) {
		t.Error("publisher_environment accepts VRAMQ_API_KEYS in plain text")
	}
	arn := "arn:aws:secretsmanager:eu-west-1:111122223333:secret:vramq-keys-AbCdEf"
	for _, v := range []string{arn, "arn:aws:ssm:eu-west-1:111122223333:parameter/vramq/keys"} {
		if !m.validates(t, "publisher_api_keys_secret_arn", cty.StringVal(v)) {
			t.Errorf("publisher_api_keys_secret_arn refuses %s", v)
		}
	}
	if m.validates(t, "publisher_api_keys_secret_arn", cty.StringVal("k1,k2")) {
		t.Error("publisher_api_keys_secret_arn accepts keys instead of an ARN")
	}
	o := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"), "publisher_api_keys_secret_arn": cty.StringVal(arn)}
	def := container(t, m, "publisher", o)
	if _, in := containerEnv(t, m, "publisher", o)["VRAMQ_API_KEYS"]; in {
		t.Error("the publisher's environment holds VRAMQ_API_KEYS")
	}
	found := false
	if def.Type().HasAttribute("secrets") {
		for _, sec := range def.GetAttr("secrets").AsValueSlice() {
			if sec.GetAttr("name").RawEquals(cty.StringVal("VRAMQ_API_KEYS")) && sec.GetAttr("valueFrom").RawEquals(cty.StringVal(arn)) {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("the publisher's container has no secret VRAMQ_API_KEYS from %s", arn)
	}
	// The execution role reads what local.ecs_services names, per statement
	// exactly its ARN.
	services := m.eval(t, m.locals["ecs_services"].Expr, o)
	if !services.IsKnown() || !services.Type().HasAttribute("publisher") {
		t.Fatalf("local.ecs_services has no publisher in fargate mode: %#v", services)
	}
	if got := services.GetAttr("publisher").GetAttr("secret_arns"); !got.IsKnown() || got.LengthInt() != 1 || !got.AsValueSlice()[0].RawEquals(cty.StringVal(arn)) {
		t.Errorf("local.ecs_services.publisher.secret_arns = %#v, want exactly the secret", got)
	}
	reads := 0
	for _, st := range blocksOf(m.data["aws_iam_policy_document.execution"].Body, "dynamic") {
		for _, c := range blocksOf(st.Body, "content") {
			acts := literalText(c.Body.Attributes["actions"].Expr)
			if !strings.Contains(acts, "secretsmanager:") && !strings.Contains(acts, "ssm:") {
				continue
			}
			reads++
			if acts != "secretsmanager:GetSecretValue" && acts != "ssm:GetParameters" {
				t.Errorf("%s: the execution role's secret statement allows %q", c.DefRange(), acts)
			}
			if !refersTo(st.Body.Attributes["for_each"].Expr, "each", "value") || !refersTo(c.Body.Attributes["resources"].Expr, "statement", "value") {
				t.Errorf("%s: the secret statement is not over each service's own secret ARNs", c.DefRange())
			}
		}
	}
	if reads == 0 {
		t.Error("the execution role cannot read the secret")
	}
	// Lambda has no secrets injection: the function reads a Secrets Manager
	// secret itself at a cold start (-api-keys-secret), given its ARN in the
	// environment (an ARN, not the keys), and its role may read exactly it.
	// An SSM parameter, which it does not read, is refused there.
	fn := m.resource(t, "aws_lambda_function", "publisher")
	lambda := map[string]cty.Value{"publisher_api_keys_secret_arn": cty.StringVal(arn)}
	if !allTrue(m.preconditions(t, fn, lambda)) {
		t.Error("lambda mode refuses a Secrets Manager secret for the keys")
	}
	ssm := map[string]cty.Value{"publisher_api_keys_secret_arn": cty.StringVal("arn:aws:ssm:eu-west-1:111122223333:parameter/vramq/keys")}
	if allTrue(m.preconditions(t, fn, ssm)) {
		t.Error("lambda mode accepts an SSM parameter for the keys, which the function does not read")
	}
	env := m.eval(t, blocksOf(fn.Body, "environment")[0].Body.Attributes["variables"].Expr, lambda)
	if !env.Type().HasAttribute("VRAMQ_API_KEYS_SECRET") || !env.GetAttr("VRAMQ_API_KEYS_SECRET").RawEquals(cty.StringVal(arn)) {
		t.Errorf("the function's environment has no VRAMQ_API_KEYS_SECRET = %s: %#v", arn, env)
	}
	if env.Type().HasAttribute("VRAMQ_API_KEYS") {
		t.Error("the function's environment holds VRAMQ_API_KEYS")
	}
	lambdaReads := 0
	for _, st := range blocksOf(m.data["aws_iam_policy_document.publisher"].Body, "dynamic") {
		for _, c := range blocksOf(st.Body, "content") {
			if literalText(c.Body.Attributes["actions"].Expr) != "secretsmanager:GetSecretValue" {
				continue
			}
			lambdaReads++
			if got := m.eval(t, st.Body.Attributes["for_each"].Expr, lambda); !got.IsKnown() || got.LengthInt() != 1 || !got.AsValueSlice()[0].RawEquals(cty.StringVal(arn)) {
				t.Errorf("%s: the function's role reads %#v, want exactly the secret", c.DefRange(), got)
			}
			if got := m.eval(t, st.Body.Attributes["for_each"].Expr, o); got.LengthInt() != 0 {
				t.Errorf("%s: on fargate the task role reads the secret too: %#v", c.DefRange(), got)
			}
		}
	}
	if lambdaReads != 1 {
		t.Errorf("the publisher role has %d statements reading a secret, want 1 (lambda mode)", lambdaReads)
	}
}

// infra/README says what the roles allow, and the example's README what a
// user must provide (item 12).
func TestTheREADMEsSayWhatIsTrue(t *testing.T) {
	m := root(t)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range m.resourcesOf("aws_iam_role_policy_attachment") {
		arn := literalText(b.Body.Attributes["policy_arn"].Expr)
		policy := arn[strings.LastIndex(arn, "/")+1:]
		if !strings.Contains(string(readme), policy) {
			t.Errorf("aws_iam_role_policy_attachment.%s attaches %s, which infra/README.md does not name", name, policy)
		}
	}
	if regexp.MustCompile(`(?i)each exactly the actions its code calls`).Match(readme) {
		t.Error("infra/README.md says every role has exactly the actions its code calls; the instance role has AWS managed policies")
	}
	example, err := os.ReadFile(filepath.Join("examples", "complete", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var ex *module
	for _, mm := range modules(t) {
		if mm.dir == filepath.Join("examples", "complete") {
			ex = mm
		}
	}
	if ex == nil {
		t.Fatal("no examples/complete module")
	}
	for name, b := range ex.variables {
		if _, ok := b.Body.Attributes["default"]; !ok && !strings.Contains(string(example), name+" ") {
			t.Errorf("examples/complete/README.md does not show the required variable %s", name)
		}
	}
	for _, want := range []string{"NAT", "VPC endpoint", "make lambda", "quota", "docker push", "subscriber_min_count"} {
		if !strings.Contains(string(example), want) {
			t.Errorf("examples/complete/README.md does not mention %q", want)
		}
	}
}

// The values a variable's description offers are the values its validation
// takes: the subscriber's log levels (item 13).
func TestTheOfferedLogLevelsValidate(t *testing.T) {
	m := root(t)
	f, ok := documentedFlags(t, "subscriber")["log-level"]
	if !ok {
		t.Fatal("cmd/subscriber has no -log-level")
	}
	help := f.usage
	_, list, _ := strings.Cut(help, ":")
	desc := m.eval(t, m.variables["subscriber_log_level"].Body.Attributes["description"].Expr, nil).AsString()
	for _, level := range strings.Split(list, ",") {
		level = strings.TrimSpace(level)
		offered := regexp.MustCompile(`\b` + level + `\b`).MatchString(desc)
		if got := m.validates(t, "subscriber_log_level", cty.StringVal(level)); got != offered {
			t.Errorf("subscriber_log_level %q: the description offers it: %v, the validation takes it: %v", level, offered, got)
		}
	}
}

// A range a description states ("60 to 1209600") is the range its validation
// enforces (item 13).
func TestDocumentedRangesAreValidated(t *testing.T) {
	rangeRE := regexp.MustCompile(`\b(\d+) to (\d+)\b`)
	checked := 0
	for _, m := range modules(t) {
		for name, b := range m.variables {
			desc := m.eval(t, b.Body.Attributes["description"].Expr, nil).AsString()
			r := rangeRE.FindStringSubmatch(desc)
			if r == nil {
				continue
			}
			checked++
			lo, _ := strconv.ParseInt(r[1], 10, 64)
			hi, _ := strconv.ParseInt(r[2], 10, 64)
			for v, want := range map[int64]bool{lo: true, hi: true, lo - 1: false, hi + 1: false} {
				if got := m.validates(t, name, cty.NumberIntVal(v)); got != want {
					t.Errorf("%s: variable %q documents %d to %d; %d passes validation: %v", m.dir, name, lo, hi, v, got)
				}
			}
		}
	}
	if checked < 10 {
		t.Errorf("only %d documented ranges found", checked)
	}
}

// A variable that a function, an operator, a template or for_each uses
// breaks the plan with a cryptic error when a caller passes null: it must
// say nullable = false, unless null is its default (item 13).
func TestVariablesNullWouldBreakAreNotNullable(t *testing.T) {
	for _, m := range modules(t) {
		used := map[string]bool{}
		direct := func(e hclsyntax.Expression) {
			if st, ok := e.(*hclsyntax.ScopeTraversalExpr); ok && st.Traversal.RootName() == "var" && len(st.Traversal) > 1 {
				used[st.Traversal[1].(hcl.TraverseAttr).Name] = true
			}
		}
		for _, body := range m.bodies {
			_ = hclsyntax.VisitAll(body, func(n hclsyntax.Node) hcl.Diagnostics {
				switch e := n.(type) {
				case *hclsyntax.FunctionCallExpr:
					for _, a := range e.Args {
						direct(a)
					}
				case *hclsyntax.BinaryOpExpr:
					if e.Op != hclsyntax.OpEqual && e.Op != hclsyntax.OpNotEqual {
						direct(e.LHS)
						direct(e.RHS)
					}
				case *hclsyntax.UnaryOpExpr:
					direct(e.Val)
				case *hclsyntax.TemplateExpr:
					for _, p := range e.Parts {
						direct(p)
					}
				case *hclsyntax.ForExpr:
					direct(e.CollExpr)
				case *hclsyntax.ConditionalExpr:
					direct(e.Condition)
				case *hclsyntax.Attribute:
					if e.Name == "for_each" {
						direct(e.Expr)
					}
				}
				return nil
			})
		}
		if m.dir == "." && len(used) < 10 {
			t.Errorf("%s: only %d variables found in calls and operators", m.dir, len(used))
		}
		for name := range used {
			b, ok := m.variables[name]
			if !ok {
				continue
			}
			if d, ok := b.Body.Attributes["default"]; ok && m.eval(t, d.Expr, nil).IsNull() {
				continue // null is a value it expects
			}
			if a, ok := b.Body.Attributes["nullable"]; !ok || !m.eval(t, a.Expr, nil).False() {
				t.Errorf("%s: variable %q is used where null breaks the plan, and is nullable", m.dir, name)
			}
		}
	}
}

// On Spot the group launches a replacement on a rebalance recommendation,
// before the 2-minute notice (item 13).
func TestSpotRebalancesCapacity(t *testing.T) {
	m := root(t)
	asg := m.resource(t, "aws_autoscaling_group", "gpu")
	if v := m.attr(t, asg, "capacity_rebalance", map[string]cty.Value{"subscriber_spot": cty.True}); !v.IsKnown() || v.IsNull() || !v.True() {
		t.Errorf("subscriber_spot = true: capacity_rebalance = %#v", v)
	}
}

// The GPU AMI is pinned by a variable: read from the recommended-AMI
// parameter at plan time it shows a diff on every AMI release (item 13).
func TestTheGPUAMIIsPinned(t *testing.T) {
	m := root(t)
	lt := m.resource(t, "aws_launch_template", "gpu")
	a, ok := lt.Body.Attributes["image_id"]
	if !ok {
		t.Fatal("aws_launch_template.gpu has no image_id")
	}
	for _, tr := range m.deepTraversals(a) {
		if tr.RootName() == "data" {
			t.Errorf("aws_launch_template.gpu: image_id follows %s, read at every plan", tr.SourceRange())
		}
	}
	if !refersTo(a.Expr, "var", "subscriber_ami_id") {
		t.Error("aws_launch_template.gpu: image_id is not var.subscriber_ami_id")
	}
	for v, want := range map[string]bool{"ami-0123456789abcdef0": true, "ami-12345678": true, "resolve:ssm:/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id": false, "": false} {
		if got := m.validates(t, "subscriber_ami_id", cty.StringVal(v)); got != want {
			t.Errorf("subscriber_ami_id %q: validation passes %v, want %v", v, got, want)
		}
	}
}

// `terraform fmt` is hclwrite's formatter: every file is already in its
// form ("terraform fmt clean").
func TestTheHCLIsFormatted(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".tf") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if out := hclwrite.Format(src); string(out) != string(src) {
			t.Errorf("%s is not formatted (terraform fmt would change it)", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// Issue 14, item 15: /metrics is not reachable through the load balancer
// ---------------------------------------------------------------------------

// The publisher serves /metrics on a port of its own; the load balancer
// forwards the API port and the API's paths only, and the metrics port takes
// scrapes from inside the VPC, never from the balancer.
func TestMetricsAreNotServedThroughTheLoadBalancer(t *testing.T) {
	m := root(t)
	fargate := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate")}
	env := containerEnv(t, m, "publisher", fargate)
	port := func(name string) int64 {
		_, p, ok := strings.Cut(env[name], ":")
		n, err := strconv.ParseInt(p, 10, 64)
		if !ok || err != nil {
			t.Fatalf("the publisher's %s = %q is not :port", name, env[name])
		}
		return n
	}
	apiPort, metricsPort := port("VRAMQ_ADDR"), port("VRAMQ_METRICS_ADDR")
	if apiPort == metricsPort {
		t.Fatalf("the publisher serves the API and /metrics on the same port %d", apiPort)
	}
	tg := m.resource(t, "aws_lb_target_group", "publisher")
	if p := m.number(t, tg.Body.Attributes["port"].Expr, fargate); p != apiPort {
		t.Errorf("the target group's port %d is not the API's %d", p, apiPort)
	}

	// What the listener forwards: its default action and its rules.
	listener := m.resource(t, "aws_lb_listener", "publisher")
	for _, da := range blocksOf(listener.Body, "default_action") {
		if typ := m.attr(t, da, "type", fargate); typ.RawEquals(cty.StringVal("forward")) {
			t.Errorf("%s: the listener forwards every path by default, /metrics included", da.DefRange())
		}
	}
	forwarded := 0
	for name, rule := range m.resourcesOf("aws_lb_listener_rule") {
		if !refersTo(rule.Body.Attributes["listener_arn"].Expr, "aws_lb_listener", "publisher") {
			continue
		}
		var patterns []string
		for _, c := range blocksOf(rule.Body, "condition") {
			for _, pp := range blocksOf(c.Body, "path_pattern") {
				for _, v := range m.attr(t, pp, "values", fargate).AsValueSlice() {
					patterns = append(patterns, v.AsString())
				}
			}
		}
		if len(patterns) == 0 {
			t.Errorf("aws_lb_listener_rule.%s forwards without a path condition", name)
		}
		// "Quotas for your Application Load Balancers": condition values
		// per rule 5, not adjustable; AWS refuses a rule with more.
		if len(patterns) > 5 {
			t.Errorf("aws_lb_listener_rule.%s has %d path patterns; a rule takes at most 5 condition values", name, len(patterns))
		}
		for _, path := range []string{"/metrics", "/metrics/", "/Metrics"} {
			for _, p := range patterns {
				if albPathMatch(p, path) {
					t.Errorf("aws_lb_listener_rule.%s: pattern %q forwards %s", name, p, path)
				}
			}
		}
		for _, path := range []string{"/v1/jobs", "/v1/jobs/0123", "/healthz"} {
			if slices.ContainsFunc(patterns, func(p string) bool { return albPathMatch(p, path) }) {
				forwarded++
			}
		}
	}
	if forwarded < 3 {
		t.Error("the listener rules do not forward the job API (/v1/jobs, /v1/jobs/{id}, /healthz)")
	}

	// The balancer may only reach the API port; the metrics port takes the VPC.
	alb := m.resource(t, "aws_security_group", "publisher_alb")
	for _, e := range blocksOf(alb.Body, "egress") {
		from, to := m.number(t, e.Body.Attributes["from_port"].Expr, fargate), m.number(t, e.Body.Attributes["to_port"].Expr, fargate)
		if from != apiPort || to != apiPort {
			t.Errorf("%s: the load balancer may connect to ports %d-%d, not only the API's %d", e.DefRange(), from, to, apiPort)
		}
	}
	// The metrics port takes the scrapers named (metrics_ingress_cidr_blocks,
	// as the subscriber's does), never the whole VPC: any task or instance in
	// it could read every tenant's label (issue 25, item 15).
	tasks := m.resource(t, "aws_security_group", "publisher_tasks")
	ingress := blocksOf(tasks.Body, "ingress")
	for _, d := range blocksOf(tasks.Body, "dynamic") {
		if d.Labels[0] == "ingress" {
			ingress = append(ingress, blocksOf(d.Body, "content")...)
		}
	}
	scraped := false
	for _, in := range ingress {
		from, to := m.number(t, in.Body.Attributes["from_port"].Expr, fargate), m.number(t, in.Body.Attributes["to_port"].Expr, fargate)
		switch {
		case from == apiPort && to == apiPort:
		case from == metricsPort && to == metricsPort:
			scraped = true
			if a, ok := in.Body.Attributes["security_groups"]; ok && refersTo(a.Expr, "aws_security_group", "publisher_alb") {
				t.Errorf("%s: the load balancer may reach the metrics port", in.DefRange())
			}
			a, ok := in.Body.Attributes["cidr_blocks"]
			if !ok || !refersTo(a.Expr, "var", "metrics_ingress_cidr_blocks") || refersTo(a.Expr, "data", "aws_vpc") {
				t.Errorf("%s: the metrics port is open to more than the scrapers of var.metrics_ingress_cidr_blocks", in.DefRange())
			}
		default:
			t.Errorf("%s: the publisher tasks take ports %d-%d", in.DefRange(), from, to)
		}
	}
	if !scraped {
		t.Error("no ingress rule lets the scrapers of metrics_ingress_cidr_blocks reach the publisher's metrics port")
	}
	// Nobody by default.
	for _, d := range blocksOf(tasks.Body, "dynamic") {
		if d.Labels[0] != "ingress" {
			continue
		}
		for _, tc := range []struct {
			blocks cty.Value
			want   int
		}{{cty.ListValEmpty(cty.String), 0}, {strings2("10.0.5.0/24"), 1}} {
			o := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"), "metrics_ingress_cidr_blocks": tc.blocks}
			if v := m.eval(t, d.Body.Attributes["for_each"].Expr, o); !v.IsKnown() || v.LengthInt() != tc.want {
				t.Errorf("%s: metrics_ingress_cidr_blocks = %#v gives %#v ingress rules, want %d", d.DefRange(), tc.blocks, v, tc.want)
			}
		}
	}
}

// The Fargate publisher serves /metrics on a listener of its own, which the
// module names in VRAMQ_METRICS_ADDR: cmd/publisher must have the flag (an
// unknown variable would be ignored, and /metrics would be on the API port)
// and the task must set it. Either missing fails, never skips.
func TestThePublisherHasAMetricsListener(t *testing.T) {
	if !slices.Contains(flagNames(t, "publisher"), "metrics-addr") {
		t.Errorf("cmd/publisher has no -metrics-addr: the module's %s is ignored and /metrics is served on the API's port", envflag.Name("metrics-addr"))
	}
	env := containerEnv(t, root(t), "publisher", map[string]cty.Value{"publisher_mode": cty.StringVal("fargate")})
	if v, ok := env[envflag.Name("metrics-addr")]; !ok || v == "" {
		t.Errorf("the publisher task does not set %s (the -metrics-addr flag): /metrics stays on the API port", envflag.Name("metrics-addr"))
	}
}

// albPathMatch is an ALB path pattern: case-sensitive, * any run of
// characters, ? exactly one.
func albPathMatch(pattern, path string) bool {
	var b strings.Builder
	b.WriteString("^")
	for _, r := range pattern {
		switch r {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String()).MatchString(path)
}

// The subscriber writes its results and its failed and cancelled markers
// with payload.Store.PutIfAbsent, which reads the key first (the first write
// wins, and a retry finds it): a prefix it may put but not get fails every
// such write with AccessDenied on AWS, though not on the emulator, which
// checks no policy. Its failed markers went unwritten that way until this
// test. The rule holds for every prefix it writes: read what you write.
func TestTheSubscriberMayReadWhatItWrites(t *testing.T) {
	m := root(t)
	byAction := map[string]map[string]bool{}
	for _, st := range statements(m.data["aws_iam_policy_document.subscriber"].Body) {
		a, ok := st.Attributes["actions"]
		r, ok2 := st.Attributes["resources"]
		if !ok || !ok2 {
			continue
		}
		// The bucket's ARN is not known before apply: the resources are
		// told apart by their literal part, the key prefix.
		list, ok := r.Expr.(*hclsyntax.TupleConsExpr)
		if !ok {
			continue
		}
		for _, act := range m.eval(t, a.Expr, nil).AsValueSlice() {
			if byAction[act.AsString()] == nil {
				byAction[act.AsString()] = map[string]bool{}
			}
			for _, e := range list.Exprs {
				byAction[act.AsString()][literalText(e)] = true
			}
		}
	}
	if len(byAction["s3:PutObject"]) == 0 {
		t.Fatal("the subscriber's role may put no object")
	}
	for res := range byAction["s3:PutObject"] {
		if !byAction["s3:GetObject"][res] {
			t.Errorf("the subscriber may put %s but not get it: read what you write (PutIfAbsent reads first)", res)
		}
	}
}

// completion_events gives the subscriber the events topic (issue 20): its
// environment names it only when the topic exists.
func TestCompletionEventsReachTheSubscriber(t *testing.T) {
	m := root(t)
	if _, ok := subscriberEnv(t, m, nil)["VRAMQ_EVENTS_TOPIC_ARN"]; ok {
		t.Error("VRAMQ_EVENTS_TOPIC_ARN set with completion_events off")
	}
	env := subscriberEnv(t, m, map[string]cty.Value{"completion_events": cty.True})
	if _, ok := env["VRAMQ_EVENTS_TOPIC_ARN"]; !ok {
		t.Error("completion_events on, and the subscriber is not told the topic")
	}
}

// Issue 32, item 5: under Lambda the batch sweeper runs on an EventBridge
// schedule, which invokes the publisher's function (allowed to, from that
// rule alone) whenever the function exists.
func TestTheBatchSweepScheduleInvokesThePublisher(t *testing.T) {
	m := root(t)
	fn := m.resource(t, "aws_lambda_function", "publisher")
	rule := m.resource(t, "aws_cloudwatch_event_rule", "publisher_batch_sweep")
	target := m.resource(t, "aws_cloudwatch_event_target", "publisher_batch_sweep")
	perm := m.resource(t, "aws_lambda_permission", "publisher_batch_sweep")
	for _, b := range []*hclsyntax.Block{rule, target, perm} {
		if m.attr(t, b, "count", nil).Equals(m.attr(t, fn, "count", nil)).False() {
			t.Errorf("%s.%s exists where the publisher's function does not, or the other way round", b.Labels[0], b.Labels[1])
		}
	}
	expr := m.attr(t, rule, "schedule_expression", nil)
	if expr.IsNull() || !regexp.MustCompile(`^rate\(\d+ minutes?\)$`).MatchString(expr.AsString()) {
		t.Errorf("schedule_expression %#v: want rate(N minutes)", expr)
	}
	if !refersTo(target.Body.Attributes["rule"].Expr, "aws_cloudwatch_event_rule", "publisher_batch_sweep") ||
		!refersTo(target.Body.Attributes["arn"].Expr, "aws_lambda_function", "publisher") {
		t.Error("the schedule's target is not the publisher's function on the sweep rule")
	}
	if p := m.attr(t, perm, "principal", nil); !p.RawEquals(cty.StringVal("events.amazonaws.com")) ||
		!refersTo(perm.Body.Attributes["source_arn"].Expr, "aws_cloudwatch_event_rule", "publisher_batch_sweep") ||
		!refersTo(perm.Body.Attributes["function_name"].Expr, "aws_lambda_function", "publisher") {
		t.Error("the publisher's function does not let the sweep rule (and it alone) invoke it")
	}
}

// With completion events under Lambda, the topic invokes the publisher's
// function (allowed to, from that topic alone) with the events of batches'
// jobs, and no others.
func TestBatchCompletionEventsInvokeThePublisher(t *testing.T) {
	m := root(t)
	sub := m.resource(t, "aws_sns_topic_subscription", "publisher_batch_events")
	perm := m.resource(t, "aws_lambda_permission", "publisher_batch_events")
	for _, on := range []bool{false, true} {
		vars := map[string]cty.Value{"completion_events": cty.BoolVal(on)}
		want := m.attr(t, m.resource(t, "aws_lambda_function", "publisher"), "count", vars)
		if !on {
			want = cty.NumberIntVal(0)
		}
		for _, b := range []*hclsyntax.Block{sub, perm} {
			if got := m.attr(t, b, "count", vars); !got.RawEquals(want) {
				t.Errorf("completion_events %v: %s.%s count %#v; want %#v", on, b.Labels[0], b.Labels[1], got, want)
			}
		}
	}
	if p := m.attr(t, sub, "protocol", nil); !p.RawEquals(cty.StringVal("lambda")) ||
		!refersTo(sub.Body.Attributes["endpoint"].Expr, "aws_lambda_function", "publisher") ||
		!refersTo(sub.Body.Attributes["topic_arn"].Expr, "aws_sns_topic", "events") {
		t.Error("the subscription does not deliver the events topic to the publisher's function")
	}
	if f := m.attr(t, sub, "filter_policy", nil); f.IsNull() || !strings.Contains(f.AsString(), `"batch_id"`) ||
		!m.attr(t, sub, "filter_policy_scope", nil).RawEquals(cty.StringVal("MessageBody")) {
		t.Errorf("filter_policy %#v: want the events with a batch_id in their body alone", f)
	}
	if p := m.attr(t, perm, "principal", nil); !p.RawEquals(cty.StringVal("sns.amazonaws.com")) ||
		!refersTo(perm.Body.Attributes["source_arn"].Expr, "aws_sns_topic", "events") {
		t.Error("the publisher's function does not let the events topic (and it alone) invoke it")
	}
}
