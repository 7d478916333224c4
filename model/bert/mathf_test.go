package bert

import (
	"math"
	"testing"
)

// relErr is |got - want| / |want|, or |got - want| where want is 0.
func relErr(got float32, want float64) float64 {
	d := math.Abs(float64(got) - want)
	if want == 0 {
		return d
	}
	return d / math.Abs(want)
}

// sweep calls f at n+1 evenly spaced float32 points of [lo, hi] and
// returns the largest value f gave and where.
func sweep(lo, hi float64, n int, f func(x float32) float64) (worst float64, at float32) {
	for i := range n + 1 {
		x := float32(lo + (hi-lo)*float64(i)/float64(n))
		if e := f(x); e > worst || math.IsNaN(e) {
			worst, at = e, x
		}
	}
	return worst, at
}

// The bounds below are from what these sweeps measured (in the comments),
// rounded up: float32 has an ulp of 6e-8 to 1.2e-7 relative, so each is a
// few ulps. A wrong coefficient, a term dropped from a series or a wrong
// ln2 split moves them by orders of magnitude.

func TestExpfMatchesMathExp(t *testing.T) {
	// Normal float32 results: measured 9.6e-8.
	worst, at := sweep(-87, 88.5, 2_000_000, func(x float32) float64 { return relErr(expf(x), math.Exp(float64(x))) })
	if worst > 2.5e-7 {
		t.Errorf("expf: relative error %.3g at %g, want ≤ 2.5e-7", worst, at)
	}
	t.Logf("expf: largest relative error %.3g at %g", worst, at)
	// Subnormal results: within one subnormal step.
	worst, at = sweep(-103, -87.5, 100_000, func(x float32) float64 { return math.Abs(float64(expf(x)) - math.Exp(float64(x))) })
	if worst > 1.5e-45 {
		t.Errorf("expf: error %.3g at %g, want within a subnormal step", worst, at)
	}
	for _, c := range []struct{ x, want float32 }{
		{-104, 0}, {-math.MaxFloat32, 0}, {float32(math.Inf(-1)), 0}, {0, 1}, {89, float32(math.Inf(1))},
	} {
		if got := expf(c.x); got != c.want {
			t.Errorf("expf(%g) = %g, want %g", c.x, got, c.want)
		}
	}
}

func TestErffMatchesMathErf(t *testing.T) {
	// Measured 2.0e-7 (at z = -0.89, the series).
	worst, at := sweep(-6, 6, 2_000_000, func(z float32) float64 { return relErr(erff(z), math.Erf(float64(z))) })
	if worst > 3e-7 {
		t.Errorf("erff: relative error %.3g at %g, want ≤ 3e-7", worst, at)
	}
	t.Logf("erff: largest relative error %.3g at %g", worst, at)
	// Near 0, relative accuracy holds down to tiny arguments.
	worst, at = sweep(-1e-6, 1e-6, 100_000, func(z float32) float64 { return relErr(erff(z), math.Erf(float64(z))) })
	if worst > 3e-7 {
		t.Errorf("erff near 0: relative error %.3g at %g, want ≤ 3e-7", worst, at)
	}
}

// TestPhifMatchesMathErfc holds Φ against math.Erfc: phif itself, and
// gelu(v)/v on each path (Go and, where the CPU has them, the AVX2 lanes),
// whose one more rounding (x·Φ) the bound's few ulps absorb.
func TestPhifMatchesMathErfc(t *testing.T) {
	t.Run("phif", func(t *testing.T) { testPhi(t, phif, 0) })
	mathPaths(t, func(t *testing.T) {
		testPhi(t, func(v float32) float32 {
			if v == 0 {
				return 0.5
			}
			x := []float32{v, v, v, v, v, v, v, v}
			gelu(x)
			return x[0] / v
		}, 0x1p-23) // x·Φ and /x: two more roundings
	})
}

func testPhi(t *testing.T, phif func(float32) float32, slack float64) {
	phi := func(v float32) float64 { return 0.5 * math.Erfc(-float64(v)/math.Sqrt2) }
	// In the lower tail, erfc(z) = t·e^(-z²+…) inherits the rounding of
	// z = v/√2 and of z² (half an ulp each, relative), times z²: the bound
	// is a few ulps plus 6·z²·2^-24 (2z² from z, z² from z², the rest from
	// the exp). Between z = -1 and 0, Φ is (1 + erf)/2 and erf's few ulps
	// are divided by 1 + erf ≥ 0.157. Measured: 1.0e-6 at v = -1.4
	// (Φ = 0.08), 4.3e-6 at v = -5.8 (Φ = 3e-9), 1.9e-5 at v = -12.8
	// (Φ = 7e-38), at most 0.83 of the bound; GELU's output in the tail,
	// x·Φ(x), is below 1e-8 and 1e-36.
	var worst float64
	var at float32
	for i := range 4_000_001 {
		v := float32(-13 + 23*float64(i)/4_000_000)
		z := float64(v) / math.Sqrt2
		bound := slack + 3e-7 + 6*z*z*0x1p-24
		if z > -1 {
			bound = slack + 3e-7/(2*phi(v))
		}
		if e := relErr(phif(v), phi(v)) / bound; e > worst {
			worst, at = e, v
		}
	}
	if worst > 1 {
		t.Errorf("phif: relative error %.3g of its bound at %g", worst, at)
	}
	t.Logf("phif on [-13, 10]: largest relative error %.3g of its bound, at %g", worst, at)
}

