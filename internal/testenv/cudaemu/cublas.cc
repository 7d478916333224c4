// libcublas.so.N of the CPU emulation of a GPU: handles, SGEMM, GemmEx
// (binary16 and bfloat16 operands, float32 accumulation) and their
// strided-batched forms (v2 API,
// column-major, every transpose mode, leading dimensions, alpha and beta by
// host pointer), on the emulated driver's memory. Built once per SONAME the
// backend looks for (CUBLAS_MAJOR).
//
// VRAMQ_EMU_CUBLAS_FAIL lists SONAMEs (comma-separated) whose cublasCreate
// fails with CUBLAS_STATUS_NOT_INITIALIZED, as a cuBLAS newer than the
// driver does.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "emu.h"

#ifndef CUBLAS_MAJOR
#error "build with -DCUBLAS_MAJOR=N"
#endif
#define STR2(x) #x
#define STR(x) STR2(x)

namespace {

enum {
	ST_SUCCESS = 0,
	ST_NOT_INITIALIZED = 1,
	ST_ALLOC_FAILED = 3,
	ST_INVALID_VALUE = 7,
	ST_EXECUTION_FAILED = 13,
};

// The workspace real cuBLAS takes from device memory for its handle.
constexpr uint64_t workspace_bytes = 4 << 20;

struct Handle {
	void *ctx;
	uint64_t workspace;
};

bool create_fails() {
	const char *v = getenv("VRAMQ_EMU_CUBLAS_FAIL");
	if (v == nullptr) {
		return false;
	}
	std::string list = std::string(",") + v + ",";
	return list.find(",libcublas.so." STR(CUBLAS_MAJOR) ",") != std::string::npos;
}

// The elements a column-major operand spans: rows×cols with leading
// dimension ld.
uint64_t span(int rows, int cols, int ld) {
	if (rows == 0 || cols == 0) {
		return 0;
	}
	return uint64_t(ld) * uint64_t(cols - 1) + uint64_t(rows);
}

} // namespace

extern "C" {

int cublasCreate_v2(void **out) {
	if (out == nullptr) {
		return ST_INVALID_VALUE;
	}
	if (create_fails()) {
		return ST_NOT_INITIALIZED;
	}
	void *ctx = vramqEmuCurrentContext();
	if (ctx == nullptr) {
		return ST_NOT_INITIALIZED;
	}
	Handle *h = new Handle{ctx, 0};
	int r = vramqEmuAlloc(&h->workspace, workspace_bytes);
	if (r != EMU_SUCCESS) {
		delete h;
		return r == EMU_OUT_OF_MEMORY ? ST_ALLOC_FAILED : ST_NOT_INITIALIZED;
	}
	*out = h;
	return ST_SUCCESS;
}

int cublasDestroy_v2(void *hp) {
	Handle *h = (Handle *)hp;
	if (h == nullptr) {
		return ST_NOT_INITIALIZED;
	}
	vramqEmuFree(h->workspace);
	delete h;
	return ST_SUCCESS;
}

int cublasGetVersion_v2(void *hp, int *v) {
	(void)hp;
	*v = CUBLAS_MAJOR * 10000;
	return ST_SUCCESS;
}

} // extern "C"

namespace {

// The element types cublasGemmEx takes (library_types.h's cudaDataType
// numbering); emu.h converts them as a GPU does.
enum {
	DT_32F = 0,
	DT_16F = 2,
	DT_16BF = 14,
};

// tf32 is what CUBLAS_COMPUTE_32F_FAST_TF32 may round a float32 input to:
// 10 mantissa bits, float32's exponent, to nearest even.
float round_tf32(float f) {
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffff) >= 0x7f800000) {
		return f;
	}
	x = (x + 0xfff + ((x >> 13) & 1)) & ~0x1fffu;
	memcpy(&f, &x, 4);
	return f;
}

// An element type of a GEMM operand: its storage and conversions.
struct F32 {
	using T = float;
	static float get(T v) { return v; }
	static T put(float f) { return f; }
};
struct F16 {
	using T = uint16_t;
	static float get(T v) { return emu_half_to_float(v); }
	static T put(float f) { return emu_float_to_half(f); }
};
struct BF16 {
	using T = uint16_t;
	static float get(T v) { return emu_bf16_to_float(v); }
	static T put(float f) { return emu_float_to_bf16(f); }
};

