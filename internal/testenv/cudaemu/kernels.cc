// The kernel runner: the project's kernels, compiled for the host from the
// same .cu file the PTX is made from (EMU_KERNELS_CU, set by the Makefile),
// and a scheduler that runs them the way a GPU could.
//
// One block at a time (blocks in a shuffled order); each CUDA thread of the
// block is a fiber on its own small stack. A fiber runs until it reaches
// __syncthreads or returns; when every live fiber of the block has done so,
// the next phase resumes them in a new shuffled order. So code that relies
// on an order the GPU does not promise, or on a barrier it left out, reads
// values another thread has not written yet and computes something wrong,
// which the self-test (selftest.cc) catches.
//
// The prelude maps what the .cu file uses onto the host: the NVVM builtins
// that read thread and block ids read the current fiber's; __shared__
// variables (the file spells them __attribute__((shared))) become
// thread_local statics, which all fibers of a block share because the block
// runs on one OS thread; the PTX approximations become their libm
// counterparts, and its conversions to and from half precision emu.h's.

#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <type_traits>
#include <utility>
#include <vector>

#include "emu.h"

namespace {

struct Fiber;

// The state of the block running on this OS thread.
struct BlockState {
	EmuDim grid, block, blockIdx;
	Fiber *current;
	void *scheduler_sp;
};

thread_local BlockState emu_block;

// Where a fiber stands when it hands control back to the scheduler.
enum class Wait { Run, Barrier, Warp, Done };

// The warp-level operations (PTX shfl.sync's four modes and
// bar.warp.sync); a fiber that calls one waits for the lanes its mask
// names.
enum class WarpOp { Up, Down, Bfly, Idx, Sync };

struct Fiber {
	EmuDim tid;
	void *sp;
	void *stack; // base of the mapping, NULL until first run
	bool started;
	Wait wait;
	void (*invoke)(void **);
	void **params;
	unsigned lane, warp; // by linear thread id, 32 consecutive threads a warp
	// The warp operation it waits at: its operands, then its result.
	WarpOp op;
	uint32_t mask, a, b, c, result;
};

} // namespace

// --- The prelude: what the .cu file calls ---------------------------------

static inline unsigned __nvvm_read_ptx_sreg_tid_x(void) { return emu_block.current->tid.x; }
static inline unsigned __nvvm_read_ptx_sreg_tid_y(void) { return emu_block.current->tid.y; }
static inline unsigned __nvvm_read_ptx_sreg_tid_z(void) { return emu_block.current->tid.z; }
static inline unsigned __nvvm_read_ptx_sreg_ntid_x(void) { return emu_block.block.x; }
static inline unsigned __nvvm_read_ptx_sreg_ntid_y(void) { return emu_block.block.y; }
static inline unsigned __nvvm_read_ptx_sreg_ntid_z(void) { return emu_block.block.z; }
static inline unsigned __nvvm_read_ptx_sreg_ctaid_x(void) { return emu_block.blockIdx.x; }
static inline unsigned __nvvm_read_ptx_sreg_ctaid_y(void) { return emu_block.blockIdx.y; }
static inline unsigned __nvvm_read_ptx_sreg_ctaid_z(void) { return emu_block.blockIdx.z; }
static inline unsigned __nvvm_read_ptx_sreg_nctaid_x(void) { return emu_block.grid.x; }
static inline unsigned __nvvm_read_ptx_sreg_nctaid_y(void) { return emu_block.grid.y; }
static inline unsigned __nvvm_read_ptx_sreg_nctaid_z(void) { return emu_block.grid.z; }
static inline float __nvvm_ex2_approx_f(float x) { return exp2f(x); }
// cvt.rn.f16.f32 and cvt.rn.bf16.f32 as clang-14's builtins name them, and
// cvt.f32.f16, which bert.cu reaches through an __fp16 that g++ lacks on
// x86-64, under the name bert.cu gives it: emu.h's rounding, cuBLAS's.
static inline unsigned short __nvvm_f2h_rn(float f) { return emu_float_to_half(f); }
static inline unsigned short __nvvm_f2bf16_rn(float f) { return emu_float_to_bf16(f); }
static inline float f16_float(unsigned short h) { return emu_half_to_float(h); }

