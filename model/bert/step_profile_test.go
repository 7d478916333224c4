package bert

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The profile adds each step's time, the wait for the device included, to
// its kind, in the forward pass's order; off, it neither waits nor counts.
func TestStepProfileAddsTimeByKind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sleep := func(d time.Duration) func() error { return func() error { time.Sleep(d); return nil } }
		steps := []step{{stepGELU, sleep(time.Millisecond)}, {stepQKVGemm, sleep(3 * time.Millisecond)},
			{stepGELU, sleep(time.Millisecond)}}
		waits := 0
		wait := func() error { waits++; time.Sleep(time.Millisecond); return nil }
		var p stepProfile
		if err := p.run(steps, wait); err != nil {
			t.Fatal(err)
		}
		if waits != 0 || len(p.counts()) != 0 {
			t.Errorf("off: waited %d times, counted %v; want neither", waits, p.counts())
		}
		p.reset(true)
		if err := p.run(steps, wait); err != nil {
			t.Fatal(err)
		}
		if want := map[string]int{"qkv gemm": 1, "gelu": 2}; !cmp.Equal(p.counts(), want) {
			t.Errorf("counts %v, want %v", p.counts(), want)
		}
		if got, want := p.String(), "total 8ms: qkv gemm 4ms (50.0%, 1), gelu 4ms (50.0%, 2)"; got != want {
			t.Errorf("breakdown %q, want %q", got, want)
		}
		boom := errors.New("boom")
		if err := p.run([]step{{stepPool, func() error { return boom }}}, wait); !errors.Is(err, boom) {
			t.Errorf("a failing step: %v, want its error", err)
		}
		if err := p.run([]step{{stepPool, sleep(0)}}, func() error { return boom }); !errors.Is(err, boom) {
			t.Errorf("a failing wait: %v, want its error", err)
		}
		p.reset(false)
		if p.String() != "total 0s: " || len(p.counts()) != 0 {
			t.Errorf("after reset: %q, %v", p.String(), p.counts())
		}
	})
}
