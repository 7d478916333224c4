package cuda

// gemmShape is the arguments of a column-major BLAS GEMM without
// transposition, C (m×n) = A (m×k) · B (k×n), with leading dimensions.
type gemmShape struct{ m, n, k, lda, ldb, ldc int }

// rowMajorGemm is how the CUDA backend asks cuBLAS, which is column-major,
// for the row-major product c (rows×m) = a (rows×k) · b (k×m). A row-major
// matrix read column-major is its transpose, so cᵀ = bᵀ·aᵀ is the product to
// ask for, with b as BLAS's A and a as its B, and nothing transposed:
// m×rows = (m×k)·(k×rows), leading dimensions m, k and m. It lives outside
// the cuda build so that a test can check it on any machine.
func rowMajorGemm(rows, k, m int) gemmShape {
	return gemmShape{m: m, n: rows, k: k, lda: m, ldb: k, ldc: m}
}