extern "C" void emu_switch(void **save_sp, void *to_sp);

static void __syncthreads(void) {
	Fiber *f = emu_block.current;
	f->wait = Wait::Barrier;
	emu_switch(&f->sp, emu_block.scheduler_sp);
}

// warp_op hands the scheduler one lane's part of a warp-level operation
// and returns, once every lane the mask names has arrived, what the
// scheduler worked out for it (run_block checks the rules).
static uint32_t warp_op(WarpOp op, uint32_t mask, uint32_t a, uint32_t b, uint32_t c) {
	Fiber *f = emu_block.current;
	f->op = op, f->mask = mask, f->a = a, f->b = b, f->c = c;
	f->wait = Wait::Warp;
	emu_switch(&f->sp, emu_block.scheduler_sp);
	return f->result;
}

static inline unsigned __nvvm_read_ptx_sreg_laneid(void) { return emu_block.current->lane; }
static inline int __nvvm_shfl_sync_up_i32(unsigned mask, int a, int b, int c) {
	return int(warp_op(WarpOp::Up, mask, uint32_t(a), uint32_t(b), uint32_t(c)));
}
static inline int __nvvm_shfl_sync_down_i32(unsigned mask, int a, int b, int c) {
	return int(warp_op(WarpOp::Down, mask, uint32_t(a), uint32_t(b), uint32_t(c)));
}
static inline int __nvvm_shfl_sync_bfly_i32(unsigned mask, int a, int b, int c) {
	return int(warp_op(WarpOp::Bfly, mask, uint32_t(a), uint32_t(b), uint32_t(c)));
}
static inline int __nvvm_shfl_sync_idx_i32(unsigned mask, int a, int b, int c) {
	return int(warp_op(WarpOp::Idx, mask, uint32_t(a), uint32_t(b), uint32_t(c)));
}
static inline float __nvvm_shfl_sync_up_f32(unsigned mask, float a, int b, int c) {
	return __builtin_bit_cast(float, __nvvm_shfl_sync_up_i32(mask, __builtin_bit_cast(int, a), b, c));
}
static inline float __nvvm_shfl_sync_down_f32(unsigned mask, float a, int b, int c) {
	return __builtin_bit_cast(float, __nvvm_shfl_sync_down_i32(mask, __builtin_bit_cast(int, a), b, c));
}
static inline float __nvvm_shfl_sync_bfly_f32(unsigned mask, float a, int b, int c) {
	return __builtin_bit_cast(float, __nvvm_shfl_sync_bfly_i32(mask, __builtin_bit_cast(int, a), b, c));
}
static inline float __nvvm_shfl_sync_idx_f32(unsigned mask, float a, int b, int c) {
	return __builtin_bit_cast(float, __nvvm_shfl_sync_idx_i32(mask, __builtin_bit_cast(int, a), b, c));
}
static inline void __nvvm_bar_warp_sync(unsigned mask) { warp_op(WarpOp::Sync, mask, 0, 0, 0); }

// The attribute names the .cu file uses: global and device functions are
// plain functions here, and a shared variable is static per OS thread.
#define global
#define device
#define shared )) static thread_local __attribute__((
#include EMU_KERNELS_CU
#undef global
#undef device
#undef shared

// --- The registry: every kernel, with its parameters as compiled ----------

