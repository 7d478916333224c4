package bert

import (
	"github.com/vramq/vramq/internal/testenv/cputime"

	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestMatMulAdd holds the tiled product, with each kernel and through each
// entry point, against a float64 triple loop: shapes with partial tiles of
// rows and columns, leading dimensions wider than the matrices, C's old
// contents added to, and the padding between rows left untouched.
func TestMatMulAdd(t *testing.T) {
	type entry struct {
		name string
		f    func(c []float32, ldc int, a []float32, lda int, b []float32, ldb int, m, n, k int)
	}
	rowsWith := func(ks kernels) func(c []float32, ldc int, a []float32, lda int, b []float32, ldb int, m, n, k int) {
		return func(c []float32, ldc int, a []float32, lda int, b []float32, ldb int, m, n, k int) {
			matMulAddRows(ks, c, ldc, a, lda, b, ldb, m, n, k)
		}
	}
	entries := []entry{
		{"kernelGo", rowsWith(goKernels)},
		{"matMulAdd", matMulAdd},
		{"matMulAddParallel", matMulAddParallel},
	}
	if hasFMAKernel {
		entries = append(entries, entry{"kernelFMA", rowsWith(avx2Kernels)})
	} else {
		t.Logf("no AVX2+FMA here: the assembly kernels are not tested")
	}
	if hasAVX512Kernel {
		entries = append(entries, entry{"kernelAVX512", rowsWith(avx512Kernels)})
	} else {
		t.Logf("no AVX-512 here: its kernel is not tested")
	}
	r := rand.New(rand.NewPCG(5, 5))
	type shape struct{ m, n, k int }
	var shapes []shape
	for _, m := range []int{1, 5, 6, 7, 13, 48, 49, 100} {
		for _, n := range []int{1, 15, 16, 17, 32, 40, 64, 65, 80, 130} {
			for _, k := range []int{0, 1, 3, 32, 100} {
				shapes = append(shapes, shape{m, n, k})
			}
		}
	}
	shapes = append(shapes, shape{130, 384, 384}, shape{64, 64, 1536}, shape{97, 1152, 40})
	for _, e := range entries {
		for _, s := range shapes {
			lda, ldb, ldc := s.k+r.IntN(3), s.n+r.IntN(3), s.n+r.IntN(3)
			a := randSlice(r, max(0, (s.m-1)*lda+s.k))
			b := randSlice(r, max(0, (s.k-1)*ldb+s.n))
			c := randSlice(r, max(0, (s.m-1)*ldc+s.n))
			c0 := append([]float32(nil), c...)
			e.f(c, ldc, a, lda, b, ldb, s.m, s.n, s.k)
			if err := checkProduct(c, c0, ldc, a, lda, b, ldb, s.m, s.n, s.k); err != nil {
				t.Fatalf("%s, %d×%d·%d×%d (lda %d, ldb %d, ldc %d): %v", e.name, s.m, s.k, s.k, s.n, lda, ldb, ldc, err)
			}
		}
	}
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// checkProduct says whether c = c0 + a·b to float32 accuracy: each element
// within 1e-6 of Σ|a·b| (a float32 sum of k terms is off by at most about
// k·2^-24 of that, and by √k·2^-24 typically), and c0 where no element is.
func checkProduct(c, c0 []float32, ldc int, a []float32, lda int, b []float32, ldb int, m, n, k int) error {
	inside := make([]bool, len(c))
	for i := range m {
		for j := range n {
			want, mag := float64(c0[i*ldc+j]), math.Abs(float64(c0[i*ldc+j]))
			for p := range k {
				x := float64(a[i*lda+p]) * float64(b[p*ldb+j])
				want += x
				mag += math.Abs(x)
			}
			got := float64(c[i*ldc+j])
			if math.Abs(got-want) > 1e-6*mag {
				return fmt.Errorf("c[%d][%d] = %g, want %g (Σ|a·b| %g)", i, j, got, want, mag)
			}
			inside[i*ldc+j] = true
		}
	}
	for x, in := range inside {
		if !in && c[x] != c0[x] {
			return fmt.Errorf("c[%d], between rows, changed from %g to %g", x, c0[x], c[x])
		}
	}
	return nil
}

func TestMatMulAddChecksBounds(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("a B one element short did not panic")
		}
	}()
	a, b, c := make([]float32, 6*4), make([]float32, 4*16-1), make([]float32, 6*16)
	matMulAdd(c, 16, a, 4, b, 16, 6, 16, 4)
}

// BenchmarkMatMulAdd times one feed-forward-sized product (1024×384 by
// 384×1536, a batch of 8 items of 128 tokens) with each backend, in
// GFLOPS per CPU second (all threads) and per wall second; fma with the
// AVX2 kernel alone and with the AVX-512 one.
//
//	go test -run '^$' -bench BenchmarkMatMulAdd ./model/bert/
func BenchmarkMatMulAdd(b *testing.B) {
	const m, k, n = 1024, 384, 1536
	r := rand.New(rand.NewPCG(6, 6))
	x, w, bias := randSlice(r, m*k), randSlice(r, k*n), randSlice(r, n)
	dst := make([]float32, m*n)
	saved := backend
	defer func() { backend = saved }()
	wide := hasAVX512Kernel
	defer func() { hasAVX512Kernel = wide }()
	for _, name := range []string{"gonum", "fma-avx2", "fma-avx512"} {
		g := gonumGEMM
		if name != "gonum" {
			g = fmaGEMM
			hasAVX512Kernel = name == "fma-avx512"
			if hasAVX512Kernel && !wide {
				continue
			}
		}
		if !g.available() {
			continue
		}
		backend = g
		b.Run(name, func(b *testing.B) {
			cpu0 := cputime.Process()
			for b.Loop() {
				linear(dst, x, w, bias, m, k, n)
			}
			flop := 2 * float64(m) * float64(k) * float64(n) * float64(b.N)
			b.ReportMetric(flop/b.Elapsed().Seconds()/1e9, "GFLOPS")
			if cpu := (cputime.Process() - cpu0).Seconds(); cpu > 0 {
				b.ReportMetric(flop/cpu/1e9, "GFLOP/cpu-s")
			}
		})
	}
}

func (g gemmBackend) String() string {
	return [...]string{"gonum", "fma"}[g]
}
