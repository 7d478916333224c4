package strategies

import (
	"github.com/vramq/vramq/bench/timed"
)

// Bound is the offline bound: the most messages per second any scheduler
// could get from the workload on the simulated device, knowing every
// message in advance. It is the larger of two lower bounds on the time to
// run them all:
//
//   - Work: the device's throughput is shared, so the work of every message,
//     Σcost/throughput, takes that long however it is packed, plus at least
//     one launch before the first work starts.
//   - Memory: a message holds its cost in device memory while its batch
//     works, for at least cost/throughput (longer when its batch has others
//     or shares the device), and at most the budget is held at once, so
//     Σcost²/throughput/budget is a second bound. It binds when the budget
//     is small against the large messages.
//
// No packing of the same messages into the budget can beat it, so a
// strategy's throughput over it is a fraction of the best possible.
type Bound struct {
	WorkSeconds   float64 `json:"work_seconds"`
	MemorySeconds float64 `json:"memory_seconds"`
	Seconds       float64 `json:"seconds"`
	MessagesPerS  float64 `json:"messages_per_second"`
	Binding       string  `json:"binding"`
}

func offlineBound(costs []int64, t timed.Timing, budget int64) Bound {
	var work, memory float64
	for _, c := range costs {
		secs := float64(c) / t.Throughput
		work += secs
		memory += float64(c) * secs / float64(budget)
	}
	b := Bound{WorkSeconds: work + t.Launch.Seconds(), MemorySeconds: memory}
	b.Seconds, b.Binding = b.WorkSeconds, "device throughput"
	if b.MemorySeconds > b.WorkSeconds {
		b.Seconds, b.Binding = b.MemorySeconds, "memory"
	}
	if b.Seconds > 0 {
		b.MessagesPerS = float64(len(costs)) / b.Seconds
	}
	return b
}

// offlineBoundN is the offline bound for n subscribers, each with its own
// device of budget and throughput: the work is shared by n devices (one
// launch still comes before any work), and so is the memory-time. It
// ignores that a message cannot be split between devices, so it stays an
// upper bound.
func offlineBoundN(costs []int64, t timed.Timing, budget int64, n int) Bound {
	b := offlineBound(costs, t, budget)
	if n <= 1 {
		return b
	}
	b.WorkSeconds = (b.WorkSeconds-t.Launch.Seconds())/float64(n) + t.Launch.Seconds()
	b.MemorySeconds /= float64(n)
	b.Seconds, b.Binding = b.WorkSeconds, "device throughput"
	if b.MemorySeconds > b.WorkSeconds {
		b.Seconds, b.Binding = b.MemorySeconds, "memory"
	}
	if b.Seconds > 0 {
		b.MessagesPerS = float64(len(costs)) / b.Seconds
	}
	return b
}
