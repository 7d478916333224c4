#include "textflag.h"

// AVX2+FMA versions of mathf.go's gelu and expf, eight lanes at a time,
// with the same constants and the same order of operations as the Go; the
// branches become blends of both sides. See mathf.go for the math.

// C8 is a float32 (given by its bits) repeated in 8 lanes: a 32-byte
// operand for the vector instructions.
#define C8(name, bits) DATA name<>+0(SB)/4, $bits; DATA name<>+4(SB)/4, $bits; DATA name<>+8(SB)/4, $bits; \
	DATA name<>+12(SB)/4, $bits; DATA name<>+16(SB)/4, $bits; DATA name<>+20(SB)/4, $bits; \
	DATA name<>+24(SB)/4, $bits; DATA name<>+28(SB)/4, $bits; GLOBL name<>(SB), RODATA|NOPTR, $32

C8(half, 0x3f000000)
C8(one, 0x3f800000)
C8(minusOne, 0xbf800000)
C8(rsqrt2, 0x3f3504f3)
C8(absMask, 0x7fffffff)
C8(twoOverSqrtPi, 0x3f906ebb)
C8(expLo, 0xc2d00000)   // -104: below it every result is 0
C8(expZero, 0xc2ce0000) // -103: below it the result is 0
C8(log2e, 0x3fb8aa3b)
C8(ln2hi, 0x3f317200)
C8(ln2lo, 0x35bfbe8e)
C8(bias127, 0x0000007f) // an int32

// exp's Taylor coefficients 1/n!, n = 8 … 1 (the constant term is one<>).
C8(e8, 0x37d00d01)
C8(e7, 0x39500d01)
C8(e6, 0x3ab60b61)
C8(e5, 0x3c088889)
C8(e4, 0x3d2aaaab)
C8(e3, 0x3e2aaaab)

// erfSmall's (-1)^n / (n!·(2n+1)), n = 13 … 1 (n = 0 is one<>).
C8(s13, 0xacd144f7)
C8(s12, 0x2eb7a247)
C8(s11, 0xb095b399)
C8(s10, 0x32617183)
C8(s9, 0xb41bbbe3)
C8(s8, 0x35c3d001)
C8(s7, 0xb75debbd)
C8(s6, 0x38e00e01)
C8(s5, 0xba46980c)
C8(s4, 0x3b97b426)
C8(s3, 0xbcc30c31)
C8(s2, 0x3dcccccd)
C8(s1, 0xbeaaaaab)

// erfcf's P(t) coefficients, t^9 … t^0.
C8(p9, 0x3e2ef945)
C8(p8, 0xbf527892)
C8(p7, 0x3fbe87b0)
C8(p6, 0xbf914e5d)
C8(p5, 0x3e8ec7cc)
C8(p4, 0xbe3ec24c)
C8(p3, 0x3dc636c9)
C8(p2, 0x3ebf88fb)
C8(p1, 0x3f8000c7)
C8(p0, 0xbfa1fc4e)

// EXP8 sets Y6 = e^Y6 for arguments up to 88 (both callers' are ≤ 0),
// using Y7-Y10.
#define EXP8 \
	VMAXPS expLo<>(SB), Y6, Y6 \
	VCMPPS $1, expZero<>(SB), Y6, Y10 \
	VMULPS log2e<>(SB), Y6, Y7 \
	VROUNDPS $0, Y7, Y7 \
	VFNMADD231PS ln2hi<>(SB), Y7, Y6 \
	VFNMADD231PS ln2lo<>(SB), Y7, Y6 \
	VMOVUPS e8<>(SB), Y8 \
	VFMADD213PS e7<>(SB), Y6, Y8 \
	VFMADD213PS e6<>(SB), Y6, Y8 \
	VFMADD213PS e5<>(SB), Y6, Y8 \
	VFMADD213PS e4<>(SB), Y6, Y8 \
	VFMADD213PS e3<>(SB), Y6, Y8 \
	VFMADD213PS half<>(SB), Y6, Y8 \
	VFMADD213PS one<>(SB), Y6, Y8 \
	VFMADD213PS one<>(SB), Y6, Y8 \
	VCVTPS2DQ Y7, Y7 \
	VPSRAD $1, Y7, Y9 \
	VPSUBD Y9, Y7, Y7 \
	VPADDD bias127<>(SB), Y9, Y9 \
	VPSLLD $23, Y9, Y9 \
	VPADDD bias127<>(SB), Y7, Y7 \
	VPSLLD $23, Y7, Y7 \
	VMULPS Y9, Y8, Y8 \
	VMULPS Y7, Y8, Y8 \
	VANDNPS Y8, Y10, Y6

