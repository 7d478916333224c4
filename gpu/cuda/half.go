package cuda

import "math"

// Half precision as the GPU rounds it: IEEE 754 binary16 and bfloat16, from
// float32 to nearest, ties to even (cvt.rn), and back exactly. The CUDA
// encoder converts its weights with these once, on the host, to store them
// in half precision; kernels/bert.cu converts activations on the device by
// the same rule. Outside the cuda build so that they are tested everywhere.

// HalfBits is f rounded to binary16: infinities for what rounds past 65504,
// subnormals down to 2⁻²⁴, NaN kept NaN (quiet).
func HalfBits(f float32) uint16 {
	x := math.Float32bits(f)
	sign := uint16(x>>16) & 0x8000
	ax := x & 0x7fffffff
	switch {
	case ax > 0x7f800000:
		return sign | 0x7e00 | uint16(ax>>13)&0x3ff
	case ax >= 0x477ff000: // 65520, halfway past 65504: ties to even, which is infinity
		return sign | 0x7c00
	case ax < 0x33000000: // below 2⁻²⁵, half the least subnormal
		return sign
	case ax < 0x38800000: // below 2⁻¹⁴: a subnormal, in units of 2⁻²⁴
		e, m := ax>>23, ax&0x7fffff|0x800000
		shift := 126 - e
		hm, rem, halfway := m>>shift, m&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > halfway || rem == halfway && hm&1 == 1 {
			hm++ // may carry into the least normal, 0x400, its right encoding
		}
		return sign | uint16(hm)
	}
	hm, rem := ax>>13-112<<10, ax&0x1fff // rebias the exponent 127 → 15
	if rem > 0x1000 || rem == 0x1000 && hm&1 == 1 {
		hm++ // a carry out of the mantissa raises the exponent, up to infinity
	}
	return sign | uint16(hm)
}

// HalfValue is the float32 that binary16 h stands for, exactly.
func HalfValue(h uint16) float32 {
	sign, e, m := uint32(h&0x8000)<<16, uint32(h>>10)&0x1f, uint32(h&0x3ff)
	switch e {
	case 0:
		v := float32(m) * 0x1p-24
		if sign != 0 {
			return -v
		}
		return v
	case 31:
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}

// BFloat16Bits is f rounded to bfloat16 (float32's top 16 bits), NaN kept
// NaN (quiet).
func BFloat16Bits(f float32) uint16 {
	x := math.Float32bits(f)
	if x&0x7fffffff > 0x7f800000 {
		return uint16(x>>16) | 0x40
	}
	return uint16((x + 0x7fff + (x>>16)&1) >> 16)
}

// BFloat16Value is the float32 that bfloat16 b stands for, exactly.
func BFloat16Value(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }
