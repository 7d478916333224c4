//go:build cuda

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

// The few cuBLAS entry points the model needs, with the signatures of
// cublas_api.h (v2 API). They are called through pointers that dlsym found,
// so no cuBLAS header or library is needed to build, and the binary does not
// name a cuBLAS SONAME (libcublas.so.12 or .13, depending on the toolkit the
// machine has) that the loader would insist on at start.
typedef int (*cublas_create_fn)(void **handle);
typedef int (*cublas_destroy_fn)(void *handle);
typedef int (*cublas_sgemm_fn)(void *handle, int transa, int transb, int m, int n, int k,
	const float *alpha, const float *A, int lda, const float *B, int ldb,
	const float *beta, float *C, int ldc);

typedef int (*cublas_sgemm_batched_fn)(void *handle, int transa, int transb, int m, int n, int k,
	const float *alpha, const float *A, int lda, long long strideA, const float *B, int ldb, long long strideB,
	const float *beta, float *C, int ldc, long long strideC, int batchCount);

// cublasGemmEx and cublasGemmStridedBatchedEx (CUDA 11+ signatures: the
// compute type is a cublasComputeType_t). Alpha and beta are float32, the
// scale type of a float32 compute type.
typedef int (*cublas_gemm_ex_fn)(void *handle, int transa, int transb, int m, int n, int k,
	const void *alpha, const void *A, int Atype, int lda, const void *B, int Btype, int ldb,
	const void *beta, void *C, int Ctype, int ldc, int computeType, int algo);
typedef int (*cublas_gemm_batched_ex_fn)(void *handle, int transa, int transb, int m, int n, int k,
	const void *alpha, const void *A, int Atype, int lda, long long strideA, const void *B, int Btype, int ldb,
	long long strideB, const void *beta, void *C, int Ctype, int ldc, long long strideC, int batchCount,
	int computeType, int algo);

// CUBLAS_COMPUTE_32F: products and sums in float32 whatever the operands'
// type; with binary16 or bfloat16 operands cuBLAS runs it on the tensor
// cores. CUBLAS_GEMM_DEFAULT lets it pick the kernel (the _TENSOR_OP
// algorithms are deprecated since CUDA 11: tensor cores are the default).
enum { vramq_compute_32f = 68, vramq_gemm_default = -1 };

static int vramq_cublas_gemm_ex(void *f, void *h, int transa, int transb, int m, int n, int k,
	uint64_t A, int lda, long long sA, uint64_t B, int ldb, long long sB, int abtype,
	uint64_t C, int ldc, long long sC, int ctype, int count, int batched) {
	const float alpha = 1.0f, beta = 0.0f;
	if (!batched) {
		return ((cublas_gemm_ex_fn)f)(h, transa, transb, m, n, k, &alpha, (const void *)(uintptr_t)A, abtype, lda,
			(const void *)(uintptr_t)B, abtype, ldb, &beta, (void *)(uintptr_t)C, ctype, ldc, vramq_compute_32f, vramq_gemm_default);
	}
	return ((cublas_gemm_batched_ex_fn)f)(h, transa, transb, m, n, k, &alpha, (const void *)(uintptr_t)A, abtype, lda, sA,
		(const void *)(uintptr_t)B, abtype, ldb, sB, &beta, (void *)(uintptr_t)C, ctype, ldc, sC, count,
		vramq_compute_32f, vramq_gemm_default);
}

static int vramq_cublas_create(void *f, void **h) { return ((cublas_create_fn)f)(h); }
static int vramq_cublas_destroy(void *f, void *h) { return ((cublas_destroy_fn)f)(h); }
static int vramq_cublas_sgemm(void *f, void *h, int m, int n, int k,
	uint64_t A, int lda, uint64_t B, int ldb, uint64_t C, int ldc) {
	const float alpha = 1.0f, beta = 0.0f;
	// CUBLAS_OP_N for both: the caller lays the row-major operands out so
	// that column-major products come out right (see gemm).
	return ((cublas_sgemm_fn)f)(h, 0, 0, m, n, k, &alpha,
		(const float *)(uintptr_t)A, lda, (const float *)(uintptr_t)B, ldb,
		&beta, (float *)(uintptr_t)C, ldc);
}
// vramq_cublas_sgemm_batched is cublasSgemmStridedBatched with alpha 1 and
// beta 0; transa and transb are CUBLAS_OP_N (0) or CUBLAS_OP_T (1).
static int vramq_cublas_sgemm_batched(void *f, void *h, int transa, int transb, int m, int n, int k,
	uint64_t A, int lda, long long sA, uint64_t B, int ldb, long long sB, uint64_t C, int ldc, long long sC, int count) {
	const float alpha = 1.0f, beta = 0.0f;
	return ((cublas_sgemm_batched_fn)f)(h, transa, transb, m, n, k, &alpha,
		(const float *)(uintptr_t)A, lda, sA, (const float *)(uintptr_t)B, ldb, sB,
		&beta, (float *)(uintptr_t)C, ldc, sC, count);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/vramq/vramq/gpu"

	"gorgonia.org/cu"
)