// What a fast compute type may do to float32 inputs before multiplying:
// round them to a narrower type. The emulator always does it, so that a
// caller who asked for it sees the worst it may get.
enum Narrow { NARROW_NONE, NARROW_16F, NARROW_16BF, NARROW_TF32 };

float narrow(float v, Narrow n) {
	switch (n) {
	case NARROW_16F:
		return emu_half_to_float(emu_float_to_half(v));
	case NARROW_16BF:
		return emu_bf16_to_float(emu_float_to_bf16(v));
	case NARROW_TF32:
		return round_tf32(v);
	default:
		return v;
	}
}

// gemm is one product of cublasSgemm_v2's, cublasGemmEx's or their
// strided-batched forms, its arguments already checked: C = alpha·op(A)·op(B)
// + beta·C, op(A) m×k, op(B) k×n, C m×n, all column-major; A and B of
// element type TA, C of TC, every product and sum in float32 (a half times a
// half is exact in float32), C rounded to TC once at the end. It answers
// whether the operands lie in device memory (if not, nothing is written).
template <class TA, class TC>
bool gemm(bool ta, bool tb, int m, int n, int k, float a, const typename TA::T *A, int lda, const typename TA::T *B, int ldb,
	float b, typename TC::T *C, int ldc, Narrow nw = NARROW_NONE) {
	int arows = ta ? k : m, acols = ta ? m : k;
	int brows = tb ? n : k, bcols = tb ? k : n;
	bool reads_ab = k > 0 && a != 0.0f;
	const uint64_t ea = sizeof(typename TA::T), ec = sizeof(typename TC::T);
	if ((reads_ab && (!vramqEmuInDeviceMemory(uint64_t(uintptr_t(A)), ea * span(arows, acols, lda)) ||
			     !vramqEmuInDeviceMemory(uint64_t(uintptr_t(B)), ea * span(brows, bcols, ldb)))) ||
		!vramqEmuInDeviceMemory(uint64_t(uintptr_t(C)), ec * span(m, n, ldc))) {
		return false;
	}
	// op(A)[i][l] is A[i*sai + l*sal].
	size_t sai = ta ? size_t(lda) : 1, sal = ta ? 1 : size_t(lda);
	size_t sbl = tb ? size_t(ldb) : 1, sbj = tb ? 1 : size_t(ldb);
	std::vector<float> acc(m), col(reads_ab ? size_t(m) * k : 0);
	// op(A) once in float32, column l at col[l*m]: the conversion is then
	// paid once per element, not once per product.
	for (int l = 0; reads_ab && l < k; l++) {
		for (int i = 0; i < m; i++) {
			col[size_t(l) * m + i] = narrow(TA::get(A[i * sai + l * sal]), nw);
		}
	}
	for (int j = 0; j < n; j++) {
		for (int i = 0; i < m; i++) {
			acc[i] = 0.0f;
		}
		if (reads_ab) {
			for (int l = 0; l < k; l++) {
				float bv = narrow(TA::get(B[l * sbl + j * sbj]), nw);
				const float *ap = &col[size_t(l) * m];
				for (int i = 0; i < m; i++) {
					acc[i] += ap[i] * bv;
				}
			}
		}
		typename TC::T *cp = C + size_t(j) * ldc;
		for (int i = 0; i < m; i++) {
			cp[i] = TC::put(b == 0.0f ? a * acc[i] : a * acc[i] + b * TC::get(cp[i]));
		}
	}
	return true;
}

// check validates the arguments a GEMM call shares: ST_SUCCESS or the
// status to return.
int check(Handle *h, int transa, int transb, int m, int n, int k, const float *alpha, int lda, int ldb,
	const float *beta, int ldc) {
	if (h == nullptr || vramqEmuCurrentContext() != h->ctx) {
		return ST_NOT_INITIALIZED;
	}
	if (transa < 0 || transa > 2 || transb < 0 || transb > 2 || m < 0 || n < 0 || k < 0 || alpha == nullptr || beta == nullptr) {
		return ST_INVALID_VALUE;
	}
	bool ta = transa != 0, tb = transb != 0;
	int arows = ta ? k : m, brows = tb ? n : k;
	if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1)) {
		return ST_INVALID_VALUE;
	}
	return ST_SUCCESS;
}

