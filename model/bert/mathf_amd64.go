package bert

//go:noescape
func geluAVX2(xs *float32, n int)

//go:noescape
func expSubAVX2(dst, src *float32, n int, sub float32) (sum float64)

// hasVectorMath says whether gelu and softmax use the eight-lane versions
// in mathf_amd64.s (the same instructions as the matrix kernel's).
var hasVectorMath = hasFMAKernel

// geluVector applies GELU to the longest prefix of xs whose length is a
// multiple of 8 and returns how many elements that was.
func geluVector(xs []float32) int {
	n := len(xs) &^ 7
	if n > 0 {
		geluAVX2(&xs[0], n)
	}
	return n
}

// expSubVector sets dst[i] = e^(src[i] - sub) over the longest prefix of
// src whose length is a multiple of 8 (dst at least as long) and returns
// its length and the sum of those results.
func expSubVector(dst, src []float32, sub float32) (int, float64) {
	n := len(src) &^ 7
	if n == 0 {
		return 0, 0
	}
	_ = dst[n-1]
	return n, expSubAVX2(&dst[0], &src[0], n, sub)
}
