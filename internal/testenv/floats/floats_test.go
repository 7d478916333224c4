package floats

import (
	"math"
	"slices"
	"testing"
)

func TestMedian(t *testing.T) {
	xs := []float64{5, 1, 4, 2}
	if got := Median(xs); got != 4 {
		t.Errorf("Median(%v) = %v, want 4 (the upper middle)", xs, got)
	}
	if !slices.Equal(xs, []float64{5, 1, 4, 2}) {
		t.Errorf("Median sorted its argument: %v", xs)
	}
	if got := Median([]float64{3, 9, 1}); got != 3 {
		t.Errorf("Median = %v, want 3", got)
	}
}

func TestSameBits(t *testing.T) {
	nan := float32(math.NaN())
	negZero := float32(math.Copysign(0, -1))
	for _, tc := range []struct {
		a, b []float32
		want bool
	}{
		{[]float32{1, 2}, []float32{1, 2}, true},
		{[]float32{nan}, []float32{nan}, true},
		{[]float32{0}, []float32{negZero}, false},
		{[]float32{1}, []float32{1, 2}, false},
	} {
		if got := SameBits(tc.a, tc.b); got != tc.want {
			t.Errorf("SameBits(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
