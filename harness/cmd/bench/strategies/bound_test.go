package strategies

import (
	"math"
	"testing"
	"time"

	"github.com/vramq/vramq/bench/timed"
)

// TestOfflineBoundN checks the bound for n devices against the arithmetic
// written out: n devices share the work (one launch still comes first) and
// the memory-time.
func TestOfflineBoundN(t *testing.T) {
	tm := timed.Timing{Launch: 10 * time.Millisecond, Throughput: 1 << 20}
	costs := []int64{1 << 20, 1 << 20, 4 << 20} // 6 s of work at 1 MiB/s
	budget := int64(8 << 20)
	one := offlineBoundN(costs, tm, budget, 1)
	if one != offlineBound(costs, tm, budget) {
		t.Fatalf("n=1 differs from the one-device bound: %+v", one)
	}
	if math.Abs(one.WorkSeconds-6.01) > 1e-9 {
		t.Fatalf("one device's work bound %.4f s, want 6.01", one.WorkSeconds)
	}
	three := offlineBoundN(costs, tm, budget, 3)
	if math.Abs(three.WorkSeconds-(6.0/3+0.01)) > 1e-9 {
		t.Errorf("three devices' work bound %.4f s, want 2.01", three.WorkSeconds)
	}
	// Memory-time: (1+1+16) MiB·s / 8 MiB = 2.25 s on one device.
	if math.Abs(one.MemorySeconds-2.25) > 1e-9 || math.Abs(three.MemorySeconds-0.75) > 1e-9 {
		t.Errorf("memory bounds %.4f and %.4f s, want 2.25 and 0.75", one.MemorySeconds, three.MemorySeconds)
	}
	if want := 3 / 2.01; math.Abs(three.MessagesPerS-want) > 1e-9 || three.Binding != "device throughput" {
		t.Errorf("three devices: %.4f messages/s bound by %s, want %.4f by device throughput", three.MessagesPerS, three.Binding, want)
	}
}
