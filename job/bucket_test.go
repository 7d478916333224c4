package job

import (
	"strings"
	"testing"
)

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
		// sha256(""), the owner of a publisher without keys.
		{OpenBatchKey("", "batch_x"), "batches/open/e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855/batch_x"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}

// An open batch's marker names its record: the sweeper reads no marker.
// Anything else under the prefix names none.
func TestOpenBatchKeyNamesTheRecord(t *testing.T) {
	for _, owner := range []string{"", "tenant-a"} {
		id := "batch_0193a1b2c3d4e5f60718293a4b5c6d7e"
		open := OpenBatchKey(owner, id)
		if !strings.HasPrefix(open, OpenBatchesPrefix) || strings.HasPrefix(open, BatchesPrefix(owner)) {
			t.Errorf("OpenBatchKey(%q) = %q: want it under %s and apart from the owner's batches", owner, open, OpenBatchesPrefix)
		}
		if rec, ok := OpenBatchRecord(open); !ok || rec != BatchKey(owner, id) {
			t.Errorf("OpenBatchRecord(%q) = %q, %v; want %q", open, rec, ok, BatchKey(owner, id))
		}
	}
	for _, k := range []string{"batches/x.json", OpenBatchesPrefix, OpenBatchesPrefix + "abc/"} {
		if rec, ok := OpenBatchRecord(k); ok {
			t.Errorf("OpenBatchRecord(%q) = %q; want none", k, rec)
		}
	}
}
