package bert

import "math"

// float32 exp and erf for softmax and GELU. math.Exp and math.Erf work in
// float64 and took a quarter of the CPU encoder's time (math.Erf alone
// 18%); the activations are float32, so float32 accuracy (a few 1e-7
// relative) is all they need. The math is that of the CUDA kernels'
// exp_f, erfc_f and erf_small (kernels/bert.cu), so both encoders round
// alike; mathf_test.go holds each against math.Exp and math.Erf(c) over a
// dense range.

// expf is e^x to about 1 ulp: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in
// two so that n·ln2 is exact), e^r from its Taylor series to r^8 (the
// remainder is below 2^-27 relative), and 2^n put into the exponent bits.
func expf(x float32) float32 {
	if x < -103 {
		return 0
	}
	if x > 88.7 {
		return float32(math.Inf(1))
	}
	n := float32(math.RoundToEven(float64(x * 1.44269504)))
	r := x - n*0.693145752 // ln2's upper bits: n·this is exact
	r -= n * 1.42860677e-6 // the rest of ln2
	p := float32(1.0 / 40320)
	p = p*r + 1.0/5040
	p = p*r + 1.0/720
	p = p*r + 1.0/120
	p = p*r + 1.0/24
	p = p*r + 1.0/6
	p = p*r + 0.5
	p = p*r + 1
	p = p*r + 1
	k := int32(n)
	// 2^k in two steps, so that k below -126 (a subnormal result) works.
	k1 := k / 2
	k2 := k - k1
	return p * math.Float32frombits(uint32(k1+127)<<23) * math.Float32frombits(uint32(k2+127)<<23)
}

// erfcf is erfc(z) for z ≥ 1 with relative error about 1.2e-7: the
// Chebyshev-fitted form t·exp(-z² + P(t)), t = 1/(1 + z/2), with the
// coefficients of Numerical Recipes' erfcc (fractional error below 1.2e-7
// for every z ≥ 0).
func erfcf(z float32) float32 {
	t := 1 / (1 + 0.5*z)
	p := float32(0.17087277)
	p = p*t - 0.82215223
	p = p*t + 1.48851587
	p = p*t - 1.13520398
	p = p*t + 0.27886807
	p = p*t - 0.18628806
	p = p*t + 0.09678418
	p = p*t + 0.37409196
	p = p*t + 1.00002368
	p = p*t - 1.26551223
	return t * expf(p-z*z)
}

// erfSmall is erf(z) for |z| < 1 from its Maclaurin series to z^27, whose
// remainder there is below 3e-12 relative: relative accuracy near 0, where
// 1 - erfc would lose it. The coefficients are (-1)^n / (n!·(2n+1)).
func erfSmall(z float32) float32 {
	z2 := z * z
	p := float32(-1.0 / 168129561600)
	p = p*z2 + 1.0/11975040000
	p = p*z2 - 1.0/918086400
	p = p*z2 + 1.0/76204800
	p = p*z2 - 1.0/6894720
	p = p*z2 + 1.0/685440
	p = p*z2 - 1.0/75600
	p = p*z2 + 1.0/9360
	p = p*z2 - 1.0/1320
	p = p*z2 + 1.0/216
	p = p*z2 - 1.0/42
	p = p*z2 + 1.0/10
	p = p*z2 - 1.0/3
	p = p*z2 + 1
	return 1.1283791671 * z * p // 2/√π
}

// erff is erf(z) to float32 accuracy.
func erff(z float32) float32 {
	a := z
	if a < 0 {
		a = -a
	}
	if a < 1 {
		return erfSmall(z)
	}
	e := 1 - erfcf(a)
	if z < 0 {
		return -e
	}
	return e
}

// phif is the standard normal CDF Φ(v) = (1 + erf(v/√2))/2, from erfc in
// the lower tail, where 1 + erf would cancel to nothing.
func phif(v float32) float32 {
	z := v * 0.70710678118654752
	if z <= -1 {
		return 0.5 * erfcf(-z)
	}
	return 0.5 * (1 + erff(z))
}
