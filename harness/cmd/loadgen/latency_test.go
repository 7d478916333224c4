package main

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPercentileIsNearestRank(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"one value", ms(7), 99, 7 * time.Millisecond},
		{"p0 is the least", ms(1, 2, 3), 0, 1 * time.Millisecond},
		{"p100 is the most", ms(1, 2, 3), 100, 3 * time.Millisecond},
		{"median of odd", ms(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		// Nearest rank never interpolates: of 1..4, half are at most 2.
		{"median of even", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p90 of 1..100", ms(hundred...), 90, 90 * time.Millisecond},
		{"p99 of 1..100", ms(hundred...), 99, 99 * time.Millisecond},
		// Ten values: p99 needs the 10th, the maximum, not the 9th.
		{"p99 of ten", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{"p90 of ten", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 90, 9 * time.Millisecond},
	} {
		if got := percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("%s: percentile(%v) = %v, want %v", tc.name, tc.p, got, tc.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	if got := summarize(nil); got != nil {
		t.Errorf("summarize(nil) = %+v, want nil: no results, no latency", got)
	}
	// 1..1000 ms, shuffled: summarize must sort them itself.
	ds := make([]time.Duration, 1000)
	for i := range ds {
		ds[i] = time.Duration(i+1) * time.Millisecond
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(ds), func(i, j int) { ds[i], ds[j] = ds[j], ds[i] })
	want := &Latency{Count: 1000, Mean: 0.5005, P50: 0.5, P90: 0.9, P99: 0.99, Max: 1}
	if diff := cmp.Diff(want, summarize(ds)); diff != "" {
		t.Errorf("summarize (-want +got):\n%s", diff)
	}
}
