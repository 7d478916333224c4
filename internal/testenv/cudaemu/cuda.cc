// libcuda.so.1 of the CPU emulation of a GPU: the CUDA driver API calls the
// vramq binaries make, with the driver's observable behaviour where the
// backend depends on it. Every other entry point of cuda.h answers
// CUDA_ERROR_NOT_SUPPORTED (unsupported.c, generated).
//
// - Device memory is host memory. Each allocation is mapped between two
//   inaccessible guard pages and ends right at the upper one (so reading or
//   writing past its end faults); it starts poisoned with NaN (a copy-on-write
//   mapping of a NaN-filled file, so memory that is never written costs no
//   host memory). It counts as a whole number of 2 MiB granules, device-wide,
//   in a state file every process shares (VRAMQ_EMU_STATE): out-of-memory,
//   cuMemGetInfo, NVML's per-process usage and another process holding memory
//   all behave as on a GPU.
// - Contexts are per OS thread (cuCtxCreate makes the new one current on the
//   calling thread only) and each costs VRAMQ_EMU_CONTEXT_BYTES of device
//   memory. Destroying one frees what it allocated.
// - A kernel argument that is a pointer outside the current context's
//   allocations, or a kernel touching memory up to a GiB past its buffer's
//   end (the guard faults; kernels.cc turns the fault into an error), breaks the
//   context with CUDA_ERROR_ILLEGAL_ADDRESS; the launch itself succeeds and every later call in the context returns the error,
//   as an asynchronous fault on a GPU does. VRAMQ_EMU_FAULT injects the same
//   at a chosen launch.
// - cuModuleLoadData refuses PTX whose .entry names and parameter sizes
//   differ from the kernels compiled into the emulator, so a committed PTX
//   that is stale against its .cu fails here.
//
// Environment: VRAMQ_EMU_MEMORY (device bytes, default 8 GiB),
// VRAMQ_EMU_CONTEXT_BYTES (default 256 MiB), VRAMQ_EMU_STATE (the shared
// state file, default /tmp/vramq-cudaemu-UID.state), VRAMQ_EMU_SEED (the
// shuffles' seed), VRAMQ_EMU_FAULT ("launch=N" or
// "launch=N,error=launch-failed": the Nth launch, kernel or cuBLAS, counted
// from when the process first sees that value).

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emu.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

