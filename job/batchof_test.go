package job

import "testing"

// A Message Batch's job is a batch's too, so its completion event names it
// and the publisher's function finalizes it.
func TestBatchOfMessageBatches(t *testing.T) {
	for id, want := range map[string]string{
		"msgbatch_0193a1b2c3d4e5f60718293a4b5c6d7e": "msgbatch_0193a1b2c3d4e5f60718293a4b5c6d7e",
		"msgbatch_":   "",
		"xmsgbatch_1": "",
	} {
		if got := BatchOf(id); got != want {
			t.Errorf("BatchOf(%q) = %q; want %q", id, got, want)
		}
	}
}