// func geluAVX2(xs *float32, n int)
//
// xs[i] = xs[i]·Φ(xs[i]) for i < n, n a multiple of 8.
TEXT ·geluAVX2(SB), NOSPLIT, $0-16
	MOVQ xs+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $3, CX
	JZ done
	VMOVUPS one<>(SB), Y13
	VMOVUPS half<>(SB), Y14

loop:
	VMOVUPS (SI), Y0
	VMULPS rsqrt2<>(SB), Y0, Y1 // z
	VANDPS absMask<>(SB), Y1, Y4 // a = |z|

	// |z| < 1: Φ = (1 + erfSmall(z))/2.
	VMULPS Y1, Y1, Y2
	VMOVUPS s13<>(SB), Y3
	VFMADD213PS s12<>(SB), Y2, Y3
	VFMADD213PS s11<>(SB), Y2, Y3
	VFMADD213PS s10<>(SB), Y2, Y3
	VFMADD213PS s9<>(SB), Y2, Y3
	VFMADD213PS s8<>(SB), Y2, Y3
	VFMADD213PS s7<>(SB), Y2, Y3
	VFMADD213PS s6<>(SB), Y2, Y3
	VFMADD213PS s5<>(SB), Y2, Y3
	VFMADD213PS s4<>(SB), Y2, Y3
	VFMADD213PS s3<>(SB), Y2, Y3
	VFMADD213PS s2<>(SB), Y2, Y3
	VFMADD213PS s1<>(SB), Y2, Y3
	VFMADD213PS Y13, Y2, Y3
	VMULPS twoOverSqrtPi<>(SB), Y1, Y7
	VMULPS Y7, Y3, Y3
	VADDPS Y13, Y3, Y3
	VMULPS Y14, Y3, Y3

	// |z| ≥ 1: erfc(a) = t·e^(P(t) - a²), t = 1/(1 + a/2).
	VMULPS Y14, Y4, Y5
	VADDPS Y13, Y5, Y5
	VDIVPS Y5, Y13, Y5
	VMOVUPS p9<>(SB), Y6
	VFMADD213PS p8<>(SB), Y5, Y6
	VFMADD213PS p7<>(SB), Y5, Y6
	VFMADD213PS p6<>(SB), Y5, Y6
	VFMADD213PS p5<>(SB), Y5, Y6
	VFMADD213PS p4<>(SB), Y5, Y6
	VFMADD213PS p3<>(SB), Y5, Y6
	VFMADD213PS p2<>(SB), Y5, Y6
	VFMADD213PS p1<>(SB), Y5, Y6
	VFMADD213PS p0<>(SB), Y5, Y6
	VMULPS Y4, Y4, Y7
	VSUBPS Y7, Y6, Y6
	EXP8
	VMULPS Y5, Y6, Y6 // erfc(a)

	// z ≥ 1: Φ = (1 + (1 - erfc))/2; z ≤ -1: Φ = erfc/2.
	VSUBPS Y6, Y13, Y7
	VADDPS Y13, Y7, Y7
	VMULPS Y14, Y7, Y7
	VMULPS Y14, Y6, Y6
	VCMPPS $2, minusOne<>(SB), Y1, Y8 // z ≤ -1
	VBLENDVPS Y8, Y6, Y7, Y7
	VCMPPS $1, Y13, Y4, Y9 // a < 1
	VBLENDVPS Y9, Y3, Y7, Y7

	VMULPS Y7, Y0, Y0
	VMOVUPS Y0, (SI)
	ADDQ $32, SI
	DECQ CX
	JNZ loop

done:
	VZEROUPPER
	RET

// func expSubAVX2(dst, src *float32, n int, sub float32) (sum float64)
//
// dst[i] = e^(src[i] - sub) for i < n, n a multiple of 8, and the sum of
// the results, accumulated in float64.
TEXT ·expSubAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS sub+24(FP), Y11
	VXORPD Y12, Y12, Y12
	VXORPD Y13, Y13, Y13
	SHRQ $3, CX
	JZ sum

loop:
	VMOVUPS (SI), Y6
	VSUBPS Y11, Y6, Y6
	EXP8
	VMOVUPS Y6, (DI)
	VCVTPS2PD X6, Y7
	VADDPD Y7, Y12, Y12
	VEXTRACTF128 $1, Y6, X6
	VCVTPS2PD X6, Y7
	VADDPD Y7, Y13, Y13
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ loop

sum:
	VADDPD Y13, Y12, Y12
	VEXTRACTF128 $1, Y12, X13
	VADDPD X13, X12, X12
	VHADDPD X12, X12, X12
	VZEROUPPER
	MOVSD X12, sum+32(FP)
	RET