namespace {

constexpr uint64_t granule = 2 << 20;
constexpr uint64_t page = 4096;
// overrun_guard is the inaccessible reservation above each allocation. A
// kernel's blocks run in a shuffled order, and a grid-stride loop over a
// wrong length touches first whatever its block starts at: with one guard
// page, that was often the host memory mapped above (another allocation,
// or the Go runtime's own span records, which corrupted its heap: a test
// binary crashed in the garbage collector after the overrun test). A GiB of
// address space, never backed, catches any overrun of less than that.
constexpr uint64_t overrun_guard = 1ULL << 30;
constexpr int max_procs = 256;

uint64_t env_bytes(const char *name, uint64_t def) {
	const char *v = getenv(name);
	if (v == nullptr || *v == 0) {
		return def;
	}
	return strtoull(v, nullptr, 10);
}

// --- The device-wide ledger, shared by every process ------------------------

struct Ledger {
	uint64_t magic, total;
	struct {
		int32_t pid, pad;
		uint64_t bytes;
	} procs[max_procs];
};

struct DeviceState {
	std::mutex mu;
	int fd = -1;
	Ledger *ledger = nullptr;
	uint64_t total = 0, context_bytes = 0;
	int nan_fd = -1;
	uint64_t nan_size = 0;
	bool initialized = false;
	// Launch counting for VRAMQ_EMU_FAULT.
	std::string fault_spec;
	uint64_t launches_since_spec = 0;
	uint64_t launches = 0;
};

DeviceState dev;

// Locks the ledger file across processes; the caller holds dev.mu.
struct LedgerLock {
	LedgerLock() { flock(dev.fd, LOCK_EX); }
	~LedgerLock() { flock(dev.fd, LOCK_UN); }
};

// Drops the entries of processes that have exited: the driver frees a
// process's memory when it dies, however it dies.
void reap() {
	for (auto &p : dev.ledger->procs) {
		if (p.pid != 0 && kill(p.pid, 0) != 0 && errno == ESRCH) {
			p.pid = 0;
			p.bytes = 0;
		}
	}
}

uint64_t used_locked() {
	uint64_t n = 0;
	for (auto &p : dev.ledger->procs) {
		if (p.pid != 0) {
			n += p.bytes;
		}
	}
	return n;
}

// charge adds delta bytes to this process's entry if the device has room
// (delta may be negative); false when it does not.
bool charge(int64_t delta) {
	LedgerLock l;
	reap();
	auto pid = int32_t(getpid());
	decltype(&dev.ledger->procs[0]) mine = nullptr, empty = nullptr;
	for (auto &p : dev.ledger->procs) {
		if (p.pid == pid) {
			mine = &p;
		} else if (p.pid == 0 && empty == nullptr) {
			empty = &p;
		}
	}
	if (mine == nullptr) {
		if (empty == nullptr) {
			return false;
		}
		mine = empty;
		mine->pid = pid;
		mine->bytes = 0;
	}
	if (delta > 0 && used_locked() + uint64_t(delta) > dev.total) {
		return false;
	}
	mine->bytes += delta;
	if (mine->bytes == 0) {
		mine->pid = 0;
	}
	return true;
}

CUresult init_device() {
	std::lock_guard<std::mutex> g(dev.mu);
	if (dev.initialized) {
		return EMU_SUCCESS;
	}
	dev.total = env_bytes("VRAMQ_EMU_MEMORY", 8ULL << 30) / granule * granule;
	dev.context_bytes = (env_bytes("VRAMQ_EMU_CONTEXT_BYTES", 256ULL << 20) + granule - 1) / granule * granule;
	std::string path;
	if (const char *p = getenv("VRAMQ_EMU_STATE"); p != nullptr && *p != 0) {
		path = p;
	} else {
		path = "/tmp/vramq-cudaemu-" + std::to_string(getuid()) + ".state";
	}
	dev.fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (dev.fd < 0) {
		fprintf(stderr, "cudaemu: %s: %s\n", path.c_str(), strerror(errno));
		return EMU_NO_DEVICE;
	}
	flock(dev.fd, LOCK_EX);
	struct stat st;
	fstat(dev.fd, &st);
	if (st.st_size < off_t(sizeof(Ledger))) {
		if (ftruncate(dev.fd, sizeof(Ledger)) != 0) {
			flock(dev.fd, LOCK_UN);
			return EMU_NO_DEVICE;
		}
	}
	void *m = mmap(nullptr, sizeof(Ledger), PROT_READ | PROT_WRITE, MAP_SHARED, dev.fd, 0);
	if (m == MAP_FAILED) {
		flock(dev.fd, LOCK_UN);
		return EMU_NO_DEVICE;
	}
	dev.ledger = (Ledger *)m;
	const uint64_t magic = 0x76726d7163756131ULL; // "vrmqcua1"
	if (dev.ledger->magic != magic || dev.ledger->total != dev.total) {
		// A new device, or one of another size: every process sharing
		// the file must agree on the size.
		memset(dev.ledger, 0, sizeof(Ledger));
		dev.ledger->magic = magic;
		dev.ledger->total = dev.total;
	}
	flock(dev.fd, LOCK_UN);

	// The poison: a file of quiet NaNs, mapped copy-on-write under every
	// allocation.
	dev.nan_size = 16 << 20;
	dev.nan_fd = memfd_create("cudaemu-nan", MFD_CLOEXEC);
	if (dev.nan_fd < 0 || ftruncate(dev.nan_fd, dev.nan_size) != 0) {
		return EMU_NO_DEVICE;
	}
	float *nan = (float *)mmap(nullptr, dev.nan_size, PROT_READ | PROT_WRITE, MAP_SHARED, dev.nan_fd, 0);
	if (nan == MAP_FAILED) {
		return EMU_NO_DEVICE;
	}
	uint32_t qnan = 0x7fc00000;
	for (uint64_t i = 0; i < dev.nan_size / 4; i++) {
		memcpy(&nan[i], &qnan, 4);
	}
	munmap(nan, dev.nan_size);
	dev.initialized = true;
	return EMU_SUCCESS;
}

// --- Contexts and their memory --------------------------------------------

struct Allocation {
	uint64_t ptr, size;   // what the caller sees
	void *map;            // the whole mapping, guard pages included
	uint64_t map_size;
	uint64_t charged;     // granules, in bytes
};

struct Module;

struct Context {
	std::mutex mu;
	std::map<uint64_t, Allocation> allocs; // by ptr
	std::set<Module *> modules;
	CUresult sticky = EMU_SUCCESS;
	bool destroyed = false;
};

struct Function {
	Module *mod;
	const EmuKernel *k;
};

struct Module {
	Context *ctx;
	std::vector<Function> fns;
};

std::mutex contexts_mu;
std::set<Context *> contexts; // live ones

thread_local std::vector<Context *> ctx_stack;

Context *current() {
	if (ctx_stack.empty()) {
		return nullptr;
	}
	Context *c = ctx_stack.back();
	std::lock_guard<std::mutex> g(contexts_mu);
	return contexts.count(c) ? c : nullptr;
}

// begin is what every call that uses the current context does first.
CUresult begin(Context **out) {
	if (!dev.initialized) {
		return EMU_NOT_INITIALIZED;
	}
	Context *c = current();
	if (c == nullptr) {
		return EMU_INVALID_CONTEXT;
	}
	std::lock_guard<std::mutex> g(c->mu);
	if (c->sticky != EMU_SUCCESS) {
		return c->sticky;
	}
	*out = c;
	return EMU_SUCCESS;
}

CUresult alloc(Context *c, uint64_t *out, uint64_t size) {
	if (size == 0) {
		return EMU_INVALID_VALUE;
	}
	uint64_t charged = (size + granule - 1) / granule * granule;
	{
		std::lock_guard<std::mutex> g(dev.mu);
		if (!charge(int64_t(charged))) {
			return EMU_OUT_OF_MEMORY;
		}
	}
	uint64_t body = (size + page - 1) / page * page;
	uint64_t map_size = page + body + overrun_guard;
	char *m = (char *)mmap(nullptr, map_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		std::lock_guard<std::mutex> g(dev.mu);
		charge(-int64_t(charged));
		return EMU_OUT_OF_MEMORY;
	}
	for (uint64_t off = 0; off < body; off += dev.nan_size) {
		uint64_t n = body - off < dev.nan_size ? body - off : dev.nan_size;
		if (mmap(m + page + off, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, dev.nan_fd, 0) == MAP_FAILED) {
			munmap(m, map_size);
			std::lock_guard<std::mutex> g(dev.mu);
			charge(-int64_t(charged));
			return EMU_OUT_OF_MEMORY;
		}
	}
	// The buffer ends at the upper guard page, 256-byte aligned as
	// cuMemAlloc's are.
	uint64_t ptr = uint64_t(uintptr_t(m + page + body)) - (size + 255) / 256 * 256;
	std::lock_guard<std::mutex> g(c->mu);
	c->allocs[ptr] = Allocation{ptr, size, m, map_size, charged};
	*out = ptr;
	return EMU_SUCCESS;
}

void release(const Allocation &a) {
	munmap(a.map, a.map_size);
	std::lock_guard<std::mutex> g(dev.mu);
	charge(-int64_t(a.charged));
}

// find returns the allocation of c holding [p, p+n), or NULL; c->mu held.
const Allocation *find(Context *c, uint64_t p, uint64_t n) {
	auto it = c->allocs.upper_bound(p);
	if (it == c->allocs.begin()) {
		return nullptr;
	}
	--it;
	const Allocation &a = it->second;
	if (p < a.ptr || p - a.ptr > a.size || n > a.size - (p - a.ptr)) {
		return nullptr;
	}
	return &a;
}

bool in_memory(Context *c, uint64_t p, uint64_t n) {
	std::lock_guard<std::mutex> g(c->mu);
	return find(c, p, n) != nullptr;
}

void fault(Context *c, CUresult code) {
	std::lock_guard<std::mutex> g(c->mu);
	if (c->sticky == EMU_SUCCESS) {
		c->sticky = code;
	}
}

// injected says whether this launch is the one VRAMQ_EMU_FAULT names, and
// with which error.
CUresult injected() {
	const char *spec = getenv("VRAMQ_EMU_FAULT");
	std::lock_guard<std::mutex> g(dev.mu);
	dev.launches++;
	std::string s = spec ? spec : "";
	if (s != dev.fault_spec) {
		dev.fault_spec = s;
		dev.launches_since_spec = 0;
	}
	if (s.empty()) {
		return EMU_SUCCESS;
	}
	dev.launches_since_spec++;
	unsigned long long n = 0;
	if (sscanf(s.c_str(), "launch=%llu", &n) != 1 || n != dev.launches_since_spec) {
		return EMU_SUCCESS;
	}
	return s.find("error=launch-failed") != std::string::npos ? EMU_LAUNCH_FAILED : EMU_ILLEGAL_ADDRESS;
}

uint64_t launch_seed() {
	std::lock_guard<std::mutex> g(dev.mu);
	return env_bytes("VRAMQ_EMU_SEED", 1) * 0x9E3779B97F4A7C15ULL + dev.launches;
}

// --- PTX -------------------------------------------------------------------

int ptx_type_size(const std::string &t) {
	if (t.size() < 3) {
		return -1;
	}
	int bits = atoi(t.c_str() + 2);
	if (bits == 0) {
		return -1;
	}
	return bits / 8;
}

struct PtxEntry {
	std::string name;
	std::vector<int> sizes;
};

// parse_ptx reads each ".entry name( .param .type name, ... )" of the PTX.
bool parse_ptx(const char *ptx, std::vector<PtxEntry> *out, std::string *why) {
	std::string s(ptx);
	size_t pos = 0;
	while ((pos = s.find(".entry", pos)) != std::string::npos) {
		pos += 6;
		size_t open = s.find('(', pos);
		size_t close = s.find(')', pos);
		if (open == std::string::npos || close == std::string::npos || close < open) {
			*why = "malformed .entry";
			return false;
		}
		PtxEntry e;
		std::string name = s.substr(pos, open - pos);
		name.erase(0, name.find_first_not_of(" \t\n"));
		name.erase(name.find_last_not_of(" \t\n") + 1);
		e.name = name;
		std::string params = s.substr(open + 1, close - open - 1);
		size_t p = 0;
		while ((p = params.find(".param", p)) != std::string::npos) {
			p += 6;
			size_t end = params.find(',', p);
			std::string decl = params.substr(p, end == std::string::npos ? std::string::npos : end - p);
			// ".u64 name", or ".align 8 .b8 name[16]" for an aggregate.
			int size = -1;
			if (size_t b = decl.find('['); b != std::string::npos) {
				size = atoi(decl.c_str() + b + 1);
			} else {
				size_t t = decl.find('.');
				size_t te = decl.find_first_of(" \t\n", t);
				if (t != std::string::npos) {
					size = ptx_type_size(decl.substr(t, te - t));
				}
			}
			if (size <= 0) {
				*why = "entry " + e.name + ": parameter of unknown size:" + decl;
				return false;
			}
			e.sizes.push_back(size);
		}
		out->push_back(e);
		pos = close;
	}
	if (out->empty()) {
		*why = "no .entry";
		return false;
	}
	return true;
}

} // namespace

