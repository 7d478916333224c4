// Package floats compares and summarises the float slices tests produce.
package floats

import (
	"math"
	"slices"
)

// Median is the middle of xs (the upper middle of an even count); xs is
// left as it is.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// SameBits reports whether a and b hold the same bits, element by element:
// unlike ==, NaN equals NaN and -0 differs from +0.
func SameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}