namespace {

template <auto F> struct KernelOf;
template <class... A, void (*F)(A...)> struct KernelOf<F> {
	static constexpr int sizes[sizeof...(A) + 1] = {int(sizeof(A))..., 0};
	static constexpr bool pointers[sizeof...(A) + 1] = {std::is_pointer<A>::value..., false};
	template <size_t... I> static void call(void **p, std::index_sequence<I...>) {
		F(*static_cast<A *>(p[I])...);
	}
	static void invoke(void **p) { call(p, std::index_sequence_for<A...>{}); }
	static EmuKernel info(const char *name, const char *source) {
		return EmuKernel{name, source, int(sizeof...(A)), sizes, pointers, invoke};
	}
};

// emu_kernels.inc (generated by the Makefile from the .cu file) lists every
// extern "C" kernel as EMU_KERNEL(name, source).
#define EMU_KERNEL(name, source) KernelOf<&name>::info(#name, source),
const EmuKernel kernels[] = {
#include "emu_kernels.inc"
};
#undef EMU_KERNEL

// --- Fibers ----------------------------------------------------------------

constexpr size_t stack_size = 64 << 10;
thread_local std::vector<void *> stack_pool;

void *take_stack() {
	if (!stack_pool.empty()) {
		void *s = stack_pool.back();
		stack_pool.pop_back();
		return s;
	}
	// A guard page below the stack, so an overflow faults instead of
	// writing over another fiber's.
	void *m = mmap(nullptr, stack_size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		abort();
	}
	mprotect(m, 4096, PROT_NONE);
	return m;
}

} // namespace

extern "C" void emu_fiber_main(Fiber *f) {
	f->invoke(f->params);
	f->wait = Wait::Done;
	emu_switch(&f->sp, emu_block.scheduler_sp);
	abort(); // a finished fiber is never resumed
}

#if defined(__x86_64__)
// emu_switch saves the callee-saved registers and the floating-point control
// words on the current stack, stores the stack pointer in *save_sp, and
// resumes the stack to_sp the same way. A new fiber's stack is laid out so
// that resuming it "returns" into emu_fiber_entry with the Fiber in r12.
__asm__(
	".text\n"
	".globl emu_switch\n"
	".hidden emu_switch\n"
	".type emu_switch,@function\n"
	"emu_switch:\n"
	"	pushq %rbp\n"
	"	pushq %rbx\n"
	"	pushq %r12\n"
	"	pushq %r13\n"
	"	pushq %r14\n"
	"	pushq %r15\n"
	"	subq $8, %rsp\n"
	"	stmxcsr (%rsp)\n"
	"	fnstcw 4(%rsp)\n"
	"	movq %rsp, (%rdi)\n"
	"	movq %rsi, %rsp\n"
	"	ldmxcsr (%rsp)\n"
	"	fldcw 4(%rsp)\n"
	"	addq $8, %rsp\n"
	"	popq %r15\n"
	"	popq %r14\n"
	"	popq %r13\n"
	"	popq %r12\n"
	"	popq %rbx\n"
	"	popq %rbp\n"
	"	ret\n"
	".size emu_switch, .-emu_switch\n"
	"emu_fiber_entry:\n"
	"	andq $-16, %rsp\n"
	"	movq %r12, %rdi\n"
	"	call emu_fiber_main\n"
	"	ud2\n");
extern "C" void emu_fiber_entry(void);

static void *fiber_init(Fiber *f) {
	uintptr_t top = (uintptr_t)f->stack + 4096 + stack_size;
	uint64_t *sp = (uint64_t *)(top - 16);
	*sp = (uint64_t)(uintptr_t)emu_fiber_entry; // where ret goes
	uint64_t regs[6] = {0, 0, (uint64_t)(uintptr_t)f, 0, 0, 0}; // rbp rbx r12 r13 r14 r15
	for (int i = 0; i < 6; i++) {
		*--sp = regs[i];
	}
	// mxcsr and the x87 control word: the scheduler's own.
	uint32_t mxcsr;
	uint16_t fpucw;
	__asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
	__asm__ volatile("fnstcw %0" : "=m"(fpucw));
	--sp;
	memcpy(sp, &mxcsr, 4);
	memcpy((char *)sp + 4, &fpucw, 2);
	return sp;
}
#else
#error "the CUDA emulator's fibers are written for x86-64"
#endif

namespace {

uint64_t next_rand(uint64_t *s) {
	// xorshift64*: fast, and plenty for shuffling.
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1DULL;
}

template <class T> void shuffle(std::vector<T> &v, uint64_t *s) {
	for (size_t i = v.size(); i > 1; i--) {
		std::swap(v[i - 1], v[next_rand(s) % i]);
	}
}

} // namespace