// --- The API -----------------------------------------------------------------

extern "C" {

CUresult cuInit(unsigned flags) {
	if (flags != 0) {
		return EMU_INVALID_VALUE;
	}
	return init_device();
}

CUresult cuDriverGetVersion(int *v) {
	if (v == nullptr) {
		return EMU_INVALID_VALUE;
	}
	*v = 11080; // the API the header cu is built with
	return EMU_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	if (!dev.initialized) {
		return EMU_NOT_INITIALIZED;
	}
	*n = 1;
	return EMU_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	if (!dev.initialized) {
		return EMU_NOT_INITIALIZED;
	}
	if (ordinal != 0) {
		return EMU_INVALID_DEVICE;
	}
	*d = 0;
	return EMU_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	if (!dev.initialized) {
		return EMU_NOT_INITIALIZED;
	}
	if (d != 0) {
		return EMU_INVALID_DEVICE;
	}
	if (name == nullptr || len <= 0) {
		return EMU_INVALID_VALUE;
	}
	snprintf(name, len, "vramq CPU-emulated GPU");
	return EMU_SUCCESS;
}

// The UUID NVML's emulation answers to as well (nvml.cc).
CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice d) {
	if (!dev.initialized) {
		return EMU_NOT_INITIALIZED;
	}
	if (d != 0) {
		return EMU_INVALID_DEVICE;
	}
	static const unsigned char id[16] = {0x76, 0x72, 0x61, 0x6d, 0x71, 0x2d, 0x40, 0x65, 0x80, 0x75, 0x6c, 0x61, 0x74, 0x65, 0x64, 0x00};
	memcpy(uuid, id, 16);
	return EMU_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
	if (!dev.initialized) {
		return EMU_NOT_INITIALIZED;
	}
	if (d != 0) {
		return EMU_INVALID_DEVICE;
	}
	*bytes = dev.total;
	return EMU_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	if (!dev.initialized) {
		return EMU_NOT_INITIALIZED;
	}
	if (d != 0) {
		return EMU_INVALID_DEVICE;
	}
	switch (attr) {
	case 1: // max threads per block
		*v = 1024;
		return EMU_SUCCESS;
	case 2: // max block dim x
	case 3: // y
		*v = 1024;
		return EMU_SUCCESS;
	case 4: // z
		*v = 64;
		return EMU_SUCCESS;
	case 5: // max grid dim x
		*v = 2147483647;
		return EMU_SUCCESS;
	case 6:
	case 7:
		*v = 65535;
		return EMU_SUCCESS;
	case 10: // warp size
		*v = 32;
		return EMU_SUCCESS;
	case 16: // multiprocessors
		*v = 1;
		return EMU_SUCCESS;
	case 75: // compute capability major
		*v = 8;
		return EMU_SUCCESS;
	case 76:
		*v = 0;
		return EMU_SUCCESS;
	}
	return EMU_NOT_SUPPORTED;
}

