package infra_test

import (
	"testing"

	"github.com/zclconf/go-cty/cty"
)

// Issue 34 item 13: publisher_environment's VRAMQ_MAX_FILE_BYTES wins over
// the 4 MiB lambda mode sets, and nothing checked it: a larger file is
// taken by the publisher and then cannot travel in Lambda's 6 MB event (an
// upload) or response (a download), which API Gateway answers with a bare
// 500. The plan must refuse it, in every form the publisher parses
// (internal/bytesize), and take what fits.
func TestTheLambdaFileLimitFitsTheInvocation(t *testing.T) {
	m := root(t)
	fn := m.resource(t, "aws_lambda_function", "publisher")
	for _, tc := range []struct {
		size string
		ok   bool
	}{
		{"", true}, // not given: the module's 4 MiB
		{"1048576", true},
		{"4194304", true},
		{"4MiB", true},
		{"3.5 MiB", true},
		{"4000KB", true},
		{"4194305", false},
		{"5MiB", false},
		{"200MiB", false},
		{"1GB", false},
		{"0", false}, // the publisher's default, 200 MiB
		{"lots", false},
	} {
		env := map[string]cty.Value{"VRAMQ_LOG_LEVEL": cty.StringVal("info")}
		if tc.size != "" {
			env["VRAMQ_MAX_FILE_BYTES"] = cty.StringVal(tc.size)
		}
		o := map[string]cty.Value{"publisher_environment": cty.MapVal(env)}
		if got := allTrue(m.preconditions(t, fn, o)); got != tc.ok {
			t.Errorf("lambda mode, VRAMQ_MAX_FILE_BYTES=%q: accepted %v, want %v", tc.size, got, tc.ok)
		}
	}
}