// cublasLibraries are tried in order unless VRAMQ_CUBLAS names one: the
// newest first, so a machine with several toolkits uses the one its driver
// is most likely to match. A cuBLAS newer than the driver loads but fails
// cublasCreate (the newest is exactly the one an older driver cannot run),
// so a failure to create a handle moves on to the next library too.
var cublasLibraries = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}

// cublasStatusAllocFailed is CUBLAS_STATUS_ALLOC_FAILED: cuBLAS could not get
// device memory (for its workspace), which is an out-of-memory like any other.
const cublasStatusAllocFailed = 3

// Blas is a loaded cuBLAS and one handle, bound to the CUDA context that
// was current when it was made (an Owner's). It is used only from the
// goroutine that owns that context.
type Blas struct {
	lib                             unsafe.Pointer
	create, destroy, sgemm, batched unsafe.Pointer
	// gemmEx and batchedEx are nil in a cuBLAS without them (before 11):
	// half precision is then refused (HasGemmEx).
	gemmEx, batchedEx unsafe.Pointer
	handle            unsafe.Pointer
	// Path is the library loaded: the first of VRAMQ_CUBLAS or
	// libcublas.so.13, .12, .11 that made a handle.
	Path string
}

// loadCublas opens the first cuBLAS that makes a handle in the current
// context. When none does, the error names every library tried and how it
// failed; it wraps gpu.ErrOutOfMemory when one failed for want of memory.
func loadCublas() (*Blas, error) {
	candidates := cublasLibraries
	if p := os.Getenv("VRAMQ_CUBLAS"); p != "" {
		candidates = []string{p}
	}
	var tried []string
	var oom error
	for _, name := range candidates {
		b, err := openCublas(name)
		if err == nil {
			return b, nil
		}
		tried = append(tried, err.Error())
		if errors.Is(err, gpu.ErrOutOfMemory) && oom == nil {
			oom = err
		}
	}
	err := fmt.Errorf("no usable cuBLAS (set VRAMQ_CUBLAS to its path, e.g. PyTorch's site-packages/nvidia/cublas/lib/libcublas.so.12):\n  %s",
		strings.Join(tried, "\n  "))
	if oom != nil {
		return nil, fmt.Errorf("%w: %w", gpu.ErrOutOfMemory, err)
	}
	return nil, err
}

// openCublas loads the library name and makes a handle; on failure it
// unloads it again and says what failed.
func openCublas(name string) (*Blas, error) {
	cname := C.CString(name)
	lib := C.dlopen(cname, C.RTLD_NOW|C.RTLD_LOCAL)
	C.free(unsafe.Pointer(cname))
	if lib == nil {
		return nil, fmt.Errorf("%s: %s", name, C.GoString(C.dlerror()))
	}
	b := &Blas{lib: lib, Path: name}
	if err := b.bind(); err != nil {
		C.dlclose(lib)
		return nil, err
	}
	if st := C.vramq_cublas_create(b.create, &b.handle); st != 0 {
		C.dlclose(lib)
		return nil, fmt.Errorf("%s: %w", name, cublasError("cublasCreate", st))
	}
	return b, nil
}

func (b *Blas) bind() error {
	for _, s := range []struct {
		name string
		dst  *unsafe.Pointer
	}{
		{"cublasCreate_v2", &b.create}, {"cublasDestroy_v2", &b.destroy},
		{"cublasSgemm_v2", &b.sgemm}, {"cublasSgemmStridedBatched", &b.batched},
	} {
		if *s.dst = b.sym(s.name); *s.dst == nil {
			return fmt.Errorf("%s: no symbol %s", b.Path, s.name)
		}
	}
	b.gemmEx, b.batchedEx = b.sym("cublasGemmEx"), b.sym("cublasGemmStridedBatchedEx")
	return nil
}

func (b *Blas) sym(name string) unsafe.Pointer {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.dlsym(b.lib, cname)
}

// DataType is a GEMM operand's element type, numbered as cudaDataType.
type DataType int

const (
	Float32  DataType = 0  // CUDA_R_32F
	Float16  DataType = 2  // CUDA_R_16F: IEEE 754 binary16
	BFloat16 DataType = 14 // CUDA_R_16BF
)

// ElemBytes is the size of one element of t.
func (t DataType) ElemBytes() int64 {
	if t == Float32 {
		return 4
	}
	return 2
}

// HasGemmEx says whether the loaded cuBLAS has the typed GEMMs (GemmEx,
// GemmBatchedEx) half precision needs.
func (b *Blas) HasGemmEx() bool { return b.gemmEx != nil && b.batchedEx != nil }

