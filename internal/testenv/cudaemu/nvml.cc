// libnvidia-ml.so.1 of the CPU emulation of a GPU: the one device, its memory
// and the processes holding it, read from the emulated driver's device-wide
// ledger, so NVML sees what every process has allocated, as it does on a
// GPU. The calls go-nvml makes for vramq; the rest are absent (go-nvml looks
// symbols up lazily and only calls what vramq asks for).

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <atomic>

#include "emu.h"

extern "C" int vramqEmuLedger(uint64_t *total, uint64_t *used, int *npids, int32_t *pids, uint64_t *bytes, int max);
extern "C" int cuDeviceGetUuid(unsigned char *uuid, int d);
extern "C" int cuInit(unsigned flags);

namespace {

enum {
	NV_SUCCESS = 0,
	NV_UNINITIALIZED = 1,
	NV_INVALID_ARGUMENT = 2,
	NV_INSUFFICIENT_SIZE = 7,
	NV_NOT_FOUND = 6,
	NV_UNKNOWN = 999,
};

std::atomic<int> inits{0};
int the_device; // its address is the one nvmlDevice_t

struct ProcessInfo {
	unsigned pid;
	unsigned long long usedGpuMemory;
	unsigned gpuInstanceId, computeInstanceId;
};

struct Memory {
	unsigned long long total, free, used;
};

bool uuid_string(char *buf, size_t n) {
	unsigned char u[16];
	if (cuInit(0) != 0 || cuDeviceGetUuid(u, 0) != 0) {
		return false;
	}
	snprintf(buf, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4], u[5], u[6],
		u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
	return true;
}

bool valid(void *d) { return inits.load() > 0 && d == &the_device; }

} // namespace

extern "C" {

int nvmlInit_v2(void) {
	uint64_t t, u;
	int n;
	if (vramqEmuLedger(&t, &u, &n, nullptr, nullptr, 0) != 0) {
		return NV_UNKNOWN;
	}
	inits++;
	return NV_SUCCESS;
}

int nvmlInitWithFlags(unsigned flags) {
	(void)flags;
	return nvmlInit_v2();
}

int nvmlShutdown(void) {
	if (inits.load() <= 0) {
		return NV_UNINITIALIZED;
	}
	inits--;
	return NV_SUCCESS;
}

const char *nvmlErrorString(int r) {
	switch (r) {
	case NV_SUCCESS:
		return "Success";
	case NV_UNINITIALIZED:
		return "Uninitialized";
	case NV_INVALID_ARGUMENT:
		return "Invalid Argument";
	case NV_NOT_FOUND:
		return "Not Found";
	case NV_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	}
	return "Unknown Error";
}

int nvmlDeviceGetCount_v2(unsigned *n) {
	if (inits.load() <= 0) {
		return NV_UNINITIALIZED;
	}
	*n = 1;
	return NV_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {
	if (inits.load() <= 0) {
		return NV_UNINITIALIZED;
	}
	if (i != 0 || d == nullptr) {
		return NV_INVALID_ARGUMENT;
	}
	*d = &the_device;
	return NV_SUCCESS;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, void **d) {
	if (inits.load() <= 0) {
		return NV_UNINITIALIZED;
	}
	char want[64];
	if (uuid == nullptr || d == nullptr || !uuid_string(want, sizeof want)) {
		return NV_INVALID_ARGUMENT;
	}
	if (strcmp(uuid, want) != 0) {
		return NV_NOT_FOUND;
	}
	*d = &the_device;
	return NV_SUCCESS;
}

int nvmlDeviceGetUUID(void *d, char *buf, unsigned n) {
	if (!valid(d)) {
		return NV_INVALID_ARGUMENT;
	}
	char id[64];
	if (!uuid_string(id, sizeof id)) {
		return NV_UNKNOWN;
	}
	if (strlen(id) + 1 > n) {
		return NV_INSUFFICIENT_SIZE;
	}
	strcpy(buf, id);
	return NV_SUCCESS;
}

int nvmlDeviceGetName(void *d, char *buf, unsigned n) {
	if (!valid(d)) {
		return NV_INVALID_ARGUMENT;
	}
	const char *name = "vramq CPU-emulated GPU";
	if (strlen(name) + 1 > n) {
		return NV_INSUFFICIENT_SIZE;
	}
	strcpy(buf, name);
	return NV_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(void *d, Memory *m) {
	if (!valid(d) || m == nullptr) {
		return NV_INVALID_ARGUMENT;
	}
	uint64_t total, used;
	int n;
	if (vramqEmuLedger(&total, &used, &n, nullptr, nullptr, 0) != 0) {
		return NV_UNKNOWN;
	}
	m->total = total;
	m->used = used;
	m->free = total - used;
	return NV_SUCCESS;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned *count, ProcessInfo *infos) {
	if (!valid(d) || count == nullptr) {
		return NV_INVALID_ARGUMENT;
	}
	int32_t pids[256];
	uint64_t bytes[256];
	uint64_t total, used;
	int n;
	if (vramqEmuLedger(&total, &used, &n, pids, bytes, 256) != 0) {
		return NV_UNKNOWN;
	}
	if (unsigned(n) > *count) {
		*count = n;
		return NV_INSUFFICIENT_SIZE;
	}
	for (int i = 0; i < n; i++) {
		infos[i] = ProcessInfo{unsigned(pids[i]), bytes[i], 0xffffffffu, 0xffffffffu};
	}
	*count = n;
	return NV_SUCCESS;
}

} // extern "C"
