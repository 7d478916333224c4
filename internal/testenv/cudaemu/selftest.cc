// The emulator's self-test: through the driver and cuBLAS APIs, as the
// backend calls them, each kernel of the PTX against a direct computation of
// what it is for, SGEMM in every transpose mode against a direct product,
// and the driver's behaviours the backend relies on (out of memory, an
// illegal address that sticks, injected faults, a stale PTX refused).
//
//   selftest LIBCUBLAS EMBED_PTX BERT_PTX   exits 0 when all pass; prints each failure
//
// The Makefile also builds the driver from copies of the .cu with one
// __syncthreads deleted, and requires this test to FAIL on each: a missing
// barrier must not go unnoticed.

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

extern "C" {
int cuInit(unsigned);
int cuCtxCreate_v2(void **, unsigned, int);
int cuCtxDestroy_v2(void *);
int cuCtxSetCurrent(void *);
int cuModuleLoadData(void **, const void *);
int cuModuleGetFunction(void **, void *, const char *);
int cuMemAlloc_v2(unsigned long long *, size_t);
int cuMemFree_v2(unsigned long long);
int cuMemGetInfo_v2(size_t *, size_t *);
int cuMemcpyHtoD_v2(unsigned long long, const void *, size_t);
int cuMemcpyDtoH_v2(void *, unsigned long long, size_t);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
int cuCtxSynchronize(void);
}

typedef int (*sgemm_fn)(void *, int, int, int, int, int, const float *, const float *, int, const float *, int, const float *, float *, int);

static int failures;

#define CHECK(cond, ...)                                                                                                    \
	do {                                                                                                                    \
		if (!(cond)) {                                                                                                      \
			failures++;                                                                                                     \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                              \
			fprintf(stderr, __VA_ARGS__);                                                                                   \
			fprintf(stderr, "\n");                                                                                          \
		}                                                                                                                   \
	} while (0)

#define MUST(call)                                                                                                          \
	do {                                                                                                                    \
		int r_ = (call);                                                                                                    \
		if (r_ != 0) {                                                                                                      \
			fprintf(stderr, "FATAL %s:%d: %s = %d\n", __FILE__, __LINE__, #call, r_);                                       \
			exit(2);                                                                                                        \
		}                                                                                                                   \
	} while (0)

static uint64_t rng_state = 12345;
static float frand() {
	rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return float((rng_state >> 40) & 0xffffff) / float(1 << 24) * 2.0f - 1.0f;
}

template <class T> static unsigned long long upload(const std::vector<T> &v) {
	unsigned long long p;
	MUST(cuMemAlloc_v2(&p, v.size() * sizeof(T)));
	MUST(cuMemcpyHtoD_v2(p, v.data(), v.size() * sizeof(T)));
	return p;
}

template <class T> static std::vector<T> download(unsigned long long p, size_t n) {
	std::vector<T> v(n);
	MUST(cuMemcpyDtoH_v2(v.data(), p, n * sizeof(T)));
	return v;
}

// launch runs a kernel to its end. A kernel that faults (a warp operation
// the GPU leaves undefined, an illegal address) is a check failing, not a
// broken test: the context is lost, so the test ends there.
static void launch(void *fn, unsigned grid, unsigned block, std::vector<void *> args) {
	MUST(cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, nullptr, args.data(), nullptr));
	if (int r = cuCtxSynchronize(); r != 0) {
		fprintf(stderr, "FAIL a launch of %u blocks of %u threads: the kernel failed (cuCtxSynchronize %d)\n", grid, block, r);
		exit(1);
	}
}

static void test_gather(void *mod) {
	void *fn;
	MUST(cuModuleGetFunction(&fn, mod, "gather"));
	long vocab = 50, dim = 37, ntok = 123;
	std::vector<int> tokens(ntok);
	std::vector<float> table(vocab * dim);
	for (auto &t : tokens) t = int((frand() + 1) * 0.5f * (vocab - 1));
	for (auto &x : table) x = frand();
	unsigned long long dt = upload(tokens), dtab = upload(table), drows;
	MUST(cuMemAlloc_v2(&drows, ntok * dim * 4));
	// Grids smaller and larger than the work: the grid-stride loop covers both.
	for (unsigned grid : {1u, 3u, 40u}) {
		launch(fn, grid, 64, {&dt, &dtab, &drows, &ntok, &dim});
		auto rows = download<float>(drows, ntok * dim);
		int bad = 0;
		for (long t = 0; t < ntok; t++)
			for (long j = 0; j < dim; j++)
				bad += rows[t * dim + j] != table[tokens[t] * dim + j];
		CHECK(bad == 0, "gather (grid %u): %d of %ld values wrong", grid, bad, ntok * dim);
	}
	cuMemFree_v2(dt), cuMemFree_v2(dtab), cuMemFree_v2(drows);
}

static void test_mean_pool(void *mod) {
	void *fn;
	MUST(cuModuleGetFunction(&fn, mod, "mean_pool"));
	long nitems = 9, dim = 70;
	std::vector<int> offsets = {0, 1, 5, 6, 20, 21, 40, 41, 42, 60};
	std::vector<float> rows(60 * dim);
	for (auto &x : rows) x = frand();
	unsigned long long dr = upload(rows), doff = upload(offsets), dp;
	MUST(cuMemAlloc_v2(&dp, nitems * dim * 4));
	launch(fn, 4, 32, {&dr, &doff, &dp, &nitems, &dim});
	auto got = download<float>(dp, nitems * dim);
	double worst = 0;
	for (long i = 0; i < nitems; i++)
		for (long j = 0; j < dim; j++) {
			double s = 0;
			for (int t = offsets[i]; t < offsets[i + 1]; t++) s += rows[t * dim + j];
			worst = fmax(worst, fabs(s / (offsets[i + 1] - offsets[i]) - got[i * dim + j]));
			if (isnan(got[i * dim + j])) worst = INFINITY;
		}
	CHECK(worst < 1e-5, "mean_pool: largest error %g", worst);
	cuMemFree_v2(dr), cuMemFree_v2(doff), cuMemFree_v2(dp);
}

static void test_bias_gelu(void *mod) {
	void *fn;
	MUST(cuModuleGetFunction(&fn, mod, "bias_gelu"));
	long n = 7, width = 300;
	std::vector<float> x(n * width), bias(width);
	for (auto &v : x) v = 4 * frand();
	for (auto &v : bias) v = frand();
	unsigned long long dx = upload(x), db = upload(bias);
	launch(fn, 3, 256, {&dx, &db, &n, &width});
	auto got = download<float>(dx, n * width);
	double worst = 0;
	for (long k = 0; k < n * width; k++) {
		double v = double(x[k]) + bias[k % width];
		double want = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
		worst = fmax(worst, fabs(want - got[k]));
		if (isnan(got[k])) worst = INFINITY;
	}
	CHECK(worst < 1e-5, "bias_gelu: largest error %g", worst);
	cuMemFree_v2(dx), cuMemFree_v2(db);
}

static void test_bias_l2norm(void *mod) {
	void *fn;
	MUST(cuModuleGetFunction(&fn, mod, "bias_l2norm"));
	// Fewer blocks than rows, so each block does several rows and reuses
	// its shared memory; a width that is not the block's.
	long n = 11, width = 200;
	for (unsigned block : {256u, 64u}) {
		std::vector<float> y(n * width), bias(width);
		for (auto &v : y) v = frand();
		for (auto &v : bias) v = 0.1f * frand();
		unsigned long long dy = upload(y), db = upload(bias);
		launch(fn, 3, block, {&dy, &db, &n, &width});
		auto got = download<float>(dy, n * width);
		double worst = 0;
		for (long i = 0; i < n; i++) {
			double ss = 0;
			for (long j = 0; j < width; j++) {
				double v = double(y[i * width + j]) + bias[j];
				ss += v * v;
			}
			for (long j = 0; j < width; j++) {
				double want = (double(y[i * width + j]) + bias[j]) / sqrt(ss);
				double d = fabs(want - got[i * width + j]);
				worst = isnan(d) ? INFINITY : fmax(worst, d);
			}
		}
		CHECK(worst < 1e-6, "bias_l2norm (block %u): largest error %g", block, worst);
		cuMemFree_v2(dy), cuMemFree_v2(db);
	}
}

// gemm_error is the largest difference of got (m×n, leading dimension ldc)
// from alpha·op(A)·op(B) + beta·C computed directly in double, column-major,
// op a transpose where ta or tb; relative to max(1, |want|) when relative;
// infinite for a NaN.
static double gemm_error(bool ta, bool tb, int m, int n, int k, double alpha, const std::vector<float> &A, int lda,
	const std::vector<float> &B, int ldb, double beta, const std::vector<float> &C, int ldc, const std::vector<float> &got,
	bool relative) {
	double worst = 0;
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			double s = 0;
			for (int l = 0; l < k; l++) {
				double a = ta ? A[l + i * lda] : A[i + l * lda];
				double b = tb ? B[j + l * ldb] : B[l + j * ldb];
				s += a * b;
			}
			double want = alpha * s + (beta == 0 ? 0 : beta * C[i + j * ldc]);
			double d = fabs(want - got[i + j * ldc]) / (relative ? fmax(1.0, fabs(want)) : 1.0);
			worst = isnan(d) ? INFINITY : fmax(worst, d);
		}
	return worst;
}

