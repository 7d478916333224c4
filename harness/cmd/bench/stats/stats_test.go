package stats

import (
	"math"
	"slices"
	"testing"
)

func TestMedianOf(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{10, 10, 1, 1000, 11}, 10}, // an outlier run moves the median nowhere
	} {
		in := slices.Clone(tc.xs)
		if got := Median(tc.xs); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
		if !slices.Equal(in, tc.xs) {
			t.Errorf("Median reordered its argument: %v, was %v", tc.xs, in)
		}
	}
	if got := Median(nil); !math.IsNaN(got) {
		t.Errorf("Median(nil) = %v, want NaN", got)
	}
}

func TestRotationGivesEveryVariantEveryPlace(t *testing.T) {
	const n = 4
	first := map[int]bool{}
	for trial := range n {
		order := Rotation(n, trial)
		if got := slices.Sorted(slices.Values(order)); !slices.Equal(got, []int{0, 1, 2, 3}) {
			t.Fatalf("trial %d: order %v is not a permutation of 0..3", trial, order)
		}
		first[order[0]] = true
	}
	if len(first) != n {
		t.Errorf("in %d trials only variants %v ran first", n, first)
	}
}

func TestPairedRatios(t *testing.T) {
	if got := PairedRatios([]float64{2, 9, 4}, []float64{4, 3}); !slices.Equal(got, []float64{0.5, 3}) {
		t.Errorf("PairedRatios = %v, want [0.5 3] (pairs only as far as both go)", got)
	}
}