CUresult cuCtxCreate_v2(void **out, unsigned flags, CUdevice d) {
	(void)flags;
	if (!dev.initialized) {
		return EMU_NOT_INITIALIZED;
	}
	if (d != 0) {
		return EMU_INVALID_DEVICE;
	}
	{
		std::lock_guard<std::mutex> g(dev.mu);
		if (!charge(int64_t(dev.context_bytes))) {
			return EMU_OUT_OF_MEMORY;
		}
	}
	Context *c = new Context;
	{
		std::lock_guard<std::mutex> g(contexts_mu);
		contexts.insert(c);
	}
	ctx_stack.push_back(c);
	*out = c;
	return EMU_SUCCESS;
}

CUresult cuCtxDestroy_v2(void *h) {
	Context *c = (Context *)h;
	{
		std::lock_guard<std::mutex> g(contexts_mu);
		if (contexts.erase(c) == 0) {
			return EMU_INVALID_CONTEXT;
		}
	}
	for (auto &kv : c->allocs) {
		release(kv.second);
	}
	for (Module *m : c->modules) {
		delete m;
	}
	{
		std::lock_guard<std::mutex> g(dev.mu);
		charge(-int64_t(dev.context_bytes));
	}
	// Off this thread's stack; other threads find it gone from contexts.
	for (size_t i = ctx_stack.size(); i > 0; i--) {
		if (ctx_stack[i - 1] == c) {
			ctx_stack.erase(ctx_stack.begin() + (i - 1));
		}
	}
	delete c;
	return EMU_SUCCESS;
}