// GemmEx is Gemm with typed operands: the row-major rows×m matrix c (of
// type ct) is a (rows×k) times bm (k×m), both of type abt, every product
// and sum in float32 (CUBLAS_COMPUTE_32F: on the tensor cores for binary16
// and bfloat16), c rounded to ct once. cuBLAS refuses (CUBLAS_STATUS_NOT_SUPPORTED)
// any combination but abt = ct, or half-precision abt with a float32 c.
func (b *Blas) GemmEx(c cu.DevicePtr, ct DataType, a, bm cu.DevicePtr, abt DataType, rows, k, m int) error {
	if !b.HasGemmEx() {
		return fmt.Errorf("%s has no cublasGemmEx", b.Path)
	}
	g := rowMajorGemm(rows, k, m)
	st := C.vramq_cublas_gemm_ex(b.gemmEx, b.handle, 0, 0, C.int(g.m), C.int(g.n), C.int(g.k),
		C.uint64_t(bm), C.int(g.lda), 0, C.uint64_t(a), C.int(g.ldb), 0, C.int(abt), C.uint64_t(c), C.int(g.ldc), 0, C.int(ct), 1, 0)
	if st != 0 {
		return cublasError("cublasGemmEx", st)
	}
	return nil
}

// GemmBatchedEx is GemmBatched with typed operands, as GemmEx: A and B of
// type abt, C of ct; strides in elements of each operand's type.
func (b *Blas) GemmBatchedEx(ta, tb bool, m, n, k int, a cu.DevicePtr, lda int, sa int64, bm cu.DevicePtr, ldb int, sb int64,
	abt DataType, c cu.DevicePtr, ldc int, sc int64, ct DataType, count int) error {
	if !b.HasGemmEx() {
		return fmt.Errorf("%s has no cublasGemmStridedBatchedEx", b.Path)
	}
	st := C.vramq_cublas_gemm_ex(b.batchedEx, b.handle, op(ta), op(tb), C.int(m), C.int(n), C.int(k),
		C.uint64_t(a), C.int(lda), C.longlong(sa), C.uint64_t(bm), C.int(ldb), C.longlong(sb), C.int(abt),
		C.uint64_t(c), C.int(ldc), C.longlong(sc), C.int(ct), C.int(count), 1)
	if st != 0 {
		return cublasError("cublasGemmStridedBatchedEx", st)
	}
	return nil
}

// op is cuBLAS's cublasOperation_t: CUBLAS_OP_T when t, else CUBLAS_OP_N.
func op(t bool) C.int {
	if t {
		return 1
	}
	return 0
}

// Gemm sets the row-major rows×m matrix c to a (rows×k) times b (k×m); see
// rowMajorGemm for how that maps onto column-major cuBLAS.
func (b *Blas) Gemm(c, a, bm cu.DevicePtr, rows, k, m int) error {
	g := rowMajorGemm(rows, k, m)
	st := C.vramq_cublas_sgemm(b.sgemm, b.handle, C.int(g.m), C.int(g.n), C.int(g.k),
		C.uint64_t(bm), C.int(g.lda), C.uint64_t(a), C.int(g.ldb), C.uint64_t(c), C.int(g.ldc))
	if st != 0 {
		return cublasError("cublasSgemm", st)
	}
	return nil
}

// GemmBatched is count column-major products C_i = op(A_i)·op(B_i) (m×n,
// inner dimension k), the i-th operands at A + i·sA, B + i·sB, C + i·sC
// floats; ta and tb say whether A and B are transposed.
func (b *Blas) GemmBatched(ta, tb bool, m, n, k int, a cu.DevicePtr, lda int, sa int64, bm cu.DevicePtr, ldb int, sb int64,
	c cu.DevicePtr, ldc int, sc int64, count int) error {
	st := C.vramq_cublas_sgemm_batched(b.batched, b.handle, op(ta), op(tb), C.int(m), C.int(n), C.int(k),
		C.uint64_t(a), C.int(lda), C.longlong(sa), C.uint64_t(bm), C.int(ldb), C.longlong(sb),
		C.uint64_t(c), C.int(ldc), C.longlong(sc), C.int(count))
	if st != 0 {
		return cublasError("cublasSgemmStridedBatched", st)
	}
	return nil
}

func (b *Blas) close() {
	if b.handle != nil {
		C.vramq_cublas_destroy(b.destroy, b.handle)
		b.handle = nil
	}
	// The library stays loaded: cuBLAS registers process-wide state with
	// the CUDA runtime that unloading would leave dangling.
}

func cublasError(call string, st C.int) error {
	err := fmt.Errorf("cuBLAS %s: status %d%s", call, int(st), cublasStatusNames[int(st)])
	if st == cublasStatusAllocFailed {
		return fmt.Errorf("%w: %w", gpu.ErrOutOfMemory, err)
	}
	return err
}

// cublasStatusNames are cublas_api.h's names for the statuses a call can
// return, for messages.
var cublasStatusNames = map[int]string{
	1: " (CUBLAS_STATUS_NOT_INITIALIZED)", 3: " (CUBLAS_STATUS_ALLOC_FAILED)", 7: " (CUBLAS_STATUS_INVALID_VALUE)",
	8: " (CUBLAS_STATUS_ARCH_MISMATCH)", 11: " (CUBLAS_STATUS_MAPPING_ERROR)", 13: " (CUBLAS_STATUS_EXECUTION_FAILED)",
	14: " (CUBLAS_STATUS_INTERNAL_ERROR)", 15: " (CUBLAS_STATUS_NOT_SUPPORTED)", 16: " (CUBLAS_STATUS_LICENSE_ERROR)",
}
