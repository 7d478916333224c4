package infra_test

import (
	"strings"
	"testing"

	"github.com/zclconf/go-cty/cty"
)

// routeAuthorization evaluates the API Gateway route resource's
// authorization_type for each route key of local.publisher_routes, with
// override.
func routeAuthorization(t *testing.T, m *module, override map[string]cty.Value) map[string]string {
	t.Helper()
	routes := m.eval(t, m.locals["publisher_routes"].Expr, override)
	r := m.resource(t, "aws_apigatewayv2_route", "publisher")
	out := map[string]string{}
	for it := routes.ElementIterator(); it.Next(); {
		k, v := it.Element()
		ctx := m.context(t, override)
		ctx.Variables["each"] = cty.ObjectVal(map[string]cty.Value{"key": k, "value": v})
		a, diags := r.Body.Attributes["authorization_type"].Expr.Value(ctx)
		if diags.HasErrors() || !a.IsKnown() || a.IsNull() {
			t.Fatalf("route %s: authorization_type is not known with %s: %v", k.AsString(), settings(override), diags)
		}
		out[k.AsString()] = a.AsString()
	}
	return out
}

// exampleSettings is what examples/complete passes to the module for the
// publisher's authorization, at the example's defaults; a secret the
// example creates (its ARN known only after apply) stands as a complete
// ARN.
func exampleSettings(t *testing.T) map[string]cty.Value {
	t.Helper()
	var ex *module
	for _, m := range modules(t) {
		if m.dir == "examples/complete" {
			ex = m
		}
	}
	if ex == nil {
		t.Fatal("no examples/complete")
	}
	out := map[string]cty.Value{}
	for _, body := range ex.bodies {
		for _, b := range blocksOf(body, "module") {
			if len(b.Labels) != 1 || b.Labels[0] != "vramq" {
				continue
			}
			for _, name := range []string{"publisher_mode", "publisher_authorization", "publisher_api_keys_secret_arn"} {
				a, ok := b.Body.Attributes[name]
				if !ok {
					continue
				}
				v := ex.eval(t, a.Expr, nil)
				if !v.IsKnown() && name == "publisher_api_keys_secret_arn" {
					v = cty.StringVal("arn:aws:secretsmanager:us-east-1:111122223333:secret:vramq-publisher-keys-AbCdEf")
				}
				out[name] = v
			}
			return out
		}
	}
	t.Fatal("examples/complete has no module \"vramq\"")
	return nil
}

// openAIRoute reports whether a route key is one of the OpenAI API's
// (Files, Batch), which clients call with an OpenAI SDK.
func openAIRoute(key string) bool {
	return strings.Contains(key, " /v1/files") || strings.Contains(key, " /v1/batches")
}

// Issue 34 item 7: with the example's defaults the routes were AWS_IAM, so
// a client of the Files or Batch API with an OpenAI SDK, which sends
// Authorization: Bearer <key>, got API Gateway's 403 and never reached the
// function. Each OpenAI route must take a credential an SDK sends, and not
// be open to anyone: NONE at the gateway with the publisher's keys given
// (it checks them), or a JWT authorizer (the SDK sends the token as its
// key).
func TestTheExampleLetsTheOpenAISDKsIn(t *testing.T) {
	m := root(t)
	o := exampleSettings(t)
	if mode, ok := o["publisher_mode"]; ok && mode.IsKnown() && !mode.RawEquals(cty.StringVal("lambda")) {
		t.Skipf("the example's default publisher_mode is %s; this checks lambda mode's gateway", mode.GoString())
	}
	keys := o["publisher_api_keys_secret_arn"]
	withKeys := keys != cty.NilVal && keys.IsKnown() && !keys.IsNull()
	n := 0
	for route, auth := range routeAuthorization(t, m, o) {
		if !openAIRoute(route) {
			continue
		}
		n++
		switch {
		case auth == "JWT":
		case auth == "NONE" && withKeys:
		case auth == "NONE":
			t.Errorf("the example's %s: no authorization and no bearer keys: open to anyone", route)
		default:
			t.Errorf("the example's %s: %s, which an OpenAI SDK (Authorization: Bearer <key>) cannot pass", route, auth)
		}
	}
	if n == 0 {
		t.Fatal("no Files or Batch route in local.publisher_routes")
	}
	if a := m.resource(t, "aws_apigatewayv2_api", "publisher"); !allTrue(m.preconditions(t, a, o)) {
		t.Errorf("the example's settings (%s) are refused at plan time", settings(o))
	}
}

// The publisher checks its bearer keys in the Authorization header on
// every route, the header SigV4 and a JWT travel in: keys with AWS_IAM or
// JWT at the gateway let no request through both, so the plan refuses
// them; keys alone make the gateway pass every route to the publisher, and
// no keys leave the module's default, SigV4.
func TestBearerKeysAndGatewayAuthorizationAreOneChoice(t *testing.T) {
	m := root(t)
	api := m.resource(t, "aws_apigatewayv2_api", "publisher")
	arn := cty.StringVal("arn:aws:secretsmanager:us-east-1:111122223333:secret:vramq-keys-AbCdEf")
	null := cty.NullVal(cty.String)
	for _, tc := range []struct {
		auth, keys cty.Value
		ok         bool
		want       string // the authorised routes' authorization_type
	}{
		{null, null, true, "AWS_IAM"},
		{null, arn, true, "NONE"},
		{cty.StringVal("NONE"), arn, true, "NONE"},
		{cty.StringVal("AWS_IAM"), arn, false, ""},
		{cty.StringVal("JWT"), arn, false, ""},
		{cty.StringVal("AWS_IAM"), null, true, "AWS_IAM"},
		{cty.StringVal("JWT"), null, true, "JWT"},
		{cty.StringVal("NONE"), null, true, "NONE"},
	} {
		o := map[string]cty.Value{"publisher_authorization": tc.auth, "publisher_api_keys_secret_arn": tc.keys}
		if !m.validates(t, "publisher_authorization", tc.auth) {
			t.Errorf("publisher_authorization = %s: refused by its validation", tc.auth.GoString())
			continue
		}
		if got := allTrue(m.preconditions(t, api, o)); got != tc.ok {
			t.Errorf("%s: accepted at plan time %v, want %v", settings(o), got, tc.ok)
		}
		if !tc.ok {
			continue
		}
		for route, auth := range routeAuthorization(t, m, o) {
			want := tc.want
			if strings.HasSuffix(route, " /healthz") {
				want = "NONE"
			}
			if auth != want {
				t.Errorf("%s: route %s is %s; want %s", settings(o), route, auth, want)
			}
		}
	}
	for _, bad := range []string{"BEARER", ""} {
		if m.validates(t, "publisher_authorization", cty.StringVal(bad)) {
			t.Errorf("publisher_authorization takes %q, which API Gateway does not know", bad)
		}
	}
}
