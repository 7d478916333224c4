package infra_test

import (
	"testing"

	"github.com/zclconf/go-cty/cty"
)

// expirationDays is what the bucket's lifecycle rules expire, by prefix:
// the for_each of aws_s3_bucket_lifecycle_configuration.payloads's dynamic
// rule, evaluated with override.
func expirationDays(t *testing.T, m *module, override map[string]cty.Value) map[string]int64 {
	t.Helper()
	lc := m.resource(t, "aws_s3_bucket_lifecycle_configuration", "payloads")
	for _, d := range blocksOf(lc.Body, "dynamic") {
		if d.Labels[0] != "rule" {
			continue
		}
		v := m.eval(t, d.Body.Attributes["for_each"].Expr, override)
		if !v.IsWhollyKnown() || v.IsNull() {
			t.Fatalf("the lifecycle rules' for_each is not known with %v", override)
		}
		out := map[string]int64{}
		for it := v.ElementIterator(); it.Next(); {
			k, days := it.Element()
			out[k.AsString()] = toInt(t, days)
		}
		return out
	}
	t.Fatal("aws_s3_bucket_lifecycle_configuration.payloads has no dynamic rule")
	return nil
}

// Issue 34 item 13: payload_expiration_days is a map, and Terraform replaces
// a map variable's default whole: { results = 30 } left every other prefix
// without a lifecycle rule, so nothing else ever expired. Each key given
// must change its prefix only, and the pairs that must keep an order
// (files/ over batches/, done/ over jobs/) are refused out of it at plan
// time.
func TestOneExpiryOverrideKeepsTheOthers(t *testing.T) {
	m := root(t)
	defaults := expirationDays(t, m, nil)
	o := map[string]cty.Value{"payload_expiration_days": cty.MapVal(map[string]cty.Value{"results": cty.NumberIntVal(30)})}
	got := expirationDays(t, m, o)
	for p, d := range defaults {
		want := d
		if p == "results" {
			want = 30
		}
		if got[p] != want {
			t.Errorf("with { results = 30 }: %s/ expires after %d days; want %d", p, got[p], want)
		}
	}
	if len(got) != len(defaults) {
		t.Errorf("with { results = 30 }: %d prefixes expire; want the %d of the defaults", len(got), len(defaults))
	}

	lc := m.resource(t, "aws_s3_bucket_lifecycle_configuration", "payloads")
	for _, tc := range []struct {
		days map[string]int64
		ok   bool
	}{
		{map[string]int64{"results": 30}, true},
		{map[string]int64{"batches": 40}, false}, // records outlive their output files
		{map[string]int64{"files": 40, "batches": 40}, true},
		{map[string]int64{"done": 5}, false}, // markers gone while manifests are there
		{map[string]int64{"done": 5, "jobs": 5}, true},
		{map[string]int64{"jobs": 30, "done": 30}, true},
	} {
		vals := map[string]cty.Value{}
		for k, v := range tc.days {
			vals[k] = cty.NumberIntVal(v)
		}
		o := map[string]cty.Value{"payload_expiration_days": cty.MapVal(vals)}
		if !m.validates(t, "payload_expiration_days", o["payload_expiration_days"]) {
			t.Errorf("payload_expiration_days = %v: refused by its validation", tc.days)
			continue
		}
		if got := allTrue(m.preconditions(t, lc, o)); got != tc.ok {
			t.Errorf("payload_expiration_days = %v: accepted at plan time %v, want %v", tc.days, got, tc.ok)
		}
	}
}
