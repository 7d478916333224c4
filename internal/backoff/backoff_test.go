package backoff

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"
)

func TestBase(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		name string
		p    Policy
		want []time.Duration // for attempts 1, 2, ...
	}{
		{"doubles to the ceiling", Policy{First: s, Max: 5 * s}, []time.Duration{s, 2 * s, 4 * s, 5 * s, 5 * s}},
		{"ceiling a power of two away", Policy{First: s, Max: 4 * s}, []time.Duration{s, 2 * s, 4 * s, 4 * s}},
		{"first over the ceiling", Policy{First: 3 * s, Max: 2 * s}, []time.Duration{2 * s, 2 * s}},
		{"zero", Policy{}, []time.Duration{0, 0, 0}},
		{"no first", Policy{Max: time.Minute}, []time.Duration{0, 0}},
		{"negative first", Policy{First: -s, Max: time.Minute}, []time.Duration{0, 0}},
		{"no ceiling", Policy{First: s}, []time.Duration{0, 0}},
		{"near overflow", Policy{First: math.MaxInt64/2 + 1, Max: math.MaxInt64}, []time.Duration{math.MaxInt64/2 + 1, math.MaxInt64, math.MaxInt64}},
		// Jitter takes nothing from Base.
		{"jitter", Policy{First: s, Max: 3 * s, Jitter: Full}, []time.Duration{s, 2 * s, 3 * s}},
	} {
		for i, want := range tc.want {
			if got := tc.p.Base(i + 1); got != want {
				t.Errorf("%s: %+v.Base(%d) = %v, want %v", tc.name, tc.p, i+1, got, want)
			}
		}
	}
	p := Policy{First: time.Millisecond, Max: time.Hour}
	if got := p.Base(0); got != time.Millisecond {
		t.Errorf("Base(0) = %v, want the first wait", got)
	}
	if got := p.Base(math.MaxInt); got != time.Hour {
		t.Errorf("Base(MaxInt) = %v, want the ceiling", got)
	}
}

// Each kind of jitter keeps every wait within its range, and does vary it.
func TestDelay(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		name     string
		jitter   float64
		attempt  int
		min, max time.Duration // min exclusive unless equal to max
	}{
		// The keeper's failed ends: 0.5–1 s, 1–2 s, 2–4 s, 2.5–5 s.
		{"equal, first", Equal, 1, s / 2, s},
		{"equal, second", Equal, 2, s, 2 * s},
		{"equal, third", Equal, 3, 2 * s, 4 * s},
		{"equal, at the ceiling", Equal, 4, 5 * s / 2, 5 * s},
		{"full", Full, 3, 0, 4 * s},
		{"a fifth", 0.2, 3, 4 * s * 8 / 10, 4 * s},
		{"none", None, 3, 4 * s, 4 * s},
		{"over one is full", 3, 3, 0, 4 * s},
		{"negative is none", -1, 2, 2 * s, 2 * s},
		{"NaN is none", math.NaN(), 2, 2 * s, 2 * s},
	} {
		p := Policy{First: s, Max: 5 * s, Jitter: tc.jitter}
		seen := map[time.Duration]bool{}
		for range 1000 {
			d := p.Delay(tc.attempt)
			seen[d] = true
			if d > tc.max || d < tc.min || (d == tc.min && tc.min != tc.max) {
				t.Fatalf("%s: Delay(%d) = %v, want in (%v, %v]", tc.name, tc.attempt, d, tc.min, tc.max)
			}
		}
		if varies := tc.min != tc.max; varies != (len(seen) > 1) {
			t.Errorf("%s: %d distinct waits in 1000; want them to vary: %v", tc.name, len(seen), varies)
		}
	}
}

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if err := Sleep(t.Context(), 3*time.Second); err != nil || time.Since(start) != 3*time.Second {
			t.Fatalf("Sleep(3s) = %v after %v; want nil after 3s", err, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start = time.Now()
		if err := Sleep(ctx, time.Hour); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Second {
			t.Fatalf("Sleep(1h) under a 1s deadline = %v after %v; want the deadline after 1s", err, time.Since(start))
		}
		cancel()
		if err := Sleep(ctx, 0); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Sleep(0) with ctx ended = %v; want ctx's error", err)
		}
		if err := Sleep(t.Context(), -time.Second); err != nil || time.Since(start) != time.Second {
			t.Fatalf("Sleep(-1s) = %v, waited %v; want nil at once", err, time.Since(start)-time.Second)
		}
	})
}
