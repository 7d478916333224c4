package batcher

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAdd is the batcher's cost per item in calls of ten that fill at
// once, with a handler that does nothing: on the caller's goroutine, and on
// a goroutine per call.
func BenchmarkAdd(b *testing.B) {
	for _, onCaller := range []bool{true, false} {
		name := "goroutine"
		if onCaller {
			name = "caller"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			bt := New(Options{MaxItems: 10, MaxDelay: 200 * time.Millisecond, OnCaller: onCaller}, func([]int) {})
			for i := 0; b.Loop(); i++ {
				bt.Add(i, 1)
			}
			if err := bt.Shutdown(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}