// The compute types cublasGemmEx takes (cublasComputeType_t), those with a
// float32 accumulator: CUBLAS_COMPUTE_32F and _PEDANTIC, and the fast ones
// that may narrow float32 inputs first.
enum {
	COMPUTE_32F = 68,
	COMPUTE_32F_PEDANTIC = 69,
	COMPUTE_32F_FAST_16F = 74,
	COMPUTE_32F_FAST_16BF = 75,
	COMPUTE_32F_FAST_TF32 = 77,
	ST_NOT_SUPPORTED = 15,
};

// A GemmEx call's product, typed: one of the type combinations cuBLAS lists
// for a float32 accumulator (A and B of one type; C that type or float32).
// ST_NOT_SUPPORTED for any other, as cuBLAS answers.
int gemm_ex(int transa, int transb, int m, int n, int k, const float *alpha, const void *A, int atype, int lda,
	long long sA, const void *B, int btype, int ldb, long long sB, const float *beta, void *C, int ctype, int ldc,
	long long sC, int count, int compute) {
	Narrow nw = NARROW_NONE;
	switch (compute) {
	case COMPUTE_32F:
	case COMPUTE_32F_PEDANTIC:
		break;
	case COMPUTE_32F_FAST_16F:
		nw = NARROW_16F;
		break;
	case COMPUTE_32F_FAST_16BF:
		nw = NARROW_16BF;
		break;
	case COMPUTE_32F_FAST_TF32:
		nw = NARROW_TF32;
		break;
	default:
		return ST_NOT_SUPPORTED; // CUBLAS_COMPUTE_16F and the integer ones are not emulated
	}
	bool ok16 = atype == DT_16F && (ctype == DT_16F || ctype == DT_32F);
	bool okbf = atype == DT_16BF && (ctype == DT_16BF || ctype == DT_32F);
	bool ok32 = atype == DT_32F && ctype == DT_32F;
	if (atype != btype || !(ok16 || okbf || ok32)) {
		return ST_NOT_SUPPORTED;
	}
	if (m == 0 || n == 0 || count == 0) {
		return ST_SUCCESS;
	}
	int run;
	if (int r = vramqEmuBeginWork(&run); r != EMU_SUCCESS) {
		return ST_EXECUTION_FAILED;
	}
	if (!run) {
		return ST_SUCCESS; // an injected fault: reported by the next call
	}
	bool ta = transa != 0, tb = transb != 0;
	for (int i = 0; i < count; i++) {
		bool in;
		if (ok32) {
			in = gemm<F32, F32>(ta, tb, m, n, k, *alpha, (const float *)A + i * sA, lda, (const float *)B + i * sB, ldb, *beta,
				(float *)C + i * sC, ldc, nw);
		} else {
			const uint16_t *a = (const uint16_t *)A + i * sA, *b = (const uint16_t *)B + i * sB;
			bool c32 = ctype == DT_32F;
			float *c = c32 ? (float *)C + i * sC : nullptr;
			uint16_t *c16 = c32 ? nullptr : (uint16_t *)C + i * sC;
			if (atype == DT_16F) {
				in = c32 ? gemm<F16, F32>(ta, tb, m, n, k, *alpha, a, lda, b, ldb, *beta, c, ldc)
					 : gemm<F16, F16>(ta, tb, m, n, k, *alpha, a, lda, b, ldb, *beta, c16, ldc);
			} else {
				in = c32 ? gemm<BF16, F32>(ta, tb, m, n, k, *alpha, a, lda, b, ldb, *beta, c, ldc)
					 : gemm<BF16, BF16>(ta, tb, m, n, k, *alpha, a, lda, b, ldb, *beta, c16, ldc);
			}
		}
		if (!in) {
			vramqEmuFault(EMU_ILLEGAL_ADDRESS);
			break;
		}
	}
	return ST_SUCCESS;
}

} // namespace

