package infra_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
)

// edgeKeys turns the edge on in lambda mode, with bearer keys.
var edgeKeys = map[string]cty.Value{
	"publisher_edge":                cty.True,
	"publisher_api_keys_secret_arn": cty.StringVal("arn:aws:secretsmanager:eu-west-2:123456789012:secret:vramq-keys-AbCdEf"),
}

// Issue 34 item 6: the edge is off unless asked for, made only in lambda
// mode, and refused with SigV4 (AWS_IAM), whose signature covers the Host
// that the edge replaces with API Gateway's; with keys or JWT it passes,
// and the function is told the edge's origin (VRAMQ_PUBLIC_URL, a real
// flag of the publisher's) only when there is one.
func TestTheEdgeIsOptionalAndRefusesSigV4(t *testing.T) {
	m := root(t)
	dist := m.resource(t, "aws_cloudfront_distribution", "publisher")
	fn := m.resource(t, "aws_lambda_function", "publisher")
	for _, tc := range []struct {
		name     string
		override map[string]cty.Value
		made, ok bool
	}{
		{"the defaults", nil, false, true},
		{"keys, no edge", with(edgeKeys, "publisher_edge", cty.False), false, true},
		{"edge, keys", edgeKeys, true, true},
		{"edge, JWT", map[string]cty.Value{"publisher_edge": cty.True, "publisher_authorization": cty.StringVal("JWT")}, true, true},
		{"edge, the default AWS_IAM", map[string]cty.Value{"publisher_edge": cty.True}, true, false},
		{"edge, keys, fargate", with(edgeKeys, "publisher_mode", cty.StringVal("fargate")), false, true},
	} {
		if n := m.number(t, dist.Body.Attributes["count"].Expr, tc.override); (n == 1) != tc.made {
			t.Errorf("%s: %d distributions; want one: %v", tc.name, n, tc.made)
		}
		if !tc.made {
			continue
		}
		if got := allTrue(m.preconditions(t, dist, tc.override)); got != tc.ok {
			t.Errorf("%s: the distribution's preconditions pass: %v; want %v", tc.name, got, tc.ok)
		}
	}
	for _, on := range []bool{false, true} {
		env := m.eval(t, blocksOf(fn.Body, "environment")[0].Body.Attributes["variables"].Expr, with(edgeKeys, "publisher_edge", cty.BoolVal(on)))
		if !env.CanIterateElements() {
			t.Fatalf("the function's environment is not known as a map: %#v", env)
		}
		if got := env.Type().IsObjectType() && env.Type().HasAttribute("VRAMQ_PUBLIC_URL") ||
			env.Type().IsMapType() && env.HasIndex(cty.StringVal("VRAMQ_PUBLIC_URL")).True(); got != on {
			t.Errorf("publisher_edge = %v: the function gets VRAMQ_PUBLIC_URL: %v", on, got)
		}
	}
	if !slices.Contains(flagNames(t, "publisher"), "public-url") {
		t.Error("the publisher has no -public-url flag, which VRAMQ_PUBLIC_URL sets")
	}
}