func TestGeluMatchesFloat64(t *testing.T) {
	mathPaths(t, testGelu)
}

func testGelu(t *testing.T) {
	xs := make([]float32, 0, 1_000_001)
	for i := range 1_000_001 {
		xs = append(xs, float32(-20+40*float64(i)/1_000_000))
	}
	want := make([]float64, len(xs))
	for i, x := range xs {
		want[i] = float64(x) * 0.5 * math.Erfc(-float64(x)/math.Sqrt2)
	}
	gelu(xs)
	// Measured 1.4e-7 of max(|x|, 1): a few ulps of the input's scale.
	var worst float64
	var at int
	for i, w := range want {
		x := -20 + 40*float64(i)/1_000_000
		if e := math.Abs(float64(xs[i])-w) / max(math.Abs(x), 1); e > worst {
			worst, at = e, i
		}
	}
	if worst > 5e-7 {
		t.Errorf("gelu: error %.3g of max(|x|, 1) at x = %g, want ≤ 5e-7", worst, -20+40*float64(at)/1_000_000)
	}
	t.Logf("gelu: largest error %.3g of max(|x|, 1)", worst)
}

func TestSoftmaxMatchesFloat64(t *testing.T) {
	mathPaths(t, testSoftmax)
}

// testSoftmax runs softmax on a row of 300 (37 blocks of 8 and 4 more).
func testSoftmax(t *testing.T) {
	row := make([]float32, 300)
	want := make([]float64, len(row))
	for i := range row {
		row[i] = float32(math.Sin(float64(i)) * 12)
		if i%7 == 3 {
			row[i] -= math.MaxFloat32 // masked
		}
	}
	var sum float64
	mx := math.Inf(-1)
	for _, v := range row {
		mx = max(mx, float64(v))
	}
	for i, v := range row {
		want[i] = math.Exp(float64(v) - mx)
		sum += want[i]
	}
	row0 := append([]float32(nil), row...)
	softmax(row)
	for i, v := range row {
		if i%7 == 3 && v != 0 {
			t.Errorf("masked entry %d is %g, want 0", i, v)
		}
		// v - max is rounded to float32 first, as the encoder has always
		// done: half an ulp of it, times e^x's slope, on top of expf's.
		bound := 3e-7 + math.Abs(float64(row0[i])-mx)*0x1p-24
		if e := relErr(v, want[i]/sum); e > bound {
			t.Errorf("entry %d: %g, want %g (relative error %.3g)", i, v, want[i]/sum, e)
		}
	}
}

// mathPaths runs f with gelu and softmax in Go, then, where the CPU has
// AVX2 and FMA, in mathf_amd64.s's lanes.
func mathPaths(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	saved := hasVectorMath
	t.Cleanup(func() { hasVectorMath = saved })
	for _, v := range []bool{false, true} {
		if v && !saved {
			t.Logf("no AVX2+FMA here: the vector path does not run")
			continue
		}
		hasVectorMath = v
		t.Run(map[bool]string{false: "go", true: "avx2"}[v], f)
	}
	hasVectorMath = saved
}

// TestExpSubVector holds the eight-lane exp against math.Exp over the
// range softmax gives it (v - max ≤ 0, masked entries near -MaxFloat32)
// and up to 88, with the bounds TestExpfMatchesMathExp holds expf to.
func TestExpSubVector(t *testing.T) {
	if !hasVectorMath {
		t.Skip("no AVX2+FMA here")
	}
	const n = 2_000_000
	src := make([]float32, n+5)
	for i := range n {
		src[i] = float32(-110 + 198*float64(i)/n)
	}
	copy(src[n:], []float32{-math.MaxFloat32, float32(math.Inf(-1)), -1e30, 0, 1})
	const sub = 1.5
	dst := make([]float32, len(src))
	done, sum := expSubVector(dst, src, sub)
	if done != len(src)&^7 {
		t.Fatalf("did %d of %d", done, len(src))
	}
	var want float64
	for i, x := range src[:done] {
		arg := x - sub // rounded to float32, as the lanes do
		w := math.Exp(float64(arg))
		want += float64(dst[i])
		switch {
		case arg < -103:
			if dst[i] != 0 {
				t.Fatalf("e^%g = %g, want 0", arg, dst[i])
			}
		case arg < -87.3:
			if e := math.Abs(float64(dst[i]) - w); e > 1.5e-45 {
				t.Fatalf("e^%g = %g, want %g (a subnormal step)", arg, dst[i], w)
			}
		default:
			if e := relErr(dst[i], w); e > 2.5e-7 {
				t.Fatalf("e^%g = %g, want %g (relative error %.3g)", arg, dst[i], w, e)
			}
		}
	}
	if math.Abs(sum-want) > 1e-12*want {
		t.Errorf("sum %g, want %g", sum, want)
	}
	if dst[done] != 0 || dst[done+1] != 0 {
		t.Errorf("wrote past the last block of 8")
	}
}
