package job

import "testing"

// The layout as docs/schemas.md and the deployed buckets know it: a key that
// moves strands what a running publisher or subscriber already wrote.
func TestBucketLayout(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		// sha256("i0"), as `printf i0 | sha256sum` gives it.
		{ItemKey("j1", "i0"), "payloads/j1/a4e167a76a05add8a8654c169b07b0447a916035aef602df103e8ae0fe2ff390.json"},
		{ManifestKey("j1"), "jobs/j1.json"},
		{IdempotencyKey("ab12"), "idempotency/ab12.json"},
		{ResultKey("j1", 7), "results/j1/7.json"},
		{FailedKey("j1", 7), "failed/j1/7.json"},
		{ResultPrefix("j1"), "results/j1/"},
		{FailedPrefix("j1"), "failed/j1/"},
		{CancelKey("j1"), "cancel/j1.json"},
		{CancelledKey("j1", 7), "cancelled/j1/7.json"},
		{CancelledPrefix("j1"), "cancelled/j1/"},
		{ItemErrorsKey("j1", 7), "itemerrors/j1/7.json"},
		{ItemErrorsPrefix("j1"), "itemerrors/j1/"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}