extern "C" {

// C = alpha·op(A)·op(B) + beta·C, op(A) m×k, op(B) k×n, C m×n, all
// column-major. With beta 0, C is only written (it may hold NaN).
int cublasSgemm_v2(void *hp, int transa, int transb, int m, int n, int k, const float *alpha, const float *A, int lda,
	const float *B, int ldb, const float *beta, float *C, int ldc) {
	if (int st = check((Handle *)hp, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc); st != ST_SUCCESS) {
		return st;
	}
	return gemm_ex(transa, transb, m, n, k, alpha, A, DT_32F, lda, 0, B, DT_32F, ldb, 0, beta, C, DT_32F, ldc, 0, 1, COMPUTE_32F);
}

// batchCount products as cublasSgemm_v2's, the i-th on A + i·strideA,
// B + i·strideB and C + i·strideC (strides in elements): one launch.
int cublasSgemmStridedBatched(void *hp, int transa, int transb, int m, int n, int k, const float *alpha,
	const float *A, int lda, long long strideA, const float *B, int ldb, long long strideB, const float *beta,
	float *C, int ldc, long long strideC, int batchCount) {
	if (int st = check((Handle *)hp, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc); st != ST_SUCCESS) {
		return st;
	}
	if (batchCount < 0) {
		return ST_INVALID_VALUE;
	}
	return gemm_ex(transa, transb, m, n, k, alpha, A, DT_32F, lda, strideA, B, DT_32F, ldb, strideB, beta, C, DT_32F, ldc,
		strideC, batchCount, COMPUTE_32F);
}

// cublasGemmEx: C = alpha·op(A)·op(B) + beta·C with typed operands
// (cudaDataType) and a compute type, alpha and beta float32 by host pointer
// (the scale type of every float32 compute type). algo (cublasGemmAlgo_t)
// picks no kernel here: CUBLAS_GEMM_DEFAULT (-1) to 23 and the tensor-op
// ones (99 to 115) are taken, any other is CUBLAS_STATUS_INVALID_VALUE.
int cublasGemmEx(void *hp, int transa, int transb, int m, int n, int k, const void *alpha, const void *A, int Atype, int lda,
	const void *B, int Btype, int ldb, const void *beta, void *C, int Ctype, int ldc, int computeType, int algo) {
	if (int st = check((Handle *)hp, transa, transb, m, n, k, (const float *)alpha, lda, ldb, (const float *)beta, ldc);
		st != ST_SUCCESS) {
		return st;
	}
	if (!(algo >= -1 && algo <= 23) && !(algo >= 99 && algo <= 115)) {
		return ST_INVALID_VALUE;
	}
	return gemm_ex(transa, transb, m, n, k, (const float *)alpha, A, Atype, lda, 0, B, Btype, ldb, 0, (const float *)beta, C,
		Ctype, ldc, 0, 1, computeType);
}

// cublasGemmStridedBatchedEx: batchCount products as cublasGemmEx's, the
// i-th on A + i·strideA, B + i·strideB and C + i·strideC (strides in
// elements of each operand's type): one launch.
int cublasGemmStridedBatchedEx(void *hp, int transa, int transb, int m, int n, int k, const void *alpha, const void *A,
	int Atype, int lda, long long strideA, const void *B, int Btype, int ldb, long long strideB, const void *beta, void *C,
	int Ctype, int ldc, long long strideC, int batchCount, int computeType, int algo) {
	if (int st = check((Handle *)hp, transa, transb, m, n, k, (const float *)alpha, lda, ldb, (const float *)beta, ldc);
		st != ST_SUCCESS) {
		return st;
	}
	if (batchCount < 0 || (!(algo >= -1 && algo <= 23) && !(algo >= 99 && algo <= 115))) {
		return ST_INVALID_VALUE;
	}
	return gemm_ex(transa, transb, m, n, k, (const float *)alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB,
		(const float *)beta, C, Ctype, ldc, strideC, batchCount, computeType);
}

} // extern "C"