CUresult cuCtxGetCurrent(void **out) {
	*out = current();
	return dev.initialized ? EMU_SUCCESS : EMU_NOT_INITIALIZED;
}

CUresult cuCtxSetCurrent(void *h) {
	if (h == nullptr) {
		if (!ctx_stack.empty()) {
			ctx_stack.pop_back();
		}
		return EMU_SUCCESS;
	}
	{
		std::lock_guard<std::mutex> g(contexts_mu);
		if (!contexts.count((Context *)h)) {
			return EMU_INVALID_CONTEXT;
		}
	}
	if (ctx_stack.empty()) {
		ctx_stack.push_back((Context *)h);
	} else {
		ctx_stack.back() = (Context *)h;
	}
	return EMU_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(void *h) {
	{
		std::lock_guard<std::mutex> g(contexts_mu);
		if (!contexts.count((Context *)h)) {
			return EMU_INVALID_CONTEXT;
		}
	}
	ctx_stack.push_back((Context *)h);
	return EMU_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(void **out) {
	if (ctx_stack.empty()) {
		return EMU_INVALID_CONTEXT;
	}
	if (out != nullptr) {
		*out = ctx_stack.back();
	}
	ctx_stack.pop_back();
	return EMU_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *d) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	*d = 0;
	return EMU_SUCCESS;
}

// Work runs when it is launched, so synchronizing only reports what it hit.
CUresult cuCtxSynchronize(void) {
	Context *c;
	return begin(&c);
}

CUresult cuStreamSynchronize(void *stream) {
	(void)stream;
	Context *c;
	return begin(&c);
}

CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	std::lock_guard<std::mutex> g(dev.mu);
	LedgerLock l;
	reap();
	uint64_t used = used_locked();
	*free_ = used > dev.total ? 0 : dev.total - used;
	*total = dev.total;
	return EMU_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	uint64_t out;
	CUresult r = alloc(c, &out, size);
	if (r == EMU_SUCCESS) {
		*p = out;
	}
	return r;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	Allocation a;
	{
		std::lock_guard<std::mutex> g(c->mu);
		auto it = c->allocs.find(p);
		if (it == c->allocs.end()) {
			return EMU_INVALID_VALUE;
		}
		a = it->second;
		c->allocs.erase(it);
	}
	release(a);
	return EMU_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	if (!in_memory(c, dst, n)) {
		return EMU_INVALID_VALUE;
	}
	memcpy((void *)(uintptr_t)dst, src, n);
	return EMU_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	if (!in_memory(c, src, n)) {
		return EMU_INVALID_VALUE;
	}
	memcpy(dst, (const void *)(uintptr_t)src, n);
	return EMU_SUCCESS;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	if (!in_memory(c, src, n) || !in_memory(c, dst, n)) {
		return EMU_INVALID_VALUE;
	}
	memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
	return EMU_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	if (!in_memory(c, dst, n)) {
		return EMU_INVALID_VALUE;
	}
	memset((void *)(uintptr_t)dst, v, n);
	return EMU_SUCCESS;
}

CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned v, size_t n) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	if (!in_memory(c, dst, n * 4)) {
		return EMU_INVALID_VALUE;
	}
	for (size_t i = 0; i < n; i++) {
		memcpy((char *)(uintptr_t)dst + 4 * i, &v, 4);
	}
	return EMU_SUCCESS;
}

CUresult cuModuleLoadData(void **out, const void *image) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	if (image == nullptr) {
		return EMU_INVALID_VALUE;
	}
	std::vector<PtxEntry> entries;
	std::string why;
	if (!parse_ptx((const char *)image, &entries, &why)) {
		fprintf(stderr, "cudaemu: cuModuleLoadData: %s\n", why.c_str());
		return EMU_INVALID_PTX;
	}
	int nk;
	const EmuKernel *ks = emuKernels(&nk);
	Module *m = new Module{c, {}};
	// A PTX module is one .cu file: it must hold every kernel of that file
	// (the file of its first entry) and no other.
	const char *source = nullptr;
	for (int i = 0; i < nk && source == nullptr && !entries.empty(); i++) {
		if (entries[0].name == ks[i].name) {
			source = ks[i].source;
		}
	}
	int in_source = 0;
	for (int i = 0; source != nullptr && i < nk; i++) {
		in_source += strcmp(ks[i].source, source) == 0;
	}
	bool ok = int(entries.size()) == in_source;
	if (!ok) {
		fprintf(stderr, "cudaemu: cuModuleLoadData: the PTX has %zu entries, %s.cu compiled into the emulator %d: is the PTX stale?\n",
			entries.size(), source ? source : "(no .cu of its first entry)", in_source);
	}
	for (const PtxEntry &e : entries) {
		const EmuKernel *k = nullptr;
		for (int i = 0; i < nk; i++) {
			if (e.name == ks[i].name && source != nullptr && strcmp(ks[i].source, source) == 0) {
				k = &ks[i];
			}
		}
		if (k == nullptr) {
			fprintf(stderr, "cudaemu: cuModuleLoadData: entry %s is not a kernel of the .cu: is the PTX stale?\n", e.name.c_str());
			ok = false;
			continue;
		}
		bool same = int(e.sizes.size()) == k->nparams;
		for (int i = 0; same && i < k->nparams; i++) {
			same = e.sizes[i] == k->param_sizes[i];
		}
		if (!same) {
			fprintf(stderr, "cudaemu: cuModuleLoadData: entry %s: the PTX's parameters differ from the .cu's: is the PTX stale?\n", e.name.c_str());
			ok = false;
		}
		m->fns.push_back(Function{m, k});
	}
	if (!ok) {
		delete m;
		return EMU_INVALID_PTX;
	}
	std::lock_guard<std::mutex> g(c->mu);
	c->modules.insert(m);
	*out = m;
	return EMU_SUCCESS;
}

