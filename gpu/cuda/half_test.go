package cuda

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Values worked by hand from IEEE 754's binary16 (1 sign, 5 exponent, 10
// mantissa bits, bias 15): ties, the largest finite, overflow, subnormals
// and one rounding up into the normals, zero's sign.
func TestHalfBitsKnownValues(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {0.1, 0x2e66}, {65504, 0x7bff}, {65519.99, 0x7bff}, {65520, 0x7c00},
		{1e30, 0x7c00}, {float32(math.Inf(-1)), 0xfc00}, {0x1p-14, 0x0400}, {0x1p-24, 0x0001}, {0x1p-25, 0x0000},
		{0x3p-26, 0x0001}, {1e-8, 0}, {0x3ffp-24 + 0x1p-25, 0x0400}, {0x3fdp-24 + 0x1p-25, 0x03fe},
		{1 + 0x1p-11, 0x3c00}, {1 + 0x3p-11, 0x3c02}, {float32(math.Copysign(0, -1)), 0x8000},
	} {
		if got := HalfBits(c.f); got != c.want {
			t.Errorf("HalfBits(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if h := HalfBits(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("HalfBits(NaN) = %#04x, not a NaN", h)
	}
	for _, c := range []struct {
		f    float32
		want uint16
	}{{1, 0x3f80}, {1 + 0x1p-8, 0x3f80}, {1 + 0x3p-8, 0x3f82}, {-3, 0xc040}, {math.MaxFloat32, 0x7f80}, {0x1p-133, 0x0001}} {
		if got := BFloat16Bits(c.f); got != c.want {
			t.Errorf("BFloat16Bits(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
}

// Every binary16 value converts to float32 and back to itself, and a
// float32 rounds to the nearer of the two halves around it (to the even one
// on a tie): checked against the neighbours of what it rounded to, for
// float32s spread over binary16's whole range and for every exact midpoint
// of two finite halves.
func TestHalfRoundsToNearestEven(t *testing.T) {
	for h := range 1 << 16 {
		v := HalfValue(uint16(h))
		if v != v {
			continue
		}
		if back := HalfBits(v); back != uint16(h) {
			t.Fatalf("binary16 %#04x is %g, which converts back to %#04x", h, v, back)
		}
		if b := uint16(h); BFloat16Bits(BFloat16Value(b)) != b {
			t.Fatalf("bfloat16 %#04x does not convert back to itself", b)
		}
	}
	check := func(f float32) {
		h := HalfBits(f)
		got := float64(HalfValue(h))
		if math.IsInf(got, 0) {
			if math.Abs(float64(f)) < 65520 {
				t.Fatalf("%g rounded to infinity", f)
			}
			return
		}
		d := math.Abs(float64(f) - got)
		for _, n := range []uint16{h - 1, h + 1} {
			if n&0x7c00 == 0x7c00 || (n^h)&0x8000 != 0 {
				continue // past the finite range, or across zero
			}
			dn := math.Abs(float64(f) - float64(HalfValue(n)))
			if dn < d || dn == d && h&1 == 1 {
				t.Fatalf("%g (%#08x) rounded to %#04x (%g), but %#04x (%g) is nearer or even", f, math.Float32bits(f), h, got, n, HalfValue(n))
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 37))
	for range 200000 {
		check(math.Float32frombits(r.Uint32()&0x807fffff | (0x66+r.Uint32N(0x2b))<<23)) // exponents 2⁻²⁵ to 2¹⁷
	}
	for h := range 0x7bff {
		lo, hi := float64(HalfValue(uint16(h))), float64(HalfValue(uint16(h+1)))
		check(float32((lo + hi) / 2)) // exact in float32: a half has 11 significant bits
	}
}