// A fault (SIGSEGV, SIGBUS) while a kernel runs on this thread is the
// kernel's: an access past the end of its buffer reaches a guard page, or one
// through a pointer that is not device memory at all. On a GPU that is
// CUDA_ERROR_ILLEGAL_ADDRESS, so the handler ends the kernel (jumping back to
// emuRun) instead of the process. Any other fault goes to the handler that
// was there before: the Go runtime's, in a Go program.
// (The variable is set on this thread before any fault it catches, so the
// handler's read of it allocates nothing.)
static __thread sigjmp_buf *kernel_jmp;
static struct sigaction prev_segv, prev_bus;

static void on_fault(int sig, siginfo_t *si, void *uc) {
	if (kernel_jmp != nullptr) {
		siglongjmp(*kernel_jmp, 1);
	}
	struct sigaction *p = sig == SIGSEGV ? &prev_segv : &prev_bus;
	if (p->sa_flags & SA_SIGINFO) {
		p->sa_sigaction(sig, si, uc);
	} else if (p->sa_handler == SIG_DFL) {
		// Returning re-runs the access, which now takes the default action.
		signal(sig, SIG_DFL);
	} else if (p->sa_handler != SIG_IGN) {
		p->sa_handler(sig);
	}
}

// Installed when the library loads: in a Go program that is before the
// runtime sets its own handlers, so the runtime forwards faults in C code
// here, as it does for any handler that was there first.
__attribute__((constructor)) static void install_fault_handler(void) {
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, &prev_segv);
	sigaction(SIGBUS, &sa, &prev_bus);
}

const EmuKernel *emuKernels(int *n) {
	*n = int(sizeof(kernels) / sizeof(kernels[0]));
	return kernels;
}

// A block's warps, as the scheduler tracks them: which lanes exist (the
// last warp of a block whose size is not a multiple of 32 is partial),
// which have exited, and which wait at a warp operation.
struct WarpState {
	uint32_t exist, exited, waiting;
};

// WarpFault ends a block whose warp operation the GPU leaves undefined:
// thrown by the scheduler (never inside a fiber), caught by run_blocks.
struct WarpFault {
	int code;
};

