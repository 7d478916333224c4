//go:build !amd64

package bert

// hasFMAKernel is false off amd64: there is no assembly kernel, and the
// linear layers use gonum.
var hasFMAKernel = false

func kernelFMA(k int, a *[tileRows][]float32, b []float32, ldb int, c []float32, ldc int) {
	kernelGo(k, a, b, ldb, c, ldc)
}

var hasAVX512Kernel = false

func kernelAVX512(k int, a *[tileRows][]float32, b []float32, ldb int, c []float32, ldc int) {
	panic("bert: no AVX-512 kernel off amd64")
}