static void test_sgemm(sgemm_fn sgemm, void *h) {
	int m = 13, n = 7, k = 9;
	const char *names = "NTC";
	for (int ta = 0; ta < 3; ta++)
		for (int tb = 0; tb < 3; tb++)
			for (float beta : {0.0f, 2.0f}) {
				int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
				int lda = arows + 3, ldb = brows + 1, ldc = m + 2;
				std::vector<float> A(lda * acols), B(ldb * bcols), C(ldc * n);
				for (auto &v : A) v = frand();
				for (auto &v : B) v = frand();
				for (auto &v : C) v = frand();
				unsigned long long dA = upload(A), dB = upload(B), dC;
				if (beta == 0.0f) {
					// Fresh memory holds NaN; beta 0 must not read it.
					MUST(cuMemAlloc_v2(&dC, C.size() * 4));
				} else {
					dC = upload(C);
				}
				float alpha = 0.5f;
				MUST(sgemm(h, ta, tb, m, n, k, &alpha, (const float *)dA, lda, (const float *)dB, ldb, &beta, (float *)dC, ldc));
				MUST(cuCtxSynchronize());
				auto got = download<float>(dC, C.size());
				double worst = gemm_error(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, got, false);
				// Rows past m inside ldc are not C's: untouched.
				int touched = 0;
				if (beta != 0.0f)
					for (int j = 0; j < n; j++)
						for (int i = m; i < ldc; i++) touched += got[i + j * ldc] != C[i + j * ldc];
				CHECK(worst < 1e-5 && touched == 0, "sgemm %c%c beta %g: largest error %g, %d padding values changed", names[ta], names[tb], beta, worst, touched);
				cuMemFree_v2(dA), cuMemFree_v2(dB), cuMemFree_v2(dC);
			}
}

// --- Warp operations: warp.cu's kernels against PTX's definitions ---------

// The entries of warp.cu, as a PTX module declares them: the emulator runs
// its own compilation of the .cu, and checks only these declarations.
static const char warp_ptx[] =
	".version 7.0\n.target sm_80\n.address_size 64\n"
	".visible .entry emu_shfl(.param .u64 p0, .param .u64 p1, .param .u64 p2, .param .u64 p3, .param .u64 p4,"
	" .param .u64 p5, .param .u64 p6)\n{\n\tret;\n}\n"
	".visible .entry emu_syncwarp(.param .u64 p0, .param .u64 p1, .param .u64 p2)\n{\n\tret;\n}\n";

// shfl_want is what lane l of a warp gets from shfl.sync, by the PTX ISA's
// pseudocode for it, written out here apart from the emulator's: the lane
// it reads, or its own where that is out of range.
static int shfl_want(int mode, int l, int b, int c) {
	int bval = b & 31, cval = c & 31, seg = (c >> 8) & 31;
	int max_lane = (l & seg) | (cval & ~seg), min_lane = l & seg;
	int j = l;
	bool in = false;
	if (mode == 0) j = l - bval, in = j >= max_lane;
	if (mode == 1) j = l + bval, in = j <= max_lane;
	if (mode == 2) j = l ^ bval, in = j <= max_lane;
	if (mode == 3) j = min_lane | (bval & ~seg), in = j <= max_lane;
	return in ? j : l;
}

// shfl_run launches emu_shfl on a fresh context (a warp fault breaks the
// one it happens in) and returns cuCtxSynchronize's answer, out in *got.
static int shfl_run(unsigned threads, long mode, long b, long c, long mask, long how, std::vector<int> *got) {
	void *ctx, *mod, *fn;
	MUST(cuCtxCreate_v2(&ctx, 0, 0));
	MUST(cuModuleLoadData(&mod, warp_ptx));
	MUST(cuModuleGetFunction(&fn, mod, "emu_shfl"));
	std::vector<int> in(threads), out(threads, -7);
	for (unsigned t = 0; t < threads; t++) in[t] = 1000 + int(t);
	unsigned long long din = upload(in), dout = upload(out);
	void *args[] = {&din, &dout, &mode, &b, &c, &mask, &how};
	MUST(cuLaunchKernel(fn, 2, 1, 1, threads, 1, 1, 0, nullptr, args, nullptr));
	int r = cuCtxSynchronize();
	if (r == 0) *got = download<int>(dout, threads);
	cuCtxDestroy_v2(ctx);
	return r;
}

static void test_warp_shuffles() {
	// Every mode, whole warps and segments of 8 and 16 lanes (c as clang
	// writes it for __shfl_*_sync's width: (32 - width) << 8, with clamp 31
	// but for up, which clamps at 0), on two warps of a block.
	struct Case {
		long mode, b;
		int width;
	} cases[] = {{0, 1, 32}, {0, 3, 8}, {1, 1, 32}, {1, 4, 16}, {1, 5, 8}, {2, 16, 32}, {2, 1, 32}, {2, 4, 8}, {3, 7, 32}, {3, 21, 16}, {3, 2, 8}};
	for (const Case &k : cases) {
		long c = long(32 - k.width) << 8 | (k.mode == 0 ? 0 : 31);
		std::vector<int> got;
		int r = shfl_run(64, k.mode, k.b, c, 0xffffffffL, 0, &got);
		CHECK(r == 0, "shfl mode %ld b %ld width %d: cuCtxSynchronize %d", k.mode, k.b, k.width, r);
		int bad = 0;
		for (int t = 0; r == 0 && t < 64; t++) bad += got[t] != 1000 + (t & ~31) + shfl_want(int(k.mode), t & 31, int(k.b), int(c));
		CHECK(bad == 0, "shfl mode %ld b %ld width %d: %d of 64 lanes wrong", k.mode, k.b, k.width, bad);
	}
	// Lanes taking part in a shuffle by halves are fine: half-warps each with
	// a mask of its own; lanes 0-15 with a mask of their own, or with the
	// whole warp's while lanes 16-31 have exited (PTX waits for the
	// non-exited lanes of the mask); blocks of 48 threads, whose second warp
	// has 16 lanes, shuffling among them.
	std::vector<int> got;
	int r = shfl_run(64, 2, 8, 31, 0, 3, &got);
	int bad = 0;
	for (int t = 0; r == 0 && t < 64; t++) bad += got[t] != 1000 + (t ^ 8);
	CHECK(r == 0 && bad == 0, "shfl within half-warps, each its own mask: rc %d, %d lanes wrong", r, bad);
	for (long how : {0L, 5L}) {
		r = shfl_run(32, 2, 1, 31, 0x0000ffffL, how, &got), bad = 0;
		for (int t = 0; r == 0 && t < 16; t++) bad += got[t] != 1000 + (t ^ 1);
		CHECK(r == 0 && bad == 0, "shfl among lanes 0-15, %s: rc %d, %d lanes wrong",
			how == 0 ? "their own mask" : "the whole warp's mask with lanes 16-31 exited", r, bad);
	}
	r = shfl_run(48, 2, 2, 31, 0xffffffffL, 0, &got), bad = 0;
	for (int t = 0; r == 0 && t < 48; t++) bad += got[t] != 1000 + (t ^ 2);
	CHECK(r == 0 && bad == 0, "shfl in blocks of 48 threads (a second warp of 16 lanes): rc %d, %d lanes wrong", r, bad);
	// What PTX leaves undefined ends the kernel: CUDA_ERROR_LAUNCH_FAILED.
	struct Bad {
		const char *what;
		unsigned threads;
		long mode, b, c, mask, how;
	} bads[] = {
		{"a lane reading one the mask does not name", 32, 2, 16, 31, 0x0000ffffL, 0},
		{"a lane reading one that has exited", 32, 2, 16, 31, 0x0000ffffL, 5},
		{"a lane reading one the block does not have", 48, 2, 16, 31, 0xffffffffL, 0},
		{"lanes named but waiting at __syncthreads", 32, 1, 1, 31, 0x0000ffffL, 1},
		{"lanes whose masks disagree", 32, 2, 1, 31, 0xffffffffL, 2},
		{"a lane its mask does not name", 32, 2, 1, 31, 0x0000ffffL, 4},
	};
	fprintf(stderr, "cudaemu selftest: %zu undefined warp operations, each reported by the emulator as it ends the kernel:\n", sizeof bads / sizeof bads[0]);
	for (const Bad &k : bads) {
		r = shfl_run(k.threads, k.mode, k.b, k.c, k.mask, k.how, &got);
		CHECK(r == 719, "%s: cuCtxSynchronize %d, want 719 (CUDA_ERROR_LAUNCH_FAILED)", k.what, r);
	}
}

// test_warp_syncwarp: without __syncwarp, a lane reading what its
// neighbour writes must sometimes read too early; with it, never.
static void test_warp_syncwarp() {
	void *ctx, *mod, *fn;
	MUST(cuCtxCreate_v2(&ctx, 0, 0));
	MUST(cuModuleLoadData(&mod, warp_ptx));
	MUST(cuModuleGetFunction(&fn, mod, "emu_syncwarp"));
	unsigned long long dout;
	MUST(cuMemAlloc_v2(&dout, 96 * 4));
	for (long sync = 1; sync >= 0; sync--) {
		long gen = 2 + sync;
		launch(fn, 1, 96, {&dout, &gen, &sync}); // one block: a second would find the first's writes
		auto got = download<int>(dout, 96);
		int bad = 0;
		for (int t = 0; t < 96; t++) bad += got[t] != int(gen) * 1024 + (t ^ 1);
		if (sync) {
			CHECK(bad == 0, "__syncwarp: %d of 96 threads read their neighbour's slot before it was written", bad);
		} else {
			CHECK(bad > 0, "without __syncwarp every thread read its neighbour's slot after it was written: the emulator does not model the race");
		}
	}
	MUST(cuCtxDestroy_v2(ctx));
}

// --- bert.ptx: each kernel against a direct computation --------------------

typedef int (*sgemm_batched_fn)(void *, int, int, int, int, int, const float *, const float *, int, long long,
	const float *, int, long long, const float *, float *, int, long long, int);

// --- Half-precision conversions: cvt.cu's kernels against IEEE 754 --------

