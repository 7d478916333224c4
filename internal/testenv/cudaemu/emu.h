// What the emulated driver (libcuda.so.1) shares with the emulated cuBLAS and
// with the kernel runner. Test infrastructure of vramq: never shipped.
#ifndef VRAMQ_CUDAEMU_H
#define VRAMQ_CUDAEMU_H

#include <stddef.h>
#include <stdint.h>

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
// thread a fiber switched at __syncthreads in a shuffled order from seed.
// It returns EMU_SUCCESS, EMU_LAUNCH_OUT_OF_RESOURCES for a block too
// large, or EMU_ILLEGAL_ADDRESS when the kernel faulted (touched memory
// that is not mapped: a guard page, or no device memory at all).
int emuRun(const EmuKernel *k, EmuDim grid, EmuDim block, void **params, uint64_t seed);
#endif

#endif
