package bert

import "golang.org/x/sys/cpu"

// hasFMAKernel says whether the assembly kernel can run: it uses AVX2's
// 256-bit registers and FMA3 (x/sys/cpu also checks that the OS saves the
// registers).
var hasFMAKernel = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// hasAVX512Kernel says whether the AVX-512 kernel can run (x/sys/cpu
// checks that the OS saves the registers).
var hasAVX512Kernel = hasFMAKernel && cpu.X86.HasAVX512F

//go:noescape
func kernel6x64AVX512(k int, a *[tileRows]*float32, b *float32, ldb int, c *float32, ldc int)

// kernelAVX512 is kernelFMA for a 64-column panel.
func kernelAVX512(k int, a *[tileRows][]float32, b []float32, ldb int, c []float32, ldc int) {
	var p [tileRows]*float32
	for r := range p {
		p[r] = &a[r][0]
	}
	kernel6x64AVX512(k, &p, &b[0], ldb, &c[0], ldc)
}

//go:noescape
func kernel6x16FMA(k int, a *[tileRows]*float32, b *float32, ldb int, c *float32, ldc int)

// kernelFMA is the assembly kernel behind kernelGo's signature. Its caller,
// matMulAddRows, has checked every bound it reads and writes, and k > 0.
func kernelFMA(k int, a *[tileRows][]float32, b []float32, ldb int, c []float32, ldc int) {
	var p [tileRows]*float32
	for r := range p {
		p[r] = &a[r][0]
	}
	kernel6x16FMA(k, &p, &b[0], ldb, &c[0], ldc)
}