// The entries of cvt.cu, as a PTX module declares them.
static const char cvt_ptx[] =
	".version 7.0\n.target sm_80\n.address_size 64\n"
	".visible .entry emu_cvt_to_half(.param .u64 p0, .param .u64 p1, .param .u64 p2, .param .u64 p3)\n{\n\tret;\n}\n"
	".visible .entry emu_cvt_from_half(.param .u64 p0, .param .u64 p1, .param .u64 p2)\n{\n\tret;\n}\n";

// binary16_value is the value of binary16 bits h, from the format's
// definition (5 exponent bits biased by 15, 10 fraction bits, subnormals
// in units of 2^-24), written apart from the emulator's bit conversions.
static double binary16_value(uint16_t h) {
	int e = (h >> 10) & 31, m = h & 1023;
	double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
	return h & 0x8000 ? -v : v;
}

// bfloat16_value is the value of bfloat16 bits b: float32's upper half.
static double bfloat16_value(uint16_t b) {
	uint32_t u = uint32_t(b) << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static float float_of_bits(uint32_t u) {
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint32_t bits_of_float(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

// rounded is x rounded to nearest, ties to even, as IEEE 754 defines it for
// a format of digits significant bits whose least normal is 2^min_exp (below
// it the ulp stays 2^(min_exp-digits+1): subnormals) and whose first value
// past the largest finite is overflow (from there, infinity): by libm's
// nearbyint on the scaled value, not by the bit arithmetic under test.
static double rounded(double x, int digits, int min_exp, double overflow) {
	if (isnan(x) || isinf(x) || x == 0) return x;
	int e;
	frexp(fabs(x), &e); // |x| in [2^(e-1), 2^e)
	int q = (e - 1 > min_exp ? e - 1 : min_exp) - (digits - 1); // the ulp is 2^q
	double r = ldexp(nearbyint(ldexp(fabs(x), -q)), q);
	return copysign(r >= overflow ? INFINITY : r, x);
}

// same_value says whether got is want, zero's sign included; any NaN is
// every NaN (cvt.rn gives a NaN for a NaN, its payload the GPU's choice).
static bool same_value(double got, double want) {
	if (isnan(want)) return isnan(got);
	return got == want && signbit(got) == signbit(want);
}

// test_half_conversions holds the kernels' conversions (the prelude's
// __nvvm_f2h_rn, __nvvm_f2bf16_rn and f16_float, which bert.cu calls) to
// rounding worked out in double: every binary16 and every bfloat16 value
// converted to float32 and back to itself (NaNs to a NaN); float32 values
// at every tie between two neighbouring halves and one float32 ulp to
// either side (subnormals, the carry into the least normal, 65520 where
// binary16 overflows, the largest bfloat16), below half the least
// subnormal, infinities, NaNs quiet and signalling; and a million float32
// bit patterns spread over all 2^32.
static void test_half_conversions() {
	void *mod, *to, *from;
	MUST(cuModuleLoadData(&mod, cvt_ptx));
	MUST(cuModuleGetFunction(&to, mod, "emu_cvt_to_half"));
	MUST(cuModuleGetFunction(&from, mod, "emu_cvt_from_half"));

	// Every binary16 to float32.
	std::vector<uint16_t> all(1 << 16);
	for (size_t i = 0; i < all.size(); i++) all[i] = uint16_t(i);
	unsigned long long dall = upload(all), dback;
	MUST(cuMemAlloc_v2(&dback, all.size() * 4));
	long n = long(all.size());
	launch(from, 64, 256, {&dall, &dback, &n});
	std::vector<float> back = download<float>(dback, all.size());
	long bad = 0;
	for (size_t i = 0; i < all.size(); i++) {
		if (same_value(back[i], binary16_value(all[i]))) continue;
		if (bad++ == 0) fprintf(stderr, "FAIL binary16 0x%04zx to float32: %.9g, want %.9g\n", i, back[i], binary16_value(all[i]));
	}
	CHECK(bad == 0, "binary16 to float32: %ld of 65536 wrong", bad);

	// The float32 values to round: first every binary16's (back, each its
	// own half) and every bfloat16's, then the rest.
	std::vector<float> x(back);
	for (uint32_t b = 0; b < (1u << 16); b++) x.push_back(float_of_bits(b << 16));
	for (uint32_t h = 0; h < 0x7c00; h++) {
		float mid = float((binary16_value(uint16_t(h)) + (h == 0x7bff ? 65536.0 : binary16_value(uint16_t(h + 1)))) / 2);
		for (float v : {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)}) x.push_back(v), x.push_back(-v);
	}
	for (uint32_t b = 0; b < 0x7f80; b++) {
		float mid = float_of_bits(b << 16 | 0x8000);
		for (float v : {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)}) x.push_back(v), x.push_back(-v);
	}
	for (float v : {0x1p-25f, 0x1.000002p-25f, 0x1.fffffep-26f, 0x1p-149f, 1e-30f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e38f,
			 3.4028235e38f, INFINITY, float_of_bits(0x7fc00000), float_of_bits(0x7f800001), float_of_bits(0x7fbfffff),
			 float_of_bits(0x7f802000), float_of_bits(0xffffffff)}) {
		x.push_back(v), x.push_back(-v);
	}
	for (uint64_t i = 0; i < (1u << 20); i++) x.push_back(float_of_bits(uint32_t(i * 0x9e3779b1u)));
	n = long(x.size());
	unsigned long long dx = upload(x), df16, dbf16;
	MUST(cuMemAlloc_v2(&df16, x.size() * 2));
	MUST(cuMemAlloc_v2(&dbf16, x.size() * 2));
	launch(to, 64, 256, {&dx, &df16, &dbf16, &n});
	std::vector<uint16_t> f16 = download<uint16_t>(df16, x.size()), bf16 = download<uint16_t>(dbf16, x.size());
	long bad16 = 0, badbf = 0, trip16 = 0, tripbf = 0;
	for (size_t i = 0; i < x.size(); i++) {
		double want16 = rounded(x[i], 11, -14, 0x1p16), wantbf = rounded(x[i], 8, -126, 0x1p128);
		if (!same_value(binary16_value(f16[i]), want16) && bad16++ == 0) {
			fprintf(stderr, "FAIL float32 %a (0x%08x) to binary16: 0x%04x, want %a\n", x[i], bits_of_float(x[i]), f16[i], want16);
		}
		if (!same_value(bfloat16_value(bf16[i]), wantbf) && badbf++ == 0) {
			fprintf(stderr, "FAIL float32 %a (0x%08x) to bfloat16: 0x%04x, want %a\n", x[i], bits_of_float(x[i]), bf16[i], wantbf);
		}
		// The round trips: a binary16's float32 (the first 65536) back to its
		// own bits, a bfloat16's (the next 65536) likewise; NaNs to a NaN.
		if (i < (1u << 16) && !(isnan(x[i]) ? isnan(binary16_value(f16[i])) : f16[i] == i)) trip16++;
		if (i >= (1u << 16) && i < (2u << 16) && !(isnan(x[i]) ? isnan(bfloat16_value(bf16[i])) : bf16[i] == i - (1u << 16))) tripbf++;
	}
	CHECK(bad16 == 0 && trip16 == 0, "float32 to binary16: %ld of %ld wrong, %ld of 65536 binary16 not back to themselves", bad16, n, trip16);
	CHECK(badbf == 0 && tripbf == 0, "float32 to bfloat16: %ld of %ld wrong, %ld of 65536 bfloat16 not back to themselves", badbf, n, tripbf);
	cuMemFree_v2(dall), cuMemFree_v2(dback), cuMemFree_v2(dx), cuMemFree_v2(df16), cuMemFree_v2(dbf16);
}

static double max_abs_diff(const std::vector<float> &a, const std::vector<double> &b) {
	double d = 0;
	for (size_t i = 0; i < a.size(); i++) {
		double e = fabs(double(a[i]) - b[i]);
		if (!(e <= d)) d = e; // NaN counts as worst
	}
	return d;
}

// half_misses counts the values of got (binary16 bits, or bfloat16 with
// bf16) further from want than rounding to nearest allows, half an ulp:
// |x|·2^-11 in binary16 (2^-25 among its subnormals), |x|·2^-8 in
// bfloat16, plus slack for want's own error. A copy never written (the
// emulator's fresh memory is NaN) or written from another value misses.
static long half_misses(const std::vector<uint16_t> &got, const std::vector<double> &want, bool bf16, double slack) {
	long bad = 0;
	for (size_t i = 0; i < got.size(); i++) {
		double v = bf16 ? bfloat16_value(got[i]) : binary16_value(got[i]);
		double bound = bf16 ? fabs(want[i]) * 0x1p-8 : fmax(fabs(want[i]) * 0x1p-11, 0x1p-25);
		if (!(fabs(v - want[i]) <= bound + slack)) bad++;
	}
	return bad;
}

static std::vector<double> layernorm_ref(const std::vector<double> &row, const std::vector<float> &g, const std::vector<float> &b, double eps) {
	double mean = 0, var = 0;
	for (double v : row) mean += v;
	mean /= row.size();
	for (double v : row) var += (v - mean) * (v - mean);
	var /= row.size();
	std::vector<double> out(row.size());
	for (size_t j = 0; j < row.size(); j++) out[j] = (row[j] - mean) / sqrt(var + eps) * g[j] + b[j];
	return out;
}

// test_bert_layernorms runs bert_embed and bert_add_layernorm on rows of h
// columns: every width of row a lane holds in registers, and one past them.
static void test_bert_layernorms(void *mod, long h) {
	void *embed, *addln;
	MUST(cuModuleGetFunction(&embed, mod, "bert_embed"));
	MUST(cuModuleGetFunction(&addln, mod, "bert_add_layernorm"));
	long vocab = 30, maxpos = 9, seq = 7, items = 3, rows = seq * items, f32 = 0;
	double eps = 1e-12;
	std::vector<int> ids(rows);
	std::vector<float> word(vocab * h), pos(maxpos * h), type0(h), gamma(h), beta(h), y(rows * h), bias(h);
	for (auto &t : ids) t = int((frand() + 1) * 0.5f * (vocab - 1));
	for (auto *v : {&word, &pos, &type0, &gamma, &beta, &y, &bias})
		for (auto &x : *v) x = frand();
	unsigned long long dids = upload(ids), dw = upload(word), dp = upload(pos), dt = upload(type0), dg = upload(gamma),
			   db = upload(beta), dy = upload(y), dbias = upload(bias), dx;
	MUST(cuMemAlloc_v2(&dx, rows * h * 4));
	std::vector<double> want(rows * h), want2(rows * h);
	for (long r = 0; r < rows; r++) {
		std::vector<double> row(h);
		for (long j = 0; j < h; j++) row[j] = double(word[ids[r] * h + j] + pos[(r % seq) * h + j] + type0[j]);
		auto o = layernorm_ref(row, gamma, beta, eps);
		for (long j = 0; j < h; j++) {
			want[r * h + j] = o[j];
			row[j] = double(float(o[j])) + double(y[r * h + j] + bias[j]);
		}
		o = layernorm_ref(row, gamma, beta, eps);
		for (long j = 0; j < h; j++) want2[r * h + j] = o[j];
	}
	// Fewer warps than rows (a warp a row), blocks of one and of three.
	for (unsigned block : {32u, 96u}) {
		launch(embed, 5, block, {&dids, &dw, &dp, &dt, &dg, &db, &dx, &rows, &seq, &h, &eps, &dx, &f32});
		double d = max_abs_diff(download<float>(dx, rows * h), want);
		CHECK(d < 1e-5, "bert_embed (width %ld, block %u): off by %g", h, block, d);
		launch(addln, 4, block, {&dx, &dy, &dbias, &dg, &db, &rows, &h, &eps, &dx, &f32});
		d = max_abs_diff(download<float>(dx, rows * h), want2);
		CHECK(d < 1e-5, "bert_add_layernorm (width %ld, block %u): off by %g", h, block, d);
	}
	// With prec 1 (binary16) and 2 (bfloat16) each kernel also writes the
	// row's half-precision copy to x16, rounded from the float32 it leaves
	// in x (which stays as with prec 0); x16 starts NaN before each launch.
	unsigned long long dx16;
	MUST(cuMemAlloc_v2(&dx16, rows * h * 2));
	std::vector<uint16_t> nan16(rows * h, 0xffff);
	for (long prec : {1L, 2L}) {
		MUST(cuMemcpyHtoD_v2(dx16, nan16.data(), nan16.size() * 2));
		launch(embed, 5, 64, {&dids, &dw, &dp, &dt, &dg, &db, &dx, &rows, &seq, &h, &eps, &dx16, &prec});
		auto x = download<float>(dx, rows * h);
		double d = max_abs_diff(x, want);
		long bad = half_misses(download<uint16_t>(dx16, rows * h), std::vector<double>(x.begin(), x.end()), prec == 2, 0);
		CHECK(d < 1e-5 && bad == 0, "bert_embed (width %ld, prec %ld): off by %g, %ld of %ld half values wrong",
			h, prec, d, bad, rows * h);
		MUST(cuMemcpyHtoD_v2(dx16, nan16.data(), nan16.size() * 2));
		launch(addln, 4, 64, {&dx, &dy, &dbias, &dg, &db, &rows, &h, &eps, &dx16, &prec});
		x = download<float>(dx, rows * h);
		d = max_abs_diff(x, want2);
		bad = half_misses(download<uint16_t>(dx16, rows * h), std::vector<double>(x.begin(), x.end()), prec == 2, 0);
		CHECK(d < 1e-5 && bad == 0, "bert_add_layernorm (width %ld, prec %ld): off by %g, %ld of %ld half values wrong",
			h, prec, d, bad, rows * h);
	}
	for (unsigned long long p : {dids, dw, dp, dt, dg, db, dy, dbias, dx, dx16}) cuMemFree_v2(p);
}

static void test_bert_attention(void *mod, sgemm_batched_fn batched, void *handle) {
	void *split, *merge, *softmax;
	MUST(cuModuleGetFunction(&split, mod, "bert_split_heads"));
	MUST(cuModuleGetFunction(&merge, mod, "bert_merge_heads"));
	MUST(cuModuleGetFunction(&softmax, mod, "bert_softmax"));
	long items = 3, seq = 6, heads = 2, d = 5, h = heads * d, rows = items * seq;
	std::vector<int> lens = {6, 1, 4};
	std::vector<float> qkv(rows * 3 * h), bias(3 * h);
	for (auto &x : qkv) x = frand();
	for (auto &x : bias) x = frand();
	unsigned long long dqkv = upload(qkv), dbias = upload(bias), dlens = upload(lens), dheads, dscores, dctx;
	MUST(cuMemAlloc_v2(&dheads, rows * 3 * h * 4));
	MUST(cuMemAlloc_v2(&dscores, items * heads * seq * seq * 4));
	MUST(cuMemAlloc_v2(&dctx, rows * h * 4));
	long f32 = 0;
	launch(split, 2, 32, {&dqkv, &dbias, &dheads, &dheads, &items, &seq, &heads, &d, &f32, &f32});
	// Scores, as the backend asks: S = Q·Kᵀ per (item, head).
	const float one = 1, zero = 0;
	long long sd = seq * d, ss = seq * seq;
	long nb = items * heads;
	unsigned long long dq = dheads, dk = dheads + 4 * rows * h, dv = dheads + 8 * rows * h;
	MUST(batched(handle, 1, 0, seq, seq, d, &one, (const float *)dk, d, sd, (const float *)dq, d, sd, &zero, (float *)dscores, seq, ss, nb));
	MUST(cuCtxSynchronize());
	double scale = 1 / sqrt(double(d));
	long nrows = nb * seq;
	launch(softmax, 7, 32, {&dscores, &dlens, &nrows, &seq, &heads, &scale, &dscores, &f32});
	auto probs = download<float>(dscores, nb * seq * seq);
	MUST(batched(handle, 0, 0, d, seq, seq, &one, (const float *)dv, d, sd, (const float *)dscores, seq, ss, &zero, (float *)dq, d, sd, nb));
	MUST(cuCtxSynchronize());
	launch(merge, 3, 32, {&dq, &dctx, &items, &seq, &heads, &d, &f32, &f32});
	auto ctx = download<float>(dctx, rows * h);
	std::vector<double> wantp(nb * seq * seq), wantc(rows * h);
	auto at = [&](long b, long p, long which, long hd, long e) { return double(qkv[(b * seq + p) * 3 * h + which * h + hd * d + e] + bias[which * h + hd * d + e]); };
	for (long b = 0; b < items; b++)
		for (long hd = 0; hd < heads; hd++)
			for (long i = 0; i < seq; i++) {
				std::vector<double> row(seq);
				double mx = -1e300, sum = 0;
				for (long j = 0; j < lens[b]; j++) {
					double dot = 0;
					for (long e = 0; e < d; e++) dot += at(b, i, 0, hd, e) * at(b, j, 1, hd, e);
					row[j] = dot * scale;
					mx = row[j] > mx ? row[j] : mx;
				}
				for (long j = 0; j < seq; j++) {
					row[j] = j < lens[b] ? exp(row[j] - mx) : 0;
					sum += row[j];
				}
				for (long j = 0; j < seq; j++) wantp[((b * heads + hd) * seq + i) * seq + j] = row[j] / sum;
				for (long e = 0; e < d; e++) {
					double c = 0;
					for (long j = 0; j < seq; j++) c += row[j] / sum * at(b, j, 2, hd, e);
					wantc[(b * seq + i) * h + hd * d + e] = c;
				}
			}
	double dp = max_abs_diff(probs, wantp), dc = max_abs_diff(ctx, wantc);
	CHECK(dp < 1e-6, "bert_softmax after the strided-batched Q·Kᵀ: off by %g", dp);
	CHECK(dc < 1e-5, "attention output (split, batched GEMMs, softmax, merge): off by %g", dc);
}

// attention_ref is softmax(q·Kᵀ·scale)·V in double for every row of q
// ([items·heads·seq, d], as bert_split_heads lays out Q, K and V), over the
// first lens[item] keys: the fused kernels' reference.
static std::vector<double> attention_ref(const std::vector<float> &q, const std::vector<float> &k, const std::vector<float> &v,
	const std::vector<int> &lens, long heads, long seq, long d, double scale) {
	long nrows = long(q.size()) / d;
	std::vector<double> want(q.size());
	for (long r = 0; r < nrows; r++) {
		long bh = r / seq, len = lens[bh / heads];
		std::vector<double> s(len);
		double mx = -1e300, sum = 0;
		for (long j = 0; j < len; j++) {
			double dot = 0;
			for (long e = 0; e < d; e++) dot += double(q[r * d + e]) * k[(bh * seq + j) * d + e];
			s[j] = dot * scale;
			mx = s[j] > mx ? s[j] : mx;
		}
		for (long j = 0; j < len; j++) sum += s[j] = exp(s[j] - mx);
		for (long e = 0; e < d; e++) {
			double c = 0;
			for (long j = 0; j < len; j++) c += s[j] / sum * v[(bh * seq + j) * d + e];
			want[r * d + e] = c;
		}
	}
	return want;
}

// The softmax's maximum only keeps exp in range: a wrong one cancels out
// unless it is far off. Rows whose scores lie hundreds apart, each block
// taking several rows (so a stale maximum of the row before is far off),
// make a maximum computed wrong overflow or underflow.
// bert_attention (the fused attention) against a direct computation in
// double: rows of 70 keys in tiles of 32 (three tiles, the last partial),
// items of 70, 1 and 45 keys (the rest masked), fewer blocks than rows (so
// that each block's shared rows are reused), and one item whose scores lie
// hundreds apart, so that a tile raising the running maximum must rescale
// what the earlier tiles summed. Then with tiles of 64.
static void test_bert_fused_attention(void *mod) {
	void *fn;
	MUST(cuModuleGetFunction(&fn, mod, "bert_attention"));
	long items = 3, heads = 2, seq = 70, d = 20, nb = items * heads, nrows = nb * seq;
	std::vector<int> lens = {70, 1, 45};
	std::vector<float> q(nrows * d), k(nrows * d), v(nrows * d);
	for (auto &x : q) x = frand();
	for (auto &x : k) x = frand();
	for (auto &x : v) x = frand();
	// Item 2's keys grow along the sequence: its scores reach the hundreds
	// only in the later tiles.
	for (long hd = 0; hd < heads; hd++)
		for (long j = 0; j < seq; j++)
			for (long e = 0; e < d; e++) k[((2 * heads + hd) * seq + j) * d + e] *= 1 + j;
	double scale = 1 / sqrt(double(d));
	std::vector<double> want = attention_ref(q, k, v, lens, heads, seq, d, scale);
	for (unsigned threads : {32u, 64u}) {
		unsigned long long dq = upload(q), dk = upload(k), dv = upload(v), dl = upload(lens);
		launch(fn, 7, threads, {&dq, &dk, &dv, &dl, &nrows, &seq, &heads, &d, &scale});
		double diff = max_abs_diff(download<float>(dq, nrows * d), want);
		CHECK(diff < 1e-5, "bert_attention, tiles of %u keys: off by %g", threads, diff);
		cuMemFree_v2(dq), cuMemFree_v2(dk), cuMemFree_v2(dv), cuMemFree_v2(dl);
	}
}

// half_of is x (a value binary16 holds exactly) as binary16 bits (bf16
// false), or x's upper 16 bits, bfloat16 (bf16 true; x is then rounded
// toward zero first, by the caller's choice of x).
static uint16_t half_of(float x, bool bf16) {
	uint32_t u;
	memcpy(&u, &x, 4);
	if (bf16) return uint16_t(u >> 16);
	uint16_t sign = uint16_t((u >> 16) & 0x8000u);
	if (x == 0) return sign;
	int e;
	double m = frexp(fabs(double(x)), &e); // |x| = m·2^e, m in [0.5, 1)
	return sign | uint16_t((e - 1 + 15) << 10) | uint16_t(lrint(m * 2048) - 1024);
}

// to_half_value is x rounded to what bf16 or binary16 holds: bfloat16
// truncated, binary16 to 11 significant bits (normal values only: x at
// least 2^-14 in magnitude, else 0).
static float to_half_value(float x, bool bf16) {
	if (bf16) {
		uint32_t u;
		memcpy(&u, &x, 4);
		u &= 0xffff0000u;
		memcpy(&x, &u, 4);
		return x;
	}
	if (fabsf(x) < 1.0f / 16384) return 0;
	int e;
	double m = frexp(double(x), &e);
	return float(ldexp(nearbyint(m * 2048) / 2048, e));
}

// bert_attention_tiled (the fused attention with queries tiled too)
// against a direct computation in double: heads of 20 (padded to 32), 32
// and 64 components, so 150 keys take two or three tiles of keys, the last
// partial; items of 150, 1, 77 and 130 keys (the rest masked, and whole
// tiles of queries padding); tiles of 32 and 64 queries, the last partial;
// fewer blocks than tiles (each block's shared tiles are reused across
// work); one item whose keys grow along the sequence, so that its later
// tiles raise the running maximum by hundreds and must rescale what the
// earlier ones summed. In float32 in place (out = q), and from binary16
// and bfloat16 inputs into a separate output whose padded rows must stay
// as they were (the kernel neither reads nor writes a padded query).
static void test_bert_tiled_attention(void *mod) {
	void *fn;
	MUST(cuModuleGetFunction(&fn, mod, "bert_attention_tiled"));
	long items = 4, heads = 2, seq = 150, nbh = items * heads;
	std::vector<int> lens = {150, 1, 77, 130};
	for (long d : {20L, 32L, 64L}) {
		std::vector<float> q(nbh * seq * d), k(q.size()), v(q.size());
		for (auto &x : q) x = frand();
		for (auto &x : k) x = frand();
		for (auto &x : v) x = frand();
		for (long hd = 0; hd < heads; hd++)
			for (long j = 0; j < seq; j++)
				for (long e = 0; e < d; e++) k[((3 * heads + hd) * seq + j) * d + e] *= 1 + j / 4.0f;
		for (long prec = 0; prec < 3; prec++) {
			std::vector<float> qv = q, kv = k, vv = v;
			std::vector<uint16_t> qh(q.size()), kh(q.size()), vh(q.size());
			if (prec > 0) {
				for (size_t x = 0; x < q.size(); x++) {
					qv[x] = to_half_value(q[x], prec == 2), kv[x] = to_half_value(k[x], prec == 2), vv[x] = to_half_value(v[x], prec == 2);
					qh[x] = half_of(qv[x], prec == 2), kh[x] = half_of(kv[x], prec == 2), vh[x] = half_of(vv[x], prec == 2);
				}
			}
			double scale = 1 / sqrt(double(d));
			std::vector<double> want = attention_ref(qv, kv, vv, lens, heads, seq, d, scale);
			// A padded query is left as it was: q itself in place, the
			// sentinel -7 otherwise.
			for (long r = 0; r < nbh * seq; r++)
				if (r % seq >= lens[r / seq / heads])
					for (long e = 0; e < d; e++) want[r * d + e] = prec == 0 ? qv[r * d + e] : -7.0;
			for (unsigned threads : {32u, 64u}) {
				unsigned long long dq, dk, dv, dout, dl = upload(lens);
				if (prec == 0) {
					dq = upload(qv), dk = upload(kv), dv = upload(vv), dout = dq;
				} else {
					dq = upload(qh), dk = upload(kh), dv = upload(vh);
					dout = upload(std::vector<float>(q.size(), -7.0f));
				}
				launch(fn, 5, threads, {&dq, &dk, &dv, &dout, &dl, &nbh, &seq, &heads, &d, &scale, &prec});
				double diff = max_abs_diff(download<float>(dout, q.size()), want);
				CHECK(diff < 1e-5, "bert_attention_tiled, d %ld, prec %ld, tiles of %u queries: off by %g", d, prec, threads, diff);
				cuMemFree_v2(dq), cuMemFree_v2(dk), cuMemFree_v2(dv), cuMemFree_v2(dl);
				if (dout != dq) cuMemFree_v2(dout);
			}
		}
	}
}

// test_bert_softmax_range runs bert_softmax on rows of seq scores hundreds
// apart (so that a wrong maximum overflows), items of lengths from 1 to seq:
// every length of row a lane holds in registers, and one past them.
static void test_bert_softmax_range(void *mod, long seq) {
	void *softmax;
	MUST(cuModuleGetFunction(&softmax, mod, "bert_softmax"));
	long items = seq > 100 ? 3 : 8, heads = 1, nrows = items * seq, f32 = 0;
	std::vector<int> lens = {int(seq), int(seq / 2 + 1), 1, 5, int(seq), int(seq), 1, int(seq - 7)};
	lens.resize(items);
	std::vector<float> sc(nrows * seq);
	for (long r = 0; r < nrows; r++)
		for (long j = 0; j < seq; j++) sc[r * seq + j] = -200.0f * float(r % 16) + 40.0f * frand();
	unsigned long long ds = upload(sc), dl = upload(lens);
	double scale = 1.0;
	for (unsigned block : {32u, 64u}) {
		MUST(cuMemcpyHtoD_v2(ds, sc.data(), sc.size() * 4));
		launch(softmax, 3, block, {&ds, &dl, &nrows, &seq, &heads, &scale, &ds, &f32});
		auto got = download<float>(ds, nrows * seq);
		std::vector<double> want(nrows * seq);
		for (long r = 0; r < nrows; r++) {
			long len = lens[r / seq];
			double mx = -1e300, sum = 0;
			for (long j = 0; j < len; j++) mx = sc[r * seq + j] > mx ? sc[r * seq + j] : mx;
			for (long j = 0; j < len; j++) sum += exp(sc[r * seq + j] - mx);
			for (long j = 0; j < seq; j++) want[r * seq + j] = j < len ? exp(sc[r * seq + j] - mx) / sum : 0;
		}
		double d = max_abs_diff(got, want);
		CHECK(d < 1e-6, "bert_softmax on scores hundreds apart (%ld keys, block %u): off by %g", seq, block, d);
		// With prec 1 and 2 the probabilities go to p16 in half precision
		// (s is then scratch); p16 starts NaN.
		for (long prec : {1L, 2L}) {
			unsigned long long dp16 = upload(std::vector<uint16_t>(nrows * seq, 0xffff));
			MUST(cuMemcpyHtoD_v2(ds, sc.data(), sc.size() * 4));
			launch(softmax, 3, block, {&ds, &dl, &nrows, &seq, &heads, &scale, &dp16, &prec});
			long bad = half_misses(download<uint16_t>(dp16, nrows * seq), want, prec == 2, 1e-6);
			CHECK(bad == 0, "bert_softmax into half precision (%ld keys, block %u, prec %ld): %ld of %ld probabilities wrong",
				seq, block, prec, bad, nrows * seq);
			cuMemFree_v2(dp16);
		}
	}
	cuMemFree_v2(ds), cuMemFree_v2(dl);
}

static void test_bert_gelu_erf(void *mod) {
	void *gelu, *erff;
	MUST(cuModuleGetFunction(&gelu, mod, "bert_bias_gelu"));
	MUST(cuModuleGetFunction(&erff, mod, "bert_erf"));
	long n = 20001, w = 7, f32 = 0;
	std::vector<float> x(n), bias(w);
	for (long i = 0; i < n; i++) x[i] = -10.0f + 20.0f * float(i) / float(n - 1);
	for (auto &b : bias) b = 0.1f * frand();
	unsigned long long dx = upload(x), db = upload(bias), dy;
	MUST(cuMemAlloc_v2(&dy, n * 4));
	launch(erff, 3, 128, {&dx, &dy, &n});
	auto y = download<float>(dy, n);
	double worst = 0;
	for (long i = 0; i < n; i++) {
		double want = erf(double(x[i]));
		double rel = want == 0 ? fabs(y[i]) : fabs(y[i] - want) / fabs(want);
		if (!(rel <= worst)) worst = rel;
	}
	CHECK(worst < 4e-7, "bert_erf: relative error %g against libm's erf", worst);
	long rows = n / w;
	launch(gelu, 5, 64, {&dx, &db, &rows, &w, &f32});
	auto g = download<float>(dx, rows * w);
	std::vector<double> want(rows * w);
	for (long k = 0; k < rows * w; k++) {
		double v = double(x[k] + bias[k % w]);
		want[k] = 0.5 * v * erfc(-v / sqrt(2.0));
	}
	double dg = max_abs_diff(g, want);
	CHECK(dg < 2e-6, "bert_bias_gelu: off by %g from v·Φ(v)", dg);
}

static void test_bert_pool_norm(void *mod) {
	void *pool, *norm;
	MUST(cuModuleGetFunction(&pool, mod, "bert_pool"));
	MUST(cuModuleGetFunction(&norm, mod, "bert_l2norm"));
	long items = 4, seq = 5, h = 40;
	std::vector<int> lens = {5, 1, 3, 2};
	std::vector<float> x(items * seq * h);
	for (auto &v : x) v = frand();
	unsigned long long dx = upload(x), dl = upload(lens), dout;
	MUST(cuMemAlloc_v2(&dout, items * h * 4));
	for (long mode = 0; mode < 3; mode++) {
		launch(pool, 3, 16, {&dx, &dl, &dout, &items, &seq, &h, &mode});
		auto got = download<float>(dout, items * h);
		launch(norm, 3, 32, {&dout, &items, &h});
		auto normed = download<float>(dout, items * h);
		std::vector<double> want(items * h), wantn(items * h);
		for (long b = 0; b < items; b++) {
			double ss = 0;
			for (long j = 0; j < h; j++) {
				double v = x[b * seq * h + j], s = 0;
				for (long t = 0; t < lens[b]; t++) {
					double u = x[(b * seq + t) * h + j];
					s += u;
					if (mode == 2 && u > v) v = u;
				}
				want[b * h + j] = mode == 0 ? s / lens[b] : v;
				ss += want[b * h + j] * want[b * h + j];
			}
			for (long j = 0; j < h; j++) wantn[b * h + j] = want[b * h + j] / sqrt(ss);
		}
		double dp = max_abs_diff(got, want), dn = max_abs_diff(normed, wantn);
		CHECK(dp < 1e-6, "bert_pool mode %ld: off by %g", mode, dp);
		CHECK(dn < 1e-6, "bert_l2norm after pool mode %ld: off by %g", mode, dn);
	}
}

static void test_sgemm_batched(sgemm_batched_fn batched, sgemm_fn sgemm, void *h) {
	// Each product of a strided batch equals SGEMM on its operands.
	int m = 5, n = 4, k = 3, count = 3;
	long long sa = 6 * 5, sb = 5 * 4, sc = 6 * 4;
	std::vector<float> A(sa * count), B(sb * count);
	for (auto &x : A) x = frand();
	for (auto &x : B) x = frand();
	unsigned long long dA = upload(A), dB = upload(B), dC, dC1;
	MUST(cuMemAlloc_v2(&dC, sc * count * 4));
	MUST(cuMemAlloc_v2(&dC1, sc * 4));
	const float alpha = 0.5f, beta = 0;
	// op(A) = Aᵀ (A is k×m, lda 6), B k×n (ldb 5): padded leading dimensions.
	MUST(batched(h, 1, 0, m, n, k, &alpha, (const float *)dA, 6, sa, (const float *)dB, 5, sb, &beta, (float *)dC, 6, sc, count));
	MUST(cuCtxSynchronize());
	auto got = download<float>(dC, sc * count);
	for (int i = 0; i < count; i++) {
		MUST(sgemm(h, 1, 0, m, n, k, &alpha, (const float *)(dA + 4 * i * sa), 6, (const float *)(dB + 4 * i * sb), 5, &beta, (float *)dC1, 6));
		auto one = download<float>(dC1, sc);
		int bad = 0;
		for (int j = 0; j < n; j++)
			for (int r = 0; r < m; r++) bad += one[j * 6 + r] != got[i * sc + j * 6 + r];
		CHECK(bad == 0, "cublasSgemmStridedBatched: product %d differs from cublasSgemm_v2 in %d values", i, bad);
	}
}

// --- cublasGemmEx: binary16 and bfloat16 operands, float32 accumulation ------

typedef int (*gemm_ex_fn)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int,
	const void *, void *, int, int, int, int);
