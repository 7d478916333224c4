// Package stats holds the arithmetic the benchmarks share: medians and
// per-trial ratios over trials, percentiles, and the order the variants
// take turns in.
package stats

import (
	"math"
	"slices"
)

// Median is the median of xs (the mean of the middle two for an even
// count); NaN for none. xs is not changed.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// PairedRatios divides a[i] by b[i]: figures from the same trial, measured
// minutes apart at most, so a drift in the machine's load over the run
// cancels out of each.
func PairedRatios(a, b []float64) []float64 {
	out := make([]float64, min(len(a), len(b)))
	for i := range out {
		out[i] = a[i] / b[i]
	}
	return out
}

// Rotation is the order of n variants in trial t: each trial starts one
// further along, so no variant always runs first (on a cold connection
// pool) or right after the same neighbour.
func Rotation(n, t int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = (i + t) % n
	}
	return order
}

// Percentile is the q-quantile of xs by the nearest-rank method; 0 for none.
func Percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
