// Kernels for the self-test of the emulator's warp operations (selftest.cc):
// compiled into the emulated driver only, never into PTX (the self-test
// loads them through a PTX text that declares their entries). Written as
// bert.cu is, with the NVVM builtins clang emits for __shfl_*_sync and
// __syncwarp.

#define GLOBAL __attribute__((global))
#define SHARED __attribute__((shared))

typedef long i64;

namespace emuwarp {

// emu_shfl sets out[t] to what thread t's shfl.sync (mode 0 up, 1 down,
// 2 bfly, 3 idx, with b and c as PTX takes them) returns when every lane
// offers in[t]; lanes that take no part leave out alone. how says which
// lanes take part, and with which mask:
//   0: the lanes mask names, with mask; the others return at once
//   1: the lanes mask names, with the whole warp's mask; the others wait at
//      __syncthreads (a lane named but never coming)
//   2: as 0, but lane 0 passes mask without lane 1 (masks that disagree)
//   3: every lane, each half-warp with a mask of its own half (mask unused)
//   4: every lane, with mask (lanes it does not name call it too)
//   5: the lanes mask names, with the whole warp's mask; the others return
//      at once (lanes named that have exited)
extern "C" GLOBAL void emu_shfl(const int *in, int *out, i64 mode, i64 b, i64 c, i64 mask, i64 how) {
	unsigned t = __nvvm_read_ptx_sreg_tid_x(), lane = __nvvm_read_ptx_sreg_laneid();
	unsigned m = (unsigned)mask;
	bool named = (m >> lane & 1) != 0;
	if (how == 3) {
		m = 0xffffu << (lane & 16);
	} else if (how == 1 || how == 5) {
		if (!named) {
			if (how == 1) {
				__syncthreads();
			}
			return;
		}
		m = 0xffffffffu;
	} else if (how == 2 && lane == 0) {
		m &= ~2u;
	} else if (how != 4 && !named) {
		return;
	}
	int v = in[t];
	switch (mode) {
	case 0: v = __nvvm_shfl_sync_up_i32(m, v, (int)b, (int)c); break;
	case 1: v = __nvvm_shfl_sync_down_i32(m, v, (int)b, (int)c); break;
	case 2: v = __nvvm_shfl_sync_bfly_i32(m, v, (int)b, (int)c); break;
	default: v = __nvvm_shfl_sync_idx_i32(m, v, (int)b, (int)c); break;
	}
	out[t] = v;
}

// emu_syncwarp has each thread write its slot of shared memory, then (with
// sync) __syncwarp, then read its neighbour's (t^1): out[t] is gen·1024 +
// (t^1) only if the neighbour wrote before it read.
extern "C" GLOBAL void emu_syncwarp(int *out, i64 gen, i64 sync) {
	SHARED int slot[1024];
	unsigned t = __nvvm_read_ptx_sreg_tid_x();
	slot[t] = (int)gen * 1024 + (int)t;
	if (sync) {
		__nvvm_bar_warp_sync(0xffffffffu);
	}
	out[t] = slot[t ^ 1];
}

} // namespace emuwarp

using emuwarp::emu_shfl;
using emuwarp::emu_syncwarp;