typedef int (*gemm_ex_batched_fn)(void *, int, int, int, int, int, const void *, const void *, int, int, long long,
	const void *, int, int, long long, const void *, void *, int, int, long long, int, int, int);

enum { R_32F = 0, R_16F = 2, R_16BF = 14, COMPUTE_16F = 64, COMPUTE_32F = 68, FAST_16F = 74, ALGO_DEFAULT = -1, ALGO_TENSOR_OP = 99 };

// to16 is what GemmEx writes for f into a C of type ct (16F or 16BF): C =
// alpha·1·1 with alpha f, rounded once.
static uint16_t to16(gemm_ex_fn ex, void *h, int ct, float f) {
	uint16_t one = ct == R_16F ? 0x3c00 : 0x3f80;
	unsigned long long dA = upload(std::vector<uint16_t>{one}), dC;
	MUST(cuMemAlloc_v2(&dC, 2));
	float beta = 0;
	MUST(ex(h, 0, 0, 1, 1, 1, &f, (const void *)dA, ct, 1, (const void *)dA, ct, 1, &beta, (void *)dC, ct, 1, COMPUTE_32F, ALGO_TENSOR_OP));
	uint16_t got = download<uint16_t>(dC, 1)[0];
	cuMemFree_v2(dA), cuMemFree_v2(dC);
	return got;
}

