// The emulator's self-test: through the driver and cuBLAS APIs, as the
// backend calls them, each kernel of the PTX against a direct computation of
// what it is for, SGEMM in every transpose mode against a direct product,
// and the driver's behaviours the backend relies on (out of memory, an
// illegal address that sticks, injected faults, a stale PTX refused).
//
//   selftest PTX   exits 0 when all pass; prints each failure
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

static void launch(void *fn, unsigned grid, unsigned block, std::vector<void *> args) {
	MUST(cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, nullptr, args.data(), nullptr));
	MUST(cuCtxSynchronize());
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
						double d = fabs(want - got[i + j * ldc]);
						worst = isnan(d) ? INFINITY : fmax(worst, d);
					}
				// Rows past m inside ldc are not C's: untouched.
				int touched = 0;
				if (beta != 0.0f)
					for (int j = 0; j < n; j++)
						for (int i = m; i < ldc; i++) touched += got[i + j * ldc] != C[i + j * ldc];
				CHECK(worst < 1e-5 && touched == 0, "sgemm %c%c beta %g: largest error %g, %d padding values changed", names[ta], names[tb], beta, worst, touched);
				cuMemFree_v2(dA), cuMemFree_v2(dB), cuMemFree_v2(dC);
			}
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: selftest PTX LIBCUBLAS\n");
		return 2;
	}
	FILE *f = fopen(argv[1], "rb");
	if (!f) {
		perror(argv[1]);
		return 2;
	}
	std::string ptx;
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0) ptx.append(buf, n);
	fclose(f);

	MUST(cuInit(0));
	void *ctx, *mod;
	MUST(cuCtxCreate_v2(&ctx, 0, 0));
	MUST(cuModuleLoadData(&mod, ptx.c_str()));
	test_gather(mod);
	test_mean_pool(mod);
	test_bias_gelu(mod);
	test_bias_l2norm(mod);

	void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "FATAL %s\n", dlerror());
		return 2;
	}
	auto create = (int (*)(void **))dlsym(lib, "cublasCreate_v2");
	auto destroy = (int (*)(void *))dlsym(lib, "cublasDestroy_v2");
	auto sgemm = (sgemm_fn)dlsym(lib, "cublasSgemm_v2");
	void *h;
	MUST(create(&h));
	test_sgemm(sgemm, h);

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
