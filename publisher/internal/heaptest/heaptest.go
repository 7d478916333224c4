// Package heaptest measures the heap a piece of code takes, for the
// publisher's memory tests and benchmarks.
package heaptest

import (
	"runtime"
	rtmetrics "runtime/metrics"
	"sync"
	"time"
)

// Peak runs f and returns the most the heap's live objects grew over what
// they were before it, sampled every millisecond while it ran.
func Peak(f func()) uint64 {
	sample := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { rtmetrics.Read(sample); return sample[0].Value.Uint64() }
	runtime.GC()
	base := read()
	var peak uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			peak = max(peak, read())
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	f()
	close(done)
	wg.Wait()
	return max(peak, base) - base
}

// Timed runs f: the seconds it took, and the heap's peak above what it was
// before, in MiB (Peak).
func Timed(f func()) (seconds, mib float64) {
	t0 := time.Now()
	mib = float64(Peak(f)) / (1 << 20)
	return time.Since(t0).Seconds(), mib
}
