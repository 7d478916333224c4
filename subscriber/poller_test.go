package subscriber

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vramq/vramq/internal/testenv/wait"
)

// Messages count as waiting from their receipt, before they are decoded (so
// that the receive that goes out meanwhile asks only for the room left),
// and one that never starts (malformed, too large) stops counting when it
// leaves: otherwise every such message would shrink the prefetch buffer for
// good, and with a buffer of two the good messages behind them would never
// be received.
func TestWaitingCountsEachMessageUntilItStartsOrLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{Prefetch: 2})
		for range 3 {
			h.work.Put("not json", nil)
		}
		h.send("big", 0, "mb=100") // more than the whole device
		for i := range 3 {
			h.send("ok", i, "mb=1 ms=10")
		}
		wait.For(t, time.Minute, "3 results and 4 dead letters", func() bool {
			r, _ := h.results.Stats()
			d, _ := h.dlq.Stats()
			return r == 3 && d == 4
		})
		if w := h.sub.waiting.Load(); w != 0 {
			t.Errorf("%d messages still counted as waiting", w)
		}
		if g := testutil.ToFloat64(h.sub.m.waiting); g != 0 {
			t.Errorf("waiting gauge at %v, want 0", g)
		}
		h.shutdown()
	})
}
