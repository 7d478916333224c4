// Kernels of the reference embedding model's CUDA backend (model/refembed/cuda.go).
// The dense layers are cuBLAS GEMMs; these are the element-wise and
// per-row steps around them. Compiled to PTX by `make ptx` with clang-14,
// without the CUDA headers or libdevice (neither is on the build machines),
// so this file declares what it uses and calls only NVVM builtins.
//
// Every parameter is a pointer or a 64-bit integer: gorgonia.org/cu passes
// each kernel argument as 8 bytes.
//
// The arithmetic mirrors the CPU reference (model/refembed/embed.go) step for step
// where that is free: mean pooling sums rows in token order and then scales
// by 1/count, and the L2 norm accumulates in double. GELU uses a tanh built
// from ex2.approx, and the GEMMs sum in cuBLAS's order, so outputs agree with
// the CPU within a tolerance, not bit for bit (the tests state it).

#define GLOBAL __attribute__((global))
#define DEVICE __attribute__((device)) static inline
#define SHARED __attribute__((shared))

typedef long i64;

DEVICE int tid(void) { return __nvvm_read_ptx_sreg_tid_x(); }
DEVICE int ntid(void) { return __nvvm_read_ptx_sreg_ntid_x(); }
DEVICE int ctaid(void) { return __nvvm_read_ptx_sreg_ctaid_x(); }
DEVICE int nctaid(void) { return __nvvm_read_ptx_sreg_nctaid_x(); }

// gather copies the embedding row of every token: rows[t] = table[tokens[t]].
// A grid-stride loop over all tokens*dim values, so any grid covers any size.
extern "C" GLOBAL void gather(const int *tokens, const float *table, float *rows, i64 ntokens, i64 dim) {
	i64 total = ntokens * dim;
	for (i64 k = (i64)ctaid() * ntid() + tid(); k < total; k += (i64)nctaid() * ntid()) {
		i64 t = k / dim, j = k - t * dim;
		rows[k] = table[(i64)tokens[t] * dim + j];
	}
}

// mean_pool sets pooled[i] to the mean of rows offsets[i] to offsets[i+1]-1:
// one block per item (grid-stride over items), threads across the width.
extern "C" GLOBAL void mean_pool(const float *rows, const int *offsets, float *pooled, i64 nitems, i64 dim) {
	for (i64 i = ctaid(); i < nitems; i += nctaid()) {
		i64 lo = offsets[i], hi = offsets[i + 1];
		float scale = 1.0f / (float)(hi - lo);
		for (i64 j = tid(); j < dim; j += ntid()) {
			float s = 0.0f;
			for (i64 t = lo; t < hi; t++) {
				s += rows[t * dim + j];
			}
			pooled[i * dim + j] = s * scale;
		}
	}
}

// tanh from exp: tanh(x) = 1 - 2/(e^{2x} + 1), which saturates cleanly to
// ±1 (e^{2x} overflows to inf, or underflows to 0).
DEVICE float tanh_approx(float x) {
	const float log2e = 1.4426950408889634f;
	float e = __nvvm_ex2_approx_f(2.0f * x * log2e);
	return 1.0f - 2.0f / (e + 1.0f);
}

// bias_gelu sets x[i][j] = GELU(x[i][j] + bias[j]) for an n×width row-major
// x, with the tanh approximation of GELU the CPU reference uses.
extern "C" GLOBAL void bias_gelu(float *x, const float *bias, i64 n, i64 width) {
	const float c = 0.7978845608028654f; // sqrt(2/pi)
	i64 total = n * width;
	for (i64 k = (i64)ctaid() * ntid() + tid(); k < total; k += (i64)nctaid() * ntid()) {
		float v = x[k] + bias[k % width];
		x[k] = 0.5f * v * (1.0f + tanh_approx(c * (v + 0.044715f * v * v * v)));
	}
}

// bias_l2norm adds bias to each row of the n×width row-major y and scales
// the row to unit length: one block per row (grid-stride over rows), the
// sum of squares reduced in double through shared memory. blockDim.x must be
// a power of two no larger than 1024.
extern "C" GLOBAL void bias_l2norm(float *y, const float *bias, i64 n, i64 width) {
	SHARED double part[1024];
	for (i64 i = ctaid(); i < n; i += nctaid()) {
		float *row = y + i * width;
		double ss = 0.0;
		for (i64 j = tid(); j < width; j += ntid()) {
			float v = row[j] + bias[j];
			row[j] = v;
			ss += (double)v * (double)v;
		}
		part[tid()] = ss;
		__syncthreads();
		for (int s = ntid() / 2; s > 0; s >>= 1) {
			if (tid() < s) {
				part[tid()] += part[tid() + s];
			}
			__syncthreads();
		}
		double total = part[0];
		__syncthreads(); // everyone has read part[0] before the next row reuses it
		if (total > 0.0) {
			float scale = (float)(1.0 / __builtin_sqrt(total));
			for (i64 j = tid(); j < width; j += ntid()) {
				row[j] *= scale;
			}
		}
	}
}
