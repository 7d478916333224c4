// Package wait polls a condition in a test until it holds.
package wait

import (
	"testing"
	"time"
)

// For polls cond every 50ms until it holds, and fails t when limit passes
// first. In a testing/synctest bubble each sleep advances the bubble's clock.
func For(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after %v", what, limit)
		}
	}
}
