package bert

import (
	"fmt"
	"runtime"
)

// A register-tiled float32 matrix product for the linear layers and
// attention. vek's kernel (github.com/viterin/vek, once a backend here: an
// axpy per row of A, C reloaded and stored for every element of A)
// reached about 29-40 GFLOPS on this machine,
// ONNX Runtime's MLAS about twice that; a survey of public Go code found
// no library with a register-blocked float32 kernel that builds without
// GOEXPERIMENT=simd (gonum's Sgemm is slower than vek's; GoMLX's packgemm
// needs the experiment). The kernels keep a tile of C in registers for the
// whole inner dimension: 6×64 in 24 AVX-512 registers (24 FMAs for 4 loads
// of B and 6 broadcasts of A), or 6×16 in 12 AVX2 ones (12 FMAs for 2 and
// 6). kernelGo is the AVX2 kernel's computation in Go, tested alongside it;
// a CPU without AVX2 and FMA uses the gonum backend instead.

const (
	tileRows = 6
	tileCols = 16
	// wideCols is the AVX-512 kernel's panel width.
	wideCols = 64
	// blockTiles row tiles make a block whose rows of A (6·8·k floats,
	// 288 KiB at k = 1536) stay in L2 while the columns of B go by.
	blockTiles = 8
)

// kernelGo is C[6×16] += A[6×k]·B[k×16], A's rows given one by one, B and
// C row-major with leading dimensions ldb and ldc.
func kernelGo(k int, a *[tileRows][]float32, b []float32, ldb int, c []float32, ldc int) {
	var acc [tileRows][tileCols]float32
	for p := range k {
		brow := b[p*ldb:][:tileCols]
		for r := range tileRows {
			x := a[r][p]
			for j, y := range brow {
				acc[r][j] += x * y
			}
		}
	}
	for r := range tileRows {
		crow := c[r*ldc:][:tileCols]
		for j := range crow {
			crow[j] += acc[r][j]
		}
	}
}

// checkMatMul panics unless a, b and c hold the m×k, k×n and m×n matrices
// their leading dimensions describe: the assembly kernel does not check.
func checkMatMul(c []float32, ldc int, a []float32, lda int, b []float32, ldb int, m, n, k int) {
	ok := m >= 0 && n >= 0 && k >= 0 && lda >= k && ldb >= n && ldc >= n
	if ok && m > 0 && k > 0 {
		ok = len(a) >= (m-1)*lda+k
	}
	if ok && k > 0 && n > 0 {
		ok = len(b) >= (k-1)*ldb+n
	}
	if ok && m > 0 && n > 0 {
		ok = len(c) >= (m-1)*ldc+n
	}
	if !ok {
		panic(fmt.Sprintf("bert: matMulAdd: %d×%d·%d×%d with lda %d, ldb %d, ldc %d on slices of %d, %d, %d",
			m, k, k, n, lda, ldb, ldc, len(a), len(b), len(c)))
	}
}

// matMulAdd sets c[m×n] += a[m×k]·b[k×n] (row-major, leading dimensions
// lda, ldb, ldc) on one goroutine.
func matMulAdd(c []float32, ldc int, a []float32, lda int, b []float32, ldb int, m, n, k int) {
	checkMatMul(c, ldc, a, lda, b, ldb, m, n, k)
	matMulAddRows(bestKernels(), c, ldc, a, lda, b, ldb, m, n, k)
}

// matMulAddParallel is matMulAdd with the rows of c cut into blocks of
// whole tiles, shared evenly among GOMAXPROCS goroutines.
func matMulAddParallel(c []float32, ldc int, a []float32, lda int, b []float32, ldb int, m, n, k int) {
	checkMatMul(c, ldc, a, lda, b, ldb, m, n, k)
	tiles := (m + tileRows - 1) / tileRows
	workers := runtime.GOMAXPROCS(0)
	if workers <= 1 || tiles < 2 || m*n*k < 1<<18 {
		matMulAddRows(bestKernels(), c, ldc, a, lda, b, ldb, m, n, k)
		return
	}
	// A multiple of workers blocks of at most blockTiles tiles, so that
	// parallelFor gives each goroutine the same share.
	blocks := workers * ((tiles + workers*blockTiles - 1) / (workers * blockTiles))
	blocks = min(blocks, tiles)
	parallelFor(blocks, func(job int) {
		r0 := job * tiles / blocks * tileRows
		r1 := min(m, (job+1)*tiles/blocks*tileRows)
		matMulAddRows(bestKernels(), c[r0*ldc:], ldc, a[r0*lda:], lda, b, ldb, r1-r0, n, k)
	})
}

// kernels says which kernels matMulAddRows may use: kernelGo alone, or
// the AVX2 one, or the AVX-512 one for 64-column panels as well (then the
// AVX2 one for any 16-column panels left).
type kernels int

const (
	goKernels kernels = iota
	avx2Kernels
	avx512Kernels
)

// bestKernels is what this machine has.
func bestKernels() kernels {
	switch {
	case hasAVX512Kernel:
		return avx512Kernels
	case hasFMAKernel:
		return avx2Kernels
	}
	return goKernels
}

// matMulAddRows is matMulAdd, bounds already checked, with the given
// kernels: for each block of rows, each panel of B (64 or 16 columns) is
// run past the block's tiles while it is in cache. A last partial tile of
// rows repeats its last row of A and goes through a buffer; the columns
// past the last multiple of 16 (none in the models' linear layers) are
// done in Go.
func matMulAddRows(ks kernels, c []float32, ldc int, a []float32, lda int, b []float32, ldb int, m, n, k int) {
	if k == 0 || m == 0 || n == 0 {
		return
	}
	full := n / tileCols * tileCols
	var rows [tileRows][]float32
	var tmp [tileRows * wideCols]float32
	for i0 := 0; i0 < m; i0 += tileRows * blockTiles {
		i1 := min(m, i0+tileRows*blockTiles)
		for j := 0; j < full; {
			w := tileCols
			if ks == avx512Kernels && j+wideCols <= n {
				w = wideCols
			}
			for i := i0; i < i1; i += tileRows {
				h := min(tileRows, i1-i)
				for r := range tileRows {
					rows[r] = a[(i+min(r, h-1))*lda:][:k]
				}
				if h == tileRows {
					kernel(ks, w, k, &rows, b[j:], ldb, c[i*ldc+j:], ldc)
					continue
				}
				clear(tmp[:])
				for r := range h {
					copy(tmp[r*w:][:w], c[(i+r)*ldc+j:])
				}
				kernel(ks, w, k, &rows, b[j:], ldb, tmp[:], w)
				for r := range h {
					copy(c[(i+r)*ldc+j:][:w], tmp[r*w:])
				}
			}
			j += w
		}
		if full == n {
			continue
		}
		for i := i0; i < i1; i++ {
			crow := c[i*ldc+full : i*ldc+n]
			for p, x := range a[i*lda:][:k] {
				for j, y := range b[p*ldb+full : p*ldb+n] {
					crow[j] += x * y
				}
			}
		}
	}
}

// kernel runs the kernel for a panel w columns wide (wideCols only with
// avx512Kernels).
func kernel(ks kernels, w, k int, a *[tileRows][]float32, b []float32, ldb int, c []float32, ldc int) {
	switch {
	case w == wideCols:
		kernelAVX512(k, a, b, ldb, c, ldc)
	case ks == goKernels:
		kernelGo(k, a, b, ldb, c, ldc)
	default:
		kernelFMA(k, a, b, ldb, c, ldc)
	}
}
