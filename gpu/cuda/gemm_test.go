package cuda

import (
	"math"
	"math/rand/v2"
	"testing"
)

// sgemmColumnMajor is BLAS's SGEMM with no transposition and alpha 1, beta 0,
// by its definition: C[i + j·ldc] = Σp A[i + p·lda] · B[p + j·ldb].
func sgemmColumnMajor(s gemmShape, a, b, c []float32) {
	for j := range s.n {
		for i := range s.m {
			var sum float64
			for p := range s.k {
				sum += float64(a[i+p*s.lda]) * float64(b[p+j*s.ldb])
			}
			c[i+j*s.ldc] = float32(sum)
		}
	}
}

// The arguments the CUDA backend gives cuBLAS compute the row-major product
// the CPU model computes (refembed's matMulBias, by its definition, bias 0):
// a wrong transpose or leading dimension would not.
func TestRowMajorGemmMatchesMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 0))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = 2*r.Float32() - 1
		}
		return x
	}
	for _, sh := range []struct{ rows, k, m int }{{1, 1, 1}, {3, 5, 7}, {8, 256, 1024}, {5, 1024, 256}} {
		act, w := fill(sh.rows*sh.k), fill(sh.k*sh.m)
		want := make([]float32, sh.rows*sh.m)
		for i := range sh.rows {
			for j := range sh.m {
				var sum float64
				for p := range sh.k {
					sum += float64(act[i*sh.k+p]) * float64(w[p*sh.m+j])
				}
				want[i*sh.m+j] = float32(sum)
			}
		}
		got := make([]float32, sh.rows*sh.m)
		// The backend passes the weights as BLAS's A and the activations as its B.
		sgemmColumnMajor(rowMajorGemm(sh.rows, sh.k, sh.m), w, act, got)
		for i := range want {
			if d := math.Abs(float64(got[i] - want[i])); d > 1e-4 {
				t.Fatalf("rows %d, k %d, m %d: element %d is %v, want %v", sh.rows, sh.k, sh.m, i, got[i], want[i])
			}
		}
	}
}