// warp_fault reports such an operation (PTX ISA: shfl.sync,
// bar.warp.sync) and ends the kernel with CUDA_ERROR_LAUNCH_FAILED.
[[noreturn]] __attribute__((format(printf, 4, 5))) static void warp_fault(const EmuKernel *k, const EmuDim &b, unsigned warp, const char *fmt, ...) {
	char what[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	fprintf(stderr, "cudaemu: kernel %s, block (%u,%u,%u), warp %u: %s\n", k->name, b.x, b.y, b.z, warp, what);
	throw WarpFault{EMU_LAUNCH_FAILED};
}

static const char *op_name(WarpOp op) {
	switch (op) {
	case WarpOp::Up: return "shfl.sync.up";
	case WarpOp::Down: return "shfl.sync.down";
	case WarpOp::Bfly: return "shfl.sync.bfly";
	case WarpOp::Idx: return "shfl.sync.idx";
	case WarpOp::Sync: return "bar.warp.sync";
	}
	return "?";
}

// shfl_source is the lane whose a lane reads, by PTX's shfl.sync
// pseudocode: b the lane or offset, c the clamp (bits 0-4) and the segment
// mask (bits 8-12); out of range, a lane reads its own.
static unsigned shfl_source(WarpOp op, unsigned lane, uint32_t b, uint32_t c) {
	int bval = int(b & 31), cval = int(c & 31), seg = int((c >> 8) & 31), l = int(lane);
	int max_lane = (l & seg) | (cval & ~seg), min_lane = l & seg, j = l;
	bool in = false;
	switch (op) {
	case WarpOp::Up: j = l - bval, in = j >= max_lane; break;
	case WarpOp::Down: j = l + bval, in = j <= max_lane; break;
	case WarpOp::Bfly: j = l ^ bval, in = j <= max_lane; break;
	case WarpOp::Idx: j = min_lane | (bval & ~seg), in = j <= max_lane; break;
	case WarpOp::Sync: break;
	}
	return unsigned(in ? j : l);
}

// complete_warp finishes the warp operation lanes named by mask wait at, if
// every lane of the mask that has not exited is there (PTX ISA: shfl.sync
// and bar.warp.sync wait for "all non-exited threads corresponding to
// membermask"), and makes those lanes ready. What the GPU leaves undefined
// is a fault: lanes of one mask at different operations or masks, and a
// lane reading one outside the mask or exited.
static void complete_warp(const EmuKernel *k, const EmuDim &blk, unsigned warp, WarpState &w, Fiber *lanes, uint32_t mask,
	std::vector<Fiber *> &ready) {
	uint32_t need = mask & w.exist & ~w.exited;
	if ((need & ~w.waiting) != 0) {
		return; // a named lane has yet to arrive
	}
	WarpOp op = lanes[__builtin_ctz(need)].op;
	for (uint32_t m = need; m != 0; m &= m - 1) {
		const Fiber &f = lanes[__builtin_ctz(m)];
		if (f.mask != mask || f.op != op) {
			warp_fault(k, blk, warp, "lanes %#010x wait at %s with mask %#010x, lane %u at %s with mask %#010x: every lane a mask names must execute the same operation with the same mask",
				need, op_name(op), mask, f.lane, op_name(f.op), f.mask);
		}
	}
	for (uint32_t m = need; m != 0; m &= m - 1) {
		Fiber &f = lanes[__builtin_ctz(m)];
		if (op != WarpOp::Sync) {
			unsigned j = shfl_source(op, f.lane, f.b, f.c);
			if ((mask >> j & 1) == 0) {
				warp_fault(k, blk, warp, "lane %u's %s reads lane %u, which mask %#010x does not name", f.lane, op_name(op), j, mask);
			}
			if ((w.exist >> j & 1) == 0) {
				warp_fault(k, blk, warp, "lane %u's %s reads lane %u, which a block of %zu threads does not have", f.lane, op_name(op), j,
					size_t(warp) * 32 + __builtin_popcount(w.exist));
			}
			if (w.exited >> j & 1) {
				warp_fault(k, blk, warp, "lane %u's %s reads lane %u, which has exited", f.lane, op_name(op), j);
			}
			f.result = lanes[j].a;
		}
	}
	for (uint32_t m = need; m != 0; m &= m - 1) {
		Fiber &f = lanes[__builtin_ctz(m)];
		f.wait = Wait::Run;
		ready.push_back(&f);
	}
	w.waiting &= ~need;
}

// run_block runs one block to its end. Its fibers run one at a time, the
// next picked at random from those ready, each until it returns, reaches
// __syncthreads or a warp operation. A warp operation completes (its lanes
// ready again) when every lane its mask names has reached it; a barrier
// when every fiber of the block that has not returned is there.
static void run_block(const EmuKernel *k, EmuDim block, void **params, std::vector<Fiber> &fibers, std::vector<WarpState> &warps,
	std::vector<Fiber *> &ready, uint64_t *rng) {
	const EmuDim &blk = emu_block.blockIdx;
	size_t n = fibers.size();
	for (size_t i = 0; i < n; i++) {
		fibers[i] = Fiber{{unsigned(i % block.x), unsigned(i / block.x % block.y), unsigned(i / (size_t(block.x) * block.y))},
			nullptr, nullptr, false, Wait::Run, k->invoke, params, unsigned(i % 32), unsigned(i / 32), WarpOp::Sync, 0, 0, 0, 0, 0};
	}
	warps.assign((n + 31) / 32, WarpState{0, 0, 0});
	for (size_t i = 0; i < n; i++) {
		warps[i / 32].exist |= 1u << (i % 32);
	}
	ready.clear();
	for (Fiber &f : fibers) {
		ready.push_back(&f);
	}
	for (;;) {
		while (!ready.empty()) {
			size_t pick = next_rand(rng) % ready.size();
			Fiber *f = ready[pick];
			ready[pick] = ready.back();
			ready.pop_back();
			if (!f->started) {
				f->started = true;
				f->stack = take_stack();
				f->sp = fiber_init(f);
			}
			emu_block.current = f;
			emu_switch(&emu_block.scheduler_sp, f->sp);
			WarpState &w = warps[f->warp];
			Fiber *lanes = &fibers[size_t(f->warp) * 32];
			uint32_t bit = 1u << f->lane;
			if (f->wait == Wait::Done) {
				stack_pool.push_back(f->stack);
				f->stack = nullptr;
				w.exited |= bit;
				// An exit can complete what the other lanes wait at.
				for (uint32_t m = w.waiting; m != 0; m &= m - 1) {
					const Fiber &o = lanes[__builtin_ctz(m)];
					if (o.mask >> f->lane & 1) {
						complete_warp(k, blk, f->warp, w, lanes, o.mask, ready);
						break;
					}
				}
			} else if (f->wait == Wait::Warp) {
				if ((f->mask & bit) == 0) {
					warp_fault(k, blk, f->warp, "lane %u executes %s with mask %#010x, which does not name it", f->lane, op_name(f->op), f->mask);
				}
				w.waiting |= bit;
				complete_warp(k, blk, f->warp, w, lanes, f->mask, ready);
			}
		}
		size_t at_barrier = 0;
		for (size_t wi = 0; wi < warps.size(); wi++) {
			if (uint32_t m = warps[wi].waiting; m != 0) {
				const Fiber &f = fibers[wi * 32 + __builtin_ctz(m)];
				uint32_t missing = f.mask & warps[wi].exist & ~warps[wi].exited & ~m;
				warp_fault(k, blk, unsigned(wi), "lane %u waits at %s with mask %#010x, but lanes %#010x of that mask are at __syncthreads or another warp operation, and never come",
					f.lane, op_name(f.op), f.mask, missing);
			}
		}
		for (Fiber &f : fibers) {
			if (f.wait == Wait::Barrier) {
				f.wait = Wait::Run;
				ready.push_back(&f);
				at_barrier++;
			}
		}
		if (at_barrier == 0) {
			return; // every fiber has returned
		}
	}
}

// run_blocks is emuRun's work, apart from its sigsetjmp: nothing the jump
// back needs is changed in emuRun's frame after it.
__attribute__((noinline)) static int run_blocks(const EmuKernel *k, EmuDim grid, EmuDim block, void **params, uint64_t seed,
	std::vector<Fiber> &fibers) {
	uint64_t rng = seed | 1;
	std::vector<EmuDim> blocks;
	blocks.reserve(size_t(grid.x) * grid.y * grid.z);
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++)
				blocks.push_back({x, y, z});
	shuffle(blocks, &rng);

	std::vector<WarpState> warps;
	std::vector<Fiber *> ready;
	ready.reserve(fibers.size());
	emu_block.grid = grid;
	emu_block.block = block;
	for (const EmuDim &b : blocks) {
		emu_block.blockIdx = b;
		try {
			run_block(k, block, params, fibers, warps, ready, &rng);
		} catch (const WarpFault &e) {
			// The block's fibers are abandoned where they were, as at a fault.
			for (Fiber &f : fibers) {
				if (f.stack != nullptr) {
					stack_pool.push_back(f.stack);
					f.stack = nullptr;
				}
			}
			return e.code;
		}
	}
	return EMU_SUCCESS;
}

int emuRun(const EmuKernel *k, EmuDim grid, EmuDim block, void **params, uint64_t seed) {
	uint64_t threads = uint64_t(block.x) * block.y * block.z;
	if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
		return EMU_LAUNCH_OUT_OF_RESOURCES;
	}
	std::vector<Fiber> fibers(threads);
	const BlockState saved = emu_block;
	sigjmp_buf jmp;
	if (sigsetjmp(jmp, 1) != 0) {
		// A fault: every fiber of the block is abandoned where it was.
		kernel_jmp = nullptr;
		for (Fiber &f : fibers) {
			if (f.stack != nullptr) {
				stack_pool.push_back(f.stack);
				f.stack = nullptr;
			}
		}
		emu_block = saved;
		return EMU_ILLEGAL_ADDRESS;
	}
	kernel_jmp = &jmp;
	int r = run_blocks(k, grid, block, params, seed, fibers);
	kernel_jmp = nullptr;
	emu_block = saved;
	return r;
}