// A presigned URL reaches S3 through the edge only as it was signed: the
// edge's bucket origin is the very host the publisher's S3 client presigns
// for (CloudFront sets the origin request's Host to it), its path pattern
// takes the presigned path unchanged (a file's key: job.FileKey), the query
// goes whole (all query strings; the managed policies would drop
// response-content-type, which is signed), nothing else goes (no headers,
// so no bearer key beside the signature), no origin access control signs
// on top, and nothing is cached.
func TestTheEdgePassesPresignedURLsAsSigned(t *testing.T) {
	m := root(t)
	dist := m.resource(t, "aws_cloudfront_distribution", "publisher")
	const bucket, region = "acme-vramq-payloads-20261128", "eu-west-2"

	client := s3.New(s3.Options{Region: region, Credentials: aws.CredentialsProviderFunc(func(ctx context.Context) (aws.Credentials, error) {
		return aws.Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "secret"}, nil
	})})
	presigned, err := payload.New(client, bucket).PresignGet(t.Context(), job.FileKey("acme", "file-0123"), "application/octet-stream", 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(presigned)
	if err != nil {
		t.Fatal(err)
	}

	origins := map[string]*hclsyntax.Block{}
	for _, o := range blocksOf(dist.Body, "origin") {
		origins[literalText(o.Body.Attributes["origin_id"].Expr)] = o
	}
	s3o, ok := origins["payloads"]
	if !ok {
		t.Fatalf("the distribution has no origin \"payloads\": %v", keys(origins))
	}
	ctx := m.context(t, edgeKeys)
	ctx.Variables["aws_s3_bucket"] = cty.ObjectVal(map[string]cty.Value{"payloads": cty.ObjectVal(map[string]cty.Value{"id": cty.StringVal(bucket)})})
	locals := ctx.Variables["local"].AsValueMap()
	locals["region"] = cty.StringVal(region)
	ctx.Variables["local"] = cty.ObjectVal(locals)
	domain, diags := s3o.Body.Attributes["domain_name"].Expr.Value(ctx)
	if diags.HasErrors() || !domain.IsKnown() || domain.AsString() != u.Host {
		t.Errorf("the bucket's origin is %#v (%v); the publisher presigns for %s", domain, diags, u.Host)
	}
	if _, oac := s3o.Body.Attributes["origin_access_control_id"]; oac {
		t.Error("the bucket's origin has an origin access control: CloudFront would sign the request too, which S3 refuses beside a presigned query")
	}
	if oai := blocksOf(s3o.Body, "s3_origin_config"); len(oai) != 1 || literalText(oai[0].Body.Attributes["origin_access_identity"].Expr) != "" {
		t.Error("the bucket's origin: want an s3_origin_config without an origin access identity")
	}

	behaviours := blocksOf(dist.Body, "ordered_cache_behavior")
	if len(behaviours) != 1 {
		t.Fatalf("%d ordered cache behaviours; want the bucket's alone", len(behaviours))
	}
	b := behaviours[0]
	pattern := m.eval(t, b.Body.Attributes["path_pattern"].Expr, edgeKeys).AsString()
	prefix, wild := strings.CutSuffix(pattern, "*")
	if !wild || strings.ContainsAny(prefix, "*?") || !strings.HasPrefix(u.Path, prefix) || strings.HasPrefix("/v1/files/x", prefix) {
		t.Errorf("the bucket's path pattern %q: want a prefix of the presigned path %s (job.FileKey) that no API route has", pattern, u.Path)
	}
	if literalText(b.Body.Attributes["target_origin_id"].Expr) != "payloads" {
		t.Error("the bucket's behaviour does not target the bucket's origin")
	}
	if !refersTo(b.Body.Attributes["origin_request_policy_id"].Expr, "aws_cloudfront_origin_request_policy", "presigned_get") {
		t.Error("the bucket's behaviour: want the presigned_get origin request policy (a managed one drops signed query parameters)")
	}
	for _, cb := range append(blocksOf(dist.Body, "default_cache_behavior"), b) {
		if !refersTo(cb.Body.Attributes["cache_policy_id"].Expr, "data", "aws_cloudfront_cache_policy") ||
			m.attr(t, m.data["aws_cloudfront_cache_policy.caching_disabled"], "name", edgeKeys).AsString() != "Managed-CachingDisabled" {
			t.Errorf("%s: want CachingDisabled", cb.Type)
		}
	}
	policy := m.resource(t, "aws_cloudfront_origin_request_policy", "presigned_get")
	for block, want := range map[string][2]string{
		"query_strings_config": {"query_string_behavior", "all"},
		"headers_config":       {"header_behavior", "none"},
		"cookies_config":       {"cookie_behavior", "none"},
	} {
		bs := blocksOf(policy.Body, block)
		if len(bs) != 1 || literalText(bs[0].Body.Attributes[want[0]].Expr) != want[1] {
			t.Errorf("presigned_get: want %s.%s = %q", block, want[0], want[1])
		}
	}
}

// TestTheEdgeApplies runs testdata/edge.tftest.hcl with terraform test
// against a mocked AWS provider, as TestTheModelServerModesApply does its
// file: the edge applies with keys (no cycle between the function and the
// distribution), is absent by default, and is refused with SigV4 by a real
// plan. It needs terraform >= 1.7 and the plugin mirror, and skips without
// them.
func TestTheEdgeApplies(t *testing.T) {
	w := terraformWorkspace(t)
	out, err := exec.Command(w.terraform, "version", "-json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Version string `json:"terraform_version"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	if compareVersions(v.Version, "1.7.0") < 0 {
		t.Skipf("terraform %s has no mock providers (1.7)", v.Version)
	}
	dir := filepath.Join(t.TempDir(), "infra")
	if err := copyModules(".", dir, w.version); err != nil {
		t.Fatal(err)
	}
	if compareVersions(w.version, "6.0.0") < 0 { // as TestTheModelServerModesApply
		p := filepath.Join(dir, "main.tf")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte("data.aws_region.current.region"), []byte("data.aws_region.current.name")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hcl, err := os.ReadFile("testdata/edge.tftest.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tests"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tests", "edge.tftest.hcl"), hcl, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, w.terraform, append([]string{"-chdir=" + dir}, args...)...)
		cmd.Env = w.env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("terraform %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("init", "-backend=false", "-input=false", "-no-color")
	if out := run("test", "-no-color"); !strings.Contains(out, "3 passed, 0 failed") {
		t.Errorf("terraform test:\n%s", out)
	}
}
