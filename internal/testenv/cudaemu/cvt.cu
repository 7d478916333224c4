// Kernels for the self-test of the emulator's half-precision conversions
// (selftest.cc): compiled into the emulated driver only, never into PTX
// (the self-test loads them through a PTX text that declares their
// entries). They call what bert.cu calls: clang-14's NVVM builtins for
// cvt.rn.f16.f32 and cvt.rn.bf16.f32, and f16_float for cvt.f32.f16, as
// kernels.cc's prelude defines them.

#define GLOBAL __attribute__((global))

typedef long i64;

namespace emucvt {

// emu_cvt_to_half sets f16[i] and bf16[i] to x[i] rounded to binary16 and
// to bfloat16, i < n, by a grid-stride loop.
extern "C" GLOBAL void emu_cvt_to_half(const float *x, unsigned short *f16, unsigned short *bf16, i64 n) {
	i64 stride = (i64)__nvvm_read_ptx_sreg_ntid_x() * __nvvm_read_ptx_sreg_nctaid_x();
	for (i64 i = (i64)__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() + __nvvm_read_ptx_sreg_tid_x(); i < n; i += stride) {
		f16[i] = __nvvm_f2h_rn(x[i]);
		bf16[i] = __nvvm_f2bf16_rn(x[i]);
	}
}

// emu_cvt_from_half sets out[i] to binary16 h[i] as float32, i < n.
extern "C" GLOBAL void emu_cvt_from_half(const unsigned short *h, float *out, i64 n) {
	i64 stride = (i64)__nvvm_read_ptx_sreg_ntid_x() * __nvvm_read_ptx_sreg_nctaid_x();
	for (i64 i = (i64)__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() + __nvvm_read_ptx_sreg_tid_x(); i < n; i += stride) {
		out[i] = f16_float(h[i]);
	}
}

} // namespace emucvt

using emucvt::emu_cvt_from_half;
using emucvt::emu_cvt_to_half;
