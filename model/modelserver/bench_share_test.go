package modelserver

import (
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// TestBenchShare runs threeShare many times in synctest's clock, for each
// limiter kind, in two shapes as the subscriber runs its messages
// (runMessages: a batch handed back runs again with the items it had not
// finished, each answer counted as it arrives): single items, 16 callers a
// Model, 30 minutes (TestThreeModelsShareEachLimiterKind's, which draws a
// new item after a backoff); and the real-time benchmark's (subscriber/
// limiters_bench_test.go) two 32-item batches at once a Model, delivered
// sendDelay late, 20 minutes. A 32-item batch costs about 41,000 tokens,
// two thirds of the minute's limit, so most are handed back at least once.
// It reports, over the runs, the 429s after minute 0, how far the farthest
// Model's items are from the mean, and the tokens admitted over the limit:
// a fast stand-in for the real-time benchmark's three-sharing rows, whose
// runs are ten minutes each. VRAMQ_BENCH_SHARE_RUNS sets the runs (10);
// VRAMQ_BENCH_SHARE_KINDS some kinds (bucket,sliding-window,fixed-window,
// azure), all by default; VRAMQ_BENCH_SHARE_SHAPES one shape (single or
// batches), both by default; VRAMQ_BENCH_SHARE_MODELS how many Models
// share the limit (3); VRAMQ_BENCH_SHARE_SCALE a factor on the limits and
// the callers (1), for a limit of more requests at once;
// VRAMQ_BENCH_SHARE_MINUTES each run's minutes (30 and 20), 10 for the
// real-time table's horizon, over which shares wander further from the
// mean.
func TestBenchShare(t *testing.T) {
	if os.Getenv("VRAMQ_BENCH_SHARE") == "" {
		t.Skip("set VRAMQ_BENCH_SHARE=1 to run the sharing benchmark")
	}
	runs := 10
	if n, err := strconv.Atoi(os.Getenv("VRAMQ_BENCH_SHARE_RUNS")); err == nil && n > 0 {
		runs = n
	}
	// The margin a shared mirror keeps is a number of typical requests: a
	// smaller part of a larger limit.
	scale := 1
	if n, err := strconv.Atoi(os.Getenv("VRAMQ_BENCH_SHARE_SCALE")); err == nil && n > 0 {
		scale = n
	}
	models := 3
	if n, err := strconv.Atoi(os.Getenv("VRAMQ_BENCH_SHARE_MODELS")); err == nil && n > 1 {
		models = n
	}
	shapes := []struct {
		name  string
		shape shareShape
	}{
		{"single items", shareShape{minutes: 30, callers: 16 * scale, chunk: 1, messages: true, models: models}},
		{"32-item batches", shareShape{minutes: 20, callers: 2 * scale, chunk: 32, delay: sendDelay, messages: true, models: models}},
	}
	if n, err := strconv.Atoi(os.Getenv("VRAMQ_BENCH_SHARE_MINUTES")); err == nil && n > 1 {
		for i := range shapes {
			shapes[i].shape.minutes = n
		}
	}
	for i, sh := range shapes {
		if k := os.Getenv("VRAMQ_BENCH_SHARE_SHAPES"); k != "" && !slices.Contains(strings.Split(k, ","), []string{"single", "batches"}[i]) {
			continue
		}
		for _, kind := range []fakeoai.LimitKind{fakeoai.LimitBucket, fakeoai.LimitSlidingWindow, fakeoai.LimitFixedWindow, fakeoai.LimitAzure} {
			if k := os.Getenv("VRAMQ_BENCH_SHARE_KINDS"); k != "" && !slices.Contains(strings.Split(k, ","), string(kind)) {
				continue
			}
			var limited, apart, admitted []float64
			for range runs {
				var r shareResult
				t.Run(string(kind), func(t *testing.T) {
					r = threeShare(t, fakeoai.RateLimits{TPM: 60000 * scale, RPM: 600 * scale, Kind: kind}, sh.shape)
				})
				mean := meanItems(r.ok)
				far := 0.0
				for _, n := range r.ok {
					far = math.Max(far, math.Abs(float64(n)/mean-1))
				}
				limited = append(limited, float64(r.limited)/float64(max(1, r.answers)))
				apart = append(apart, far)
				admitted = append(admitted, r.admitted)
			}
			slices.Sort(limited)
			slices.Sort(apart)
			slices.Sort(admitted)
			over := 0
			for _, a := range apart {
				if a > 0.2 {
					over++
				}
			}
			t.Logf("%-15s %-14s %d runs: 429s after minute 0 median %.2f%% (most %.2f%%); farthest share from the mean median %.1f%% (most %.1f%%, over 20%% in %d); admitted %.3f–%.3f (median %.3f)",
				sh.name, kind, runs, 100*limited[runs/2], 100*limited[runs-1], 100*apart[runs/2], 100*apart[runs-1], over,
				admitted[0], admitted[runs-1], admitted[runs/2])
		}
	}
}