CUresult cuModuleUnload(void *h) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	std::lock_guard<std::mutex> g(c->mu);
	if (c->modules.erase((Module *)h) == 0) {
		return EMU_INVALID_HANDLE;
	}
	delete (Module *)h;
	return EMU_SUCCESS;
}

CUresult cuModuleGetFunction(void **out, void *h, const char *name) {
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	std::lock_guard<std::mutex> g(c->mu);
	Module *m = (Module *)h;
	if (c->modules.count(m) == 0) {
		return EMU_INVALID_HANDLE;
	}
	for (Function &f : m->fns) {
		if (strcmp(f.k->name, name) == 0) {
			*out = &f;
			return EMU_SUCCESS;
		}
	}
	return EMU_NOT_FOUND;
}

CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
	unsigned shared, void *stream, void **params, void **extra) {
	(void)stream;
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	Function *f = (Function *)fn;
	{
		std::lock_guard<std::mutex> g(c->mu);
		if (f == nullptr || c->modules.count(f->mod) == 0) {
			return EMU_INVALID_HANDLE;
		}
	}
	if (shared != 0 || extra != nullptr || (params == nullptr && f->k->nparams > 0)) {
		return EMU_NOT_SUPPORTED; // the kernels use static shared memory and kernelParams only
	}
	if (CUresult inj = injected(); inj != EMU_SUCCESS) {
		fault(c, inj);
		return EMU_SUCCESS;
	}
	// A pointer argument outside this context's memory is what faults on
	// a GPU with an illegal address; the kernel would fault on its first
	// access to it.
	for (int i = 0; i < f->k->nparams; i++) {
		if (f->k->param_pointer[i]) {
			uint64_t p;
			memcpy(&p, params[i], 8);
			if (!in_memory(c, p, 1)) {
				fault(c, EMU_ILLEGAL_ADDRESS);
				return EMU_SUCCESS;
			}
		}
	}
	CUresult r = emuRun(f->k, EmuDim{gx, gy, gz}, EmuDim{bx, by, bz}, params, launch_seed());
	if (r == EMU_ILLEGAL_ADDRESS || r == EMU_LAUNCH_FAILED) {
		fault(c, r); // asynchronous on a GPU: the next call reports it
		return EMU_SUCCESS;
	}
	return r;
}

// --- For the emulated cuBLAS -------------------------------------------------

int vramqEmuBeginWork(int *run) {
	*run = 0;
	Context *c;
	if (CUresult r = begin(&c); r != EMU_SUCCESS) {
		return r;
	}
	if (CUresult inj = injected(); inj != EMU_SUCCESS) {
		fault(c, inj);
		return EMU_SUCCESS;
	}
	*run = 1;
	return EMU_SUCCESS;
}

int vramqEmuInDeviceMemory(uint64_t p, uint64_t bytes) {
	Context *c = current();
	return c != nullptr && in_memory(c, p, bytes);
}

void vramqEmuFault(int code) {
	if (Context *c = current(); c != nullptr) {
		fault(c, code);
	}
}

int vramqEmuAlloc(uint64_t *p, uint64_t bytes) { return cuMemAlloc_v2((CUdeviceptr *)p, bytes); }

int vramqEmuFree(uint64_t p) { return cuMemFree_v2(p); }

void *vramqEmuCurrentContext(void) { return current(); }

// For the emulated NVML, in the same process or another: the ledger.
int vramqEmuLedger(uint64_t *total, uint64_t *used, int *npids, int32_t *pids, uint64_t *bytes, int max) {
	if (CUresult r = init_device(); r != EMU_SUCCESS) {
		return r;
	}
	std::lock_guard<std::mutex> g(dev.mu);
	LedgerLock l;
	reap();
	*total = dev.total;
	*used = used_locked();
	int n = 0;
	for (auto &p : dev.ledger->procs) {
		if (p.pid != 0) {
			if (n < max) {
				pids[n] = p.pid;
				bytes[n] = p.bytes;
			}
			n++;
		}
	}
	*npids = n;
	return EMU_SUCCESS;
}

} // extern "C"