// from16 is the float32 GemmEx reads bits of type t (16F or 16BF) as: C =
// bits·1 into a float32 C.
static float from16(gemm_ex_fn ex, void *h, int t, uint16_t bits) {
	uint16_t one = t == R_16F ? 0x3c00 : 0x3f80;
	unsigned long long dA = upload(std::vector<uint16_t>{bits}), dB = upload(std::vector<uint16_t>{one}), dC;
	MUST(cuMemAlloc_v2(&dC, 4));
	float alpha = 1, beta = 0;
	MUST(ex(h, 0, 0, 1, 1, 1, &alpha, (const void *)dA, t, 1, (const void *)dB, t, 1, &beta, (void *)dC, R_32F, 1, COMPUTE_32F, ALGO_DEFAULT));
	float got = download<float>(dC, 1)[0];
	cuMemFree_v2(dA), cuMemFree_v2(dB), cuMemFree_v2(dC);
	return got;
}

static void test_gemm_ex_conversions(gemm_ex_fn ex, void *h) {
	// IEEE 754 binary16, round to nearest even: ties, the largest finite,
	// overflow, subnormals (and one rounding up into the normals), zero's
	// sign, NaN.
	struct { float f; uint16_t want; } halves[] = {
		{1.0f, 0x3c00}, {-2.0f, 0xc000}, {0.1f, 0x2e66}, {65504.0f, 0x7bff}, {65519.99f, 0x7bff}, {65520.0f, 0x7c00},
		{1e30f, 0x7c00}, {-INFINITY, 0xfc00}, {ldexpf(1, -14), 0x0400}, {ldexpf(1, -24), 0x0001}, {ldexpf(1, -25), 0x0000},
		{ldexpf(3, -26), 0x0001}, {1e-8f, 0x0000}, {ldexpf(1023, -24) + ldexpf(1, -25), 0x0400},
		{ldexpf(1021, -24) + ldexpf(1, -25), 0x03fe}, {1.0f + ldexpf(1, -11), 0x3c00}, {1.0f + ldexpf(3, -11), 0x3c02},
		{-0.0f, 0x8000},
	};
	for (auto &c : halves) {
		uint16_t got = to16(ex, h, R_16F, c.f);
		CHECK(got == c.want, "GemmEx float32 %.9g to binary16: 0x%04x, want 0x%04x", c.f, got, c.want);
	}
	uint16_t nan = to16(ex, h, R_16F, NAN);
	CHECK((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0, "GemmEx NaN to binary16: 0x%04x, not a NaN", nan);
	struct { uint16_t bits; float want; } back[] = {
		{0x0001, ldexpf(1, -24)}, {0x03ff, ldexpf(1023, -24)}, {0x0400, ldexpf(1, -14)}, {0x7bff, 65504.0f},
		{0xfc00, -INFINITY}, {0x3555, 0.333251953125f},
	};
	for (auto &c : back) {
		float got = from16(ex, h, R_16F, c.bits);
		CHECK(got == c.want, "GemmEx binary16 0x%04x to float32: %.9g, want %.9g", c.bits, got, c.want);
	}
	struct { float f; uint16_t want; } bf[] = {
		{1.0f, 0x3f80}, {1.0f + ldexpf(1, -8), 0x3f80}, {1.0f + ldexpf(3, -8), 0x3f82}, {-3.0f, 0xc040},
		{3.4028235e38f, 0x7f80}, {ldexpf(1, -133), 0x0001},
	};
	for (auto &c : bf) {
		uint16_t got = to16(ex, h, R_16BF, c.f);
		CHECK(got == c.want, "GemmEx float32 %.9g to bfloat16: 0x%04x, want 0x%04x", c.f, got, c.want);
	}
	CHECK(from16(ex, h, R_16BF, 0x3fc0) == 1.5f, "GemmEx bfloat16 0x3fc0 to float32: not 1.5");
}

// random_halves is n binary16 values of either sign between 1/8 and 4.
static std::vector<uint16_t> random_halves(size_t n) {
	std::vector<uint16_t> out(n);
	for (auto &v : out) {
		rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
		uint64_t r = rng_state >> 33;
		v = uint16_t(((r & 1) << 15) | ((12 + (r >> 1) % 5) << 10) | ((r >> 4) & 0x3ff));
	}
	return out;
}

// floats_of is what GemmEx reads the binary16 values v as: one product of
// v (as a column) and 1 into a float32 column.
static std::vector<float> floats_of(gemm_ex_fn ex, void *h, const std::vector<uint16_t> &v) {
	unsigned long long dA = upload(v), dB = upload(std::vector<uint16_t>{0x3c00}), dC;
	MUST(cuMemAlloc_v2(&dC, v.size() * 4));
	float alpha = 1, beta = 0;
	int m = int(v.size());
	MUST(ex(h, 0, 0, m, 1, 1, &alpha, (const void *)dA, R_16F, m, (const void *)dB, R_16F, 1, &beta, (void *)dC, R_32F, m, COMPUTE_32F, ALGO_DEFAULT));
	auto out = download<float>(dC, v.size());
	cuMemFree_v2(dA), cuMemFree_v2(dB), cuMemFree_v2(dC);
	return out;
}

static void test_gemm_ex(gemm_ex_fn ex, gemm_ex_batched_fn exb, void *h) {
	test_gemm_ex_conversions(ex, h);

	// Float32 accumulation: 4096 products of 1·1 sum to 4096; a binary16
	// accumulator stops at 2048, where adding 1 rounds back down.
	{
		int k = 4096;
		std::vector<uint16_t> ones(k, 0x3c00);
		unsigned long long dA = upload(ones), dC, dC16;
		MUST(cuMemAlloc_v2(&dC, 4));
		MUST(cuMemAlloc_v2(&dC16, 2));
		float alpha = 1, beta = 0;
		MUST(ex(h, 1, 0, 1, 1, k, &alpha, (const void *)dA, R_16F, k, (const void *)dA, R_16F, k, &beta, (void *)dC, R_32F, 1, COMPUTE_32F, ALGO_TENSOR_OP));
		MUST(ex(h, 1, 0, 1, 1, k, &alpha, (const void *)dA, R_16F, k, (const void *)dA, R_16F, k, &beta, (void *)dC16, R_16F, 1, COMPUTE_32F, ALGO_TENSOR_OP));
		float got = download<float>(dC, 1)[0];
		uint16_t got16 = download<uint16_t>(dC16, 1)[0];
		CHECK(got == 4096.0f && got16 == 0x6c00, "GemmEx: 4096 products of 1 sum to %g (binary16 0x%04x), want 4096 (0x6c00)", got, got16);
		cuMemFree_v2(dA), cuMemFree_v2(dC), cuMemFree_v2(dC16);
	}

	// Every transpose mode, padded leading dimensions, beta 0 on NaN memory
	// and beta 2: against a direct computation on the binary16 operands.
	int m = 11, n = 6, k = 37;
	const char *names = "NT";
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++)
			for (float beta : {0.0f, 2.0f}) {
				int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
				int lda = arows + 2, ldb = brows + 3, ldc = m + 1;
				std::vector<float> C(ldc * n);
				for (auto &v : C) v = frand();
				auto A = random_halves(lda * acols), B = random_halves(ldb * bcols);
				auto Af = floats_of(ex, h, A), Bf = floats_of(ex, h, B);
				unsigned long long dA = upload(A), dB = upload(B), dC;
				if (beta == 0.0f) {
					MUST(cuMemAlloc_v2(&dC, C.size() * 4));
				} else {
					dC = upload(C);
				}
				float alpha = 0.5f;
				MUST(ex(h, ta, tb, m, n, k, &alpha, (const void *)dA, R_16F, lda, (const void *)dB, R_16F, ldb, &beta, (void *)dC, R_32F, ldc, COMPUTE_32F, ALGO_TENSOR_OP));
				auto got = download<float>(dC, C.size());
				double worst = gemm_error(ta, tb, m, n, k, alpha, Af, lda, Bf, ldb, beta, C, ldc, got, true);
				CHECK(worst < 1e-5, "GemmEx 16F %c%c beta %g: largest relative error %g", names[ta], names[tb], beta, worst);
				cuMemFree_v2(dA), cuMemFree_v2(dB), cuMemFree_v2(dC);
			}

	// The strided-batched form equals GemmEx product by product, binary16 C.
	{
		int count = 3;
		long long sa = 40 * 5, sb = 40 * 4, sc = 6 * 4;
		auto A = random_halves(sa * count), B = random_halves(sb * count);
		unsigned long long dA = upload(A), dB = upload(B), dC, dC1;
		MUST(cuMemAlloc_v2(&dC, sc * count * 2));
		MUST(cuMemAlloc_v2(&dC1, sc * 2));
		const float alpha = 1, beta = 0;
		MUST(exb(h, 1, 0, 5, 4, 40, &alpha, (const void *)dA, R_16F, 40, sa, (const void *)dB, R_16F, 40, sb, &beta, (void *)dC, R_16F, 6, sc, count, COMPUTE_32F, ALGO_TENSOR_OP));
		auto got = download<uint16_t>(dC, sc * count);
		for (int i = 0; i < count; i++) {
			MUST(ex(h, 1, 0, 5, 4, 40, &alpha, (const void *)(dA + 2 * i * sa), R_16F, 40, (const void *)(dB + 2 * i * sb), R_16F, 40, &beta, (void *)dC1, R_16F, 6, COMPUTE_32F, ALGO_TENSOR_OP));
			auto one = download<uint16_t>(dC1, sc);
			int bad = 0;
			for (int j = 0; j < 4; j++)
				for (int r = 0; r < 5; r++) bad += one[j * 6 + r] != got[i * sc + j * 6 + r];
			CHECK(bad == 0, "cublasGemmStridedBatchedEx: product %d differs from cublasGemmEx in %d values", i, bad);
		}
		cuMemFree_v2(dA), cuMemFree_v2(dB), cuMemFree_v2(dC), cuMemFree_v2(dC1);
	}

	// What cuBLAS does not support is refused (CUBLAS_STATUS_NOT_SUPPORTED):
	// A and B of different types, a binary16 accumulator (not emulated);
	// an unknown algorithm is an invalid value.
	{
		unsigned long long d;
		MUST(cuMemAlloc_v2(&d, 64));
		float one = 1, zero = 0;
		int mixed = ex(h, 0, 0, 1, 1, 1, &one, (const void *)d, R_16F, 1, (const void *)d, R_32F, 1, &zero, (void *)d, R_32F, 1, COMPUTE_32F, ALGO_DEFAULT);
		int c16 = ex(h, 0, 0, 1, 1, 1, &one, (const void *)d, R_16F, 1, (const void *)d, R_16F, 1, &zero, (void *)d, R_16F, 1, COMPUTE_16F, ALGO_DEFAULT);
		int algo = ex(h, 0, 0, 1, 1, 1, &one, (const void *)d, R_16F, 1, (const void *)d, R_16F, 1, &zero, (void *)d, R_32F, 1, COMPUTE_32F, 50);
		CHECK(mixed == 15 && c16 == 15 && algo == 7, "GemmEx: mixed types %d, binary16 compute %d, algorithm 50 %d; want 15, 15, 7", mixed, c16, algo);
		cuMemFree_v2(d);
	}

	// CUBLAS_COMPUTE_32F_FAST_16F may round float32 inputs to binary16 (the
	// emulator always does): 1 + 2^-12 becomes 1.
	{
		std::vector<float> a{1.0f + ldexpf(1, -12)}, b{1.0f};
		unsigned long long dA = upload(a), dB = upload(b), dC;
		MUST(cuMemAlloc_v2(&dC, 4));
		float one = 1, zero = 0;
		MUST(ex(h, 0, 0, 1, 1, 1, &one, (const void *)dA, R_32F, 1, (const void *)dB, R_32F, 1, &zero, (void *)dC, R_32F, 1, COMPUTE_32F, ALGO_DEFAULT));
		float exact = download<float>(dC, 1)[0];
		MUST(ex(h, 0, 0, 1, 1, 1, &one, (const void *)dA, R_32F, 1, (const void *)dB, R_32F, 1, &zero, (void *)dC, R_32F, 1, FAST_16F, ALGO_DEFAULT));
		float fast = download<float>(dC, 1)[0];
		CHECK(exact == a[0] && fast == 1.0f, "GemmEx float32: %.9g with COMPUTE_32F, %.9g with FAST_16F; want %.9g and 1", exact, fast, a[0]);
		cuMemFree_v2(dA), cuMemFree_v2(dB), cuMemFree_v2(dC);
	}
}

