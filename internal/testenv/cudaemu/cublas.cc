// libcublas.so.N of the CPU emulation of a GPU: handles, SGEMM and its
// strided-batched form (v2 API,
// column-major, every transpose mode, leading dimensions, alpha and beta by
// host pointer), on the emulated driver's memory. Built once per SONAME the
// backend looks for (CUBLAS_MAJOR).
//
// VRAMQ_EMU_CUBLAS_FAIL lists SONAMEs (comma-separated) whose cublasCreate
// fails with CUBLAS_STATUS_NOT_INITIALIZED, as a cuBLAS newer than the
// driver does.

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

// gemm is one product of cublasSgemm_v2's or cublasSgemmStridedBatched's,
// its arguments already checked: C = alpha·op(A)·op(B) + beta·C, op(A)
// m×k, op(B) k×n, C m×n, all column-major. It answers whether the operands
// lie in device memory (if not, nothing is written).
bool gemm(bool ta, bool tb, int m, int n, int k, float a, const float *A, int lda, const float *B, int ldb, float b,
	float *C, int ldc) {
	int arows = ta ? k : m, acols = ta ? m : k;
	int brows = tb ? n : k, bcols = tb ? k : n;
	bool reads_ab = k > 0 && a != 0.0f;
	if ((reads_ab && (!vramqEmuInDeviceMemory(uint64_t(uintptr_t(A)), 4 * span(arows, acols, lda)) ||
			     !vramqEmuInDeviceMemory(uint64_t(uintptr_t(B)), 4 * span(brows, bcols, ldb)))) ||
		!vramqEmuInDeviceMemory(uint64_t(uintptr_t(C)), 4 * span(m, n, ldc))) {
		return false;
	}
	// op(A)[i][l] is A[i*sai + l*sal].
	size_t sai = ta ? size_t(lda) : 1, sal = ta ? 1 : size_t(lda);
	size_t sbl = tb ? size_t(ldb) : 1, sbj = tb ? 1 : size_t(ldb);
	std::vector<float> acc(m);
	for (int j = 0; j < n; j++) {
		for (int i = 0; i < m; i++) {
			acc[i] = 0.0f;
		}
		if (reads_ab) {
			for (int l = 0; l < k; l++) {
				float bv = B[l * sbl + j * sbj];
				const float *ap = A + l * sal;
				for (int i = 0; i < m; i++) {
					acc[i] += ap[i * sai] * bv;
				}
			}
		}
		float *cp = C + size_t(j) * ldc;
		for (int i = 0; i < m; i++) {
			cp[i] = b == 0.0f ? a * acc[i] : a * acc[i] + b * cp[i];
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

} // namespace

extern "C" {

// C = alpha·op(A)·op(B) + beta·C, op(A) m×k, op(B) k×n, C m×n, all
// column-major. With beta 0, C is only written (it may hold NaN).
int cublasSgemm_v2(void *hp, int transa, int transb, int m, int n, int k, const float *alpha, const float *A, int lda,
	const float *B, int ldb, const float *beta, float *C, int ldc) {
	if (int st = check((Handle *)hp, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc); st != ST_SUCCESS) {
		return st;
	}
	if (m == 0 || n == 0) {
		return ST_SUCCESS;
	}
	int run;
	if (int r = vramqEmuBeginWork(&run); r != EMU_SUCCESS) {
		return ST_EXECUTION_FAILED;
	}
	if (!run) {
		return ST_SUCCESS; // an injected fault: reported by the next call
	}
	if (!gemm(transa != 0, transb != 0, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc)) {
		vramqEmuFault(EMU_ILLEGAL_ADDRESS);
	}
	return ST_SUCCESS;
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
	if (m == 0 || n == 0 || batchCount == 0) {
		return ST_SUCCESS;
	}
	int run;
	if (int r = vramqEmuBeginWork(&run); r != EMU_SUCCESS) {
		return ST_EXECUTION_FAILED;
	}
	if (!run) {
		return ST_SUCCESS;
	}
	for (int i = 0; i < batchCount; i++) {
		if (!gemm(transa != 0, transb != 0, m, n, k, *alpha, A + i * strideA, lda, B + i * strideB, ldb, *beta,
			    C + i * strideC, ldc)) {
			vramqEmuFault(EMU_ILLEGAL_ADDRESS);
			break;
		}
	}
	return ST_SUCCESS;
}

} // extern "C"
