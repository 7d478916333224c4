package subscriber

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/wait"
)

// Issue 25, item 8: a message that runs out of memory even with the device
// to itself (dead-lettered) is its own problem, not evidence that batches
// are too big. With one such message in each round of 40, the batch limit
// was lowered to 1 at the innermost split every round (and saved so),
// although every batch without it fitted; it must stay at MaxBatch.
func TestCulpritDoesNotPinBatchLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{MaxBatch: 8, MaxBatchDelay: time.Second, MaxBatchBytes: 64 * mib, MaxInflight: 40})
		const rounds, perRound = 3, 40
		for r := range rounds {
			for i := range perRound {
				spec := "mb=4 ms=50"
				if i == 13 {
					spec = "mb=4 lie=40 ms=50" // 160 MiB really: never fits
				}
				h.send(fmt.Sprint("round", r), i, spec)
			}
			wait.For(t, 10*time.Minute, fmt.Sprint("round ", r), func() bool {
				res, _ := h.results.Stats()
				d, _ := h.dlq.Stats()
				return res+d == (r+1)*perRound
			})
		}
		h.shutdown()
		if n := counter(h.sub.m.oomRetries); n == 0 {
			t.Fatal("no out-of-memory split: the test does not exercise the culprit")
		}
		reasons := h.reasons()
		if len(reasons) != rounds {
			t.Errorf("dead letters %v, want the %d culprits", reasons, rounds)
		}
		for key, reason := range reasons {
			if !strings.HasSuffix(key, "/13") || !strings.HasPrefix(reason, "out_of_memory") {
				t.Errorf("dead letter %s: %q, want the culprits' out_of_memory", key, reason)
			}
		}
		if lim := h.sub.state.batchLimit(); lim != 8 {
			t.Errorf("batch limit %d after %d rounds with one culprit each, want 8 (every batch without it fitted)", lim, rounds)
		}
		if n := counter(h.sub.m.batchLimitChanges.WithLabelValues("oom")); n != 0 {
			t.Errorf("batch limit lowered %d times for culprits", n)
		}
		got, _ := h.resultsByKey()
		if len(got) != rounds*(perRound-1) {
			t.Errorf("%d results, want %d", len(got), rounds*(perRound-1))
		}
	})
}