int main(int argc, char **argv) {
	if (argc < 4) {
		fprintf(stderr, "usage: selftest LIBCUBLAS EMBED_PTX BERT_PTX\n");
		return 2;
	}
	auto read = [](const char *path) {
		FILE *f = fopen(path, "rb");
		if (!f) {
			perror(path);
			exit(2);
		}
		std::string text;
		char buf[4096];
		size_t n;
		while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
		fclose(f);
		return text;
	};
	std::string ptx = read(argv[2]), bert_ptx = read(argv[3]);

	MUST(cuInit(0));
	void *ctx, *mod, *bert_mod;
	MUST(cuCtxCreate_v2(&ctx, 0, 0));
	MUST(cuModuleLoadData(&mod, ptx.c_str()));
	MUST(cuModuleLoadData(&bert_mod, bert_ptx.c_str()));
	test_warp_shuffles();
	test_warp_syncwarp();
	test_half_conversions();
	test_gather(mod);
	test_mean_pool(mod);
	test_bias_gelu(mod);
	test_bias_l2norm(mod);
	// Widths and lengths in each of the row kernels' register sizes (a lane
	// holding up to 1, 2, 8, 16 or 32 values), and past them.
	for (long h : {48L, 300L, 700L, 1100L}) test_bert_layernorms(bert_mod, h);
	test_bert_gelu_erf(bert_mod);
	for (long seq : {20L, 37L, 300L, 700L, 1100L}) test_bert_softmax_range(bert_mod, seq);
	test_bert_fused_attention(bert_mod);
	test_bert_tiled_attention(bert_mod);
	test_bert_pool_norm(bert_mod);

	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "FATAL %s\n", dlerror());
		return 2;
	}
	auto create = (int (*)(void **))dlsym(lib, "cublasCreate_v2");
	auto destroy = (int (*)(void *))dlsym(lib, "cublasDestroy_v2");
	auto sgemm = (sgemm_fn)dlsym(lib, "cublasSgemm_v2");
	auto batched = (sgemm_batched_fn)dlsym(lib, "cublasSgemmStridedBatched");
	if (!batched) {
		fprintf(stderr, "FATAL no cublasSgemmStridedBatched\n");
		return 2;
	}
	void *h;
	MUST(create(&h));
	test_sgemm(sgemm, h);
	test_sgemm_batched(batched, sgemm, h);
	test_bert_attention(bert_mod, batched, h);
	auto ex = (gemm_ex_fn)dlsym(lib, "cublasGemmEx");
	auto exb = (gemm_ex_batched_fn)dlsym(lib, "cublasGemmStridedBatchedEx");
	if (!ex || !exb) {
		fprintf(stderr, "FATAL no cublasGemmEx or cublasGemmStridedBatchedEx\n");
		return 2;
	}
	test_gemm_ex(ex, exb, h);

	// A stale PTX: an entry with a parameter the .cu no longer has.
	{
		std::string stale = ptx;
		size_t p = stale.find(".param .u64 gather_param_4");
		CHECK(p != std::string::npos, "no gather_param_4 in the PTX");
		if (p != std::string::npos) {
			stale.replace(p, strlen(".param .u64 gather_param_4"), ".param .u64 gather_param_4,\n\t.param .u32 gather_param_5");
			void *m2;
			CHECK(cuModuleLoadData(&m2, stale.c_str()) == 218, "a PTX whose gather has an extra parameter loaded");
		}
	}

	// Out of memory: more than the device has.
	{
		size_t free_, total;
		MUST(cuMemGetInfo_v2(&free_, &total));
		unsigned long long p;
		CHECK(cuMemAlloc_v2(&p, free_ + 1) == 2, "an allocation larger than free memory did not fail with CUDA_ERROR_OUT_OF_MEMORY");
		MUST(cuMemAlloc_v2(&p, 1));
		size_t free2;
		MUST(cuMemGetInfo_v2(&free2, &total));
		CHECK(free_ - free2 == 2 << 20, "a 1-byte allocation took %zu bytes, want one 2 MiB granule", free_ - free2);
		MUST(cuMemFree_v2(p));
	}

	// An illegal address: the launch succeeds, the next call fails, and so
	// does every call after it in that context.
	{
		void *fn;
		MUST(cuModuleGetFunction(&fn, mod, "bias_gelu"));
		std::vector<float> bias(4);
		unsigned long long db = upload(bias), bogus = 0xdead0000ULL;
		long nn = 1, w = 4;
		void *args[] = {&bogus, &db, &nn, &w};
		CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr) == 0, "the faulting launch itself failed");
		CHECK(cuCtxSynchronize() == 700, "no CUDA_ERROR_ILLEGAL_ADDRESS after a launch on a bogus pointer");
		unsigned long long p;
		CHECK(cuMemAlloc_v2(&p, 16) == 700, "the illegal address did not stick");
		MUST(cuCtxDestroy_v2(ctx));
	}

	// A kernel running past the end of its buffer: the guard page faults,
	// and the context is broken as by a bad pointer; the process lives on.
	{
		MUST(cuCtxCreate_v2(&ctx, 0, 0));
		MUST(cuModuleLoadData(&mod, ptx.c_str()));
		void *fn;
		MUST(cuModuleGetFunction(&fn, mod, "bias_gelu"));
		std::vector<float> x(256), bias(1 << 20);
		unsigned long long dx = upload(x), db = upload(bias);
		long nn = 1 << 12, w = 256; // 4096 rows of a buffer of one
		void *args[] = {&dx, &db, &nn, &w};
		CHECK(cuLaunchKernel(fn, 8, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr) == 0, "the overrunning launch itself failed");
		CHECK(cuCtxSynchronize() == 700, "no CUDA_ERROR_ILLEGAL_ADDRESS after a kernel ran past its buffer");
		MUST(cuCtxDestroy_v2(ctx));
	}

	// A kernel running far past the end of its buffer, as a grid-stride loop
	// over a wrong length does: its blocks run in a shuffled order, so the
	// first address one touches may lie megabytes past the end. It must
	// fault there, not write into the host memory above: here a 4 MiB
	// allocation of another context, the next mapping above (found by
	// allocating until one lands within 2 GiB above, as mmap fills the
	// highest hole first), read back through that context afterwards:
	// unchanged. With one guard page above each allocation it was 9 KiB
	// above, and nearly every block of the 4096 wrote into it.
	for (int trial = 0; trial < 4; trial++) {
		void *first, *second;
		MUST(cuCtxCreate_v2(&first, 0, 0));
		MUST(cuCtxCreate_v2(&second, 0, 0));
		MUST(cuModuleLoadData(&mod, ptx.c_str()));
		std::vector<float> ones(1 << 20, 1.0f), x(256), bias(256);
		unsigned long long db = upload(bias), above = 0, dx = 0;
		auto next_above = [&] { return above > dx && above - dx < (2ULL << 30); };
		for (int attempt = 0; attempt < 64 && !next_above(); attempt++) {
			MUST(cuCtxSetCurrent(first));
			above = upload(ones);
			MUST(cuCtxSetCurrent(second));
			dx = upload(x);
		}
		CHECK(next_above(), "no allocation landed just above another (%llx, %llx): the test shows nothing", above, dx);
		void *fn;
		MUST(cuModuleGetFunction(&fn, mod, "bias_gelu"));
		long nn = 1 << 22, w = 1; // a grid-stride loop over 16 MiB of a 1 KiB buffer
		void *args[] = {&dx, &db, &nn, &w};
		CHECK(cuLaunchKernel(fn, 4096, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr) == 0, "the overrunning launch itself failed");
		CHECK(cuCtxSynchronize() == 700, "no CUDA_ERROR_ILLEGAL_ADDRESS after a kernel ran far past its buffer");
		MUST(cuCtxDestroy_v2(second));
		MUST(cuCtxSetCurrent(first));
		auto got = download<float>(above, ones.size());
		size_t changed = 0;
		for (float v : got) changed += v != 1.0f;
		CHECK(changed == 0, "a kernel running past its buffer changed %zu floats of the allocation mapped %llu bytes above it (trial %d)",
			changed, above - dx, trial);
		MUST(cuCtxDestroy_v2(first));
	}

	// Device memory of another context is not this one's: a kernel given it
	// faults, as on a GPU.
	{
		void *other;
		MUST(cuCtxCreate_v2(&other, 0, 0)); // current on this thread now
		unsigned long long foreign;
		MUST(cuMemAlloc_v2(&foreign, 1024));
		void *mine;
		MUST(cuCtxCreate_v2(&mine, 0, 0));
		MUST(cuModuleLoadData(&mod, ptx.c_str()));
		void *fn;
		MUST(cuModuleGetFunction(&fn, mod, "bias_gelu"));
		std::vector<float> bias(256);
		unsigned long long db = upload(bias);
		long nn = 1, w = 256;
		void *args[] = {&foreign, &db, &nn, &w};
		CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr) == 0, "the launch itself failed");
		CHECK(cuCtxSynchronize() == 700, "a kernel ran on another context's memory");
		MUST(cuCtxDestroy_v2(mine));
		MUST(cuCtxDestroy_v2(other));
	}

	// An injected fault at the second launch.
	{
		MUST(cuCtxCreate_v2(&ctx, 0, 0));
		MUST(cuModuleLoadData(&mod, ptx.c_str()));
		void *fn;
		MUST(cuModuleGetFunction(&fn, mod, "bias_gelu"));
		std::vector<float> x(4), bias(4);
		unsigned long long dx = upload(x), db = upload(bias);
		long nn = 1, w = 4;
		void *args[] = {&dx, &db, &nn, &w};
		setenv("VRAMQ_EMU_FAULT", "launch=2,error=launch-failed", 1);
		CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr) == 0, "launch 1 failed");
		CHECK(cuCtxSynchronize() == 0, "launch 1 faulted");
		CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr) == 0, "launch 2 failed at launch");
		CHECK(cuCtxSynchronize() == 719, "no CUDA_ERROR_LAUNCH_FAILED after the injected fault");
		unsetenv("VRAMQ_EMU_FAULT");
		MUST(cuCtxDestroy_v2(ctx));
	}
	(void)destroy;

	if (failures) {
		fprintf(stderr, "cudaemu selftest: %d failures\n", failures);
		return 1;
	}
	printf("cudaemu selftest: ok\n");
	return 0;
}
