// What the emulated driver (libcuda.so.1) shares with the emulated cuBLAS and
// with the kernel runner. Test infrastructure of vramq: never shipped.
#ifndef VRAMQ_CUDAEMU_H
#define VRAMQ_CUDAEMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// The CUresult values the emulator answers with (cuda.h's numbering).
enum {
	EMU_SUCCESS = 0,
	EMU_INVALID_VALUE = 1,
	EMU_OUT_OF_MEMORY = 2,
	EMU_NOT_INITIALIZED = 3,
	EMU_DEINITIALIZED = 4,
	EMU_NO_DEVICE = 100,
	EMU_INVALID_DEVICE = 101,
	EMU_INVALID_IMAGE = 200,
	EMU_INVALID_CONTEXT = 201,
	EMU_INVALID_PTX = 218,
	EMU_INVALID_HANDLE = 400,
	EMU_NOT_FOUND = 500,
	EMU_ILLEGAL_ADDRESS = 700,
	EMU_LAUNCH_OUT_OF_RESOURCES = 701,
	EMU_LAUNCH_FAILED = 719,
	EMU_NOT_SUPPORTED = 801,
};

#ifdef __cplusplus
extern "C" {
#endif

// Exported by libcuda.so.1 for libcublas.so.N; not part of the CUDA API.

// vramqEmuBeginWork is what a kernel launch does first: the current
// context's sticky error, or the injected fault if this is the launch that
// VRAMQ_EMU_FAULT names (then the context is broken and 0 is returned, as an
// asynchronous fault is reported by the next call, not by the launch).
// It returns a CUresult; *run says whether the work should run.
int vramqEmuBeginWork(int *run);
// vramqEmuInDeviceMemory says whether [p, p+bytes) lies inside one
// allocation of the current context.
int vramqEmuInDeviceMemory(uint64_t p, uint64_t bytes);
// vramqEmuFault breaks the current context with a sticky error.
void vramqEmuFault(int code);
// vramqEmuAlloc / vramqEmuFree are cuMemAlloc / cuMemFree for the library's
// own memory (cuBLAS's workspace).
int vramqEmuAlloc(uint64_t *p, uint64_t bytes);
int vramqEmuFree(uint64_t p);
// vramqEmuCurrentContext is the calling thread's current context, or NULL.
void *vramqEmuCurrentContext(void);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
// How a GPU converts between float32 and its half-precision types, IEEE 754
// binary16 and bfloat16: to them rounded to nearest, ties to even (cvt.rn),
// subnormals kept, past the largest finite to infinity, NaN to a quiet NaN;
// from them exactly. The one rule of the emulator, for cuBLAS's GemmEx and
// for the kernels' NVVM builtins (kernels.cc's prelude).
static inline float emu_float_of(uint32_t bits) {
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

static inline uint32_t emu_bits_of(float f) {
	uint32_t x;
	memcpy(&x, &f, 4);
	return x;
}

static inline float emu_half_to_float(uint16_t h) {
	uint32_t sign = uint32_t(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	if (e == 0) {
		float v = ldexpf(float(m), -24); // subnormal (or zero): m units of 2^-24
		return sign ? -v : v;
	}
	if (e == 31) {
		return emu_float_of(sign | 0x7f800000 | (m << 13)); // infinity, or NaN with its payload
	}
	return emu_float_of(sign | ((e + 112) << 23) | (m << 13)); // rebias 15 -> 127
}

static inline uint16_t emu_float_to_half(float f) {
	uint32_t x = emu_bits_of(f);
	uint16_t sign = uint16_t((x >> 16) & 0x8000);
	uint32_t ax = x & 0x7fffffff;
	if (ax > 0x7f800000) {
		return sign | 0x7e00 | uint16_t((ax >> 13) & 0x3ff); // NaN stays NaN, quiet
	}
	if (ax >= 0x477ff000) {
		return sign | 0x7c00; // 65520 and up round to infinity (65504 is the largest half)
	}
	if (ax < 0x38800000) { // below 2^-14: a subnormal half, or zero
		if (ax < 0x33000000) {
			return sign; // below 2^-25, half the least subnormal: zero
		}
		uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
		uint32_t shift = 126 - e; // value = m·2^(e-150) = (m >> shift)·2^-24
		uint32_t hm = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
		if (rem > halfway || (rem == halfway && (hm & 1))) {
			hm++; // may carry into the least normal, 0x400: its right encoding
		}
		return sign | uint16_t(hm);
	}
	uint32_t hm = (ax >> 13) - (112u << 10), rem = ax & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (hm & 1))) {
		hm++; // a carry out of the mantissa raises the exponent, up to infinity
	}
	return sign | uint16_t(hm);
}

static inline float emu_bf16_to_float(uint16_t b) { return emu_float_of(uint32_t(b) << 16); }

static inline uint16_t emu_float_to_bf16(float f) {
	uint32_t x = emu_bits_of(f);
	if ((x & 0x7fffffff) > 0x7f800000) {
		return uint16_t((x >> 16) | 0x40); // NaN stays NaN, quiet
	}
	return uint16_t((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}
#endif

// The kernel runner (kernels.cc), used by the driver.
#ifdef __cplusplus
struct EmuKernel {
	const char *name;
	const char *source; // the .cu file it comes from, without directory or suffix: one PTX module
	int nparams;
	const int *param_sizes;    // bytes of each parameter, as the host compiler sees it
	const bool *param_pointer; // whether each parameter is a pointer
	void (*invoke)(void **params);
};

// emuKernels lists every kernel compiled from the .cu file; count in *n.
const EmuKernel *emuKernels(int *n);

struct EmuDim {
	unsigned x, y, z;
};

// emuRun runs kernel k on grid × block, one block at a time, each CUDA
// thread a fiber switched at __syncthreads and warp operations in a
// shuffled order from seed. It returns EMU_SUCCESS,
// EMU_LAUNCH_OUT_OF_RESOURCES for a block too large, EMU_ILLEGAL_ADDRESS
// when the kernel faulted (touched memory that is not mapped: a guard
// page, or no device memory at all), or EMU_LAUNCH_FAILED for a warp
// operation the GPU leaves undefined (reported on stderr).
int emuRun(const EmuKernel *k, EmuDim grid, EmuDim block, void **params, uint64_t seed);
#endif

#endif
