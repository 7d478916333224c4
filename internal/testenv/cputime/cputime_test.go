package cputime

import (
	"testing"
	"time"
)

// A busy loop of 50 ms of wall time uses CPU time, and sleeping adds
// (almost) none.
func TestProcess(t *testing.T) {
	start := Process()
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	busy := Process() - start
	if busy <= 0 {
		t.Fatalf("a 50 ms busy loop used %v of CPU", busy)
	}
	start = Process()
	time.Sleep(100 * time.Millisecond)
	if idle := Process() - start; idle >= 50*time.Millisecond {
		t.Errorf("sleeping 100 ms used %v of CPU", idle)
	}
}
