package strategies

import (
	"context"
	"math"
	"testing"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/model/refembed"
)

func TestParseEstimateError(t *testing.T) {
	for _, c := range []struct {
		in   string
		want EstimateError
	}{
		{"", EstimateError{}}, {"none", EstimateError{}},
		{"uniform:0.3", EstimateError{"uniform", 0.3}},
		{"bias:+0.3", EstimateError{"bias", 0.3}},
		{"bias:-0.3", EstimateError{"bias", -0.3}},
	} {
		got, err := ParseEstimateError(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseEstimateError(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"uniform", "uniform:1", "uniform:-0.1", "bias:-1", "bias:x", "gauss:0.3", "bias:NaN"} {
		if _, err := ParseEstimateError(bad); err == nil {
			t.Errorf("parseEstimateError(%q) accepted", bad)
		}
	}
}

// TestMisestimatedCostOnly checks that the error reaches the estimate and
// not the device: the subscriber sees the estimate off by the error, the
// simulated device is asked for the true cost (a batch of the true cost fits
// a device of exactly that size, whatever the estimate says), the uniform
// error is within its bounds, spread over them, and the same for the same
// message.
func TestMisestimatedCostOnly(t *testing.T) {
	works := workload.Mixed("e", 400).Works()
	ecfg := refembed.DefaultConfig()
	probe, err := timed.New(ecfg, timed.DefaultTiming(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []EstimateError{{"bias", 0.3}, {"bias", -0.3}} {
		m := e.model(probe)
		for _, w := range works[:5] {
			truth := probe.Cost(w.Items)
			want := int64(math.Round(float64(truth) * (1 + e.Frac)))
			if got := m.Cost(w.Items); got != want {
				t.Errorf("%v: estimate %d, want %d (true cost %d)", e, got, want, truth)
			}
		}
	}
	u := EstimateError{"uniform", 0.3}
	m := u.model(probe)
	var lo, hi float64 = 2, 0
	for _, w := range works {
		f := float64(m.Cost(w.Items)) / float64(probe.Cost(w.Items))
		if f < 0.7-1e-6 || f > 1.3+1e-6 {
			t.Fatalf("uniform:0.3 put an estimate at %.3f of the true cost", f)
		}
		lo, hi = min(lo, f), max(hi, f)
		if again := m.Cost(w.Items); again != m.Cost(w.Items) {
			t.Fatal("the same message got two estimates")
		}
	}
	if lo > 0.75 || hi < 1.25 {
		t.Errorf("uniform:0.3 over %d messages spanned [%.3f, %.3f]; want most of [0.7, 1.3]", len(works), lo, hi)
	}
	if (EstimateError{}).model(probe) != gpu.Model(probe) {
		t.Error("an exact estimate wrapped the model")
	}

	// The device gets the true cost: a device of exactly the true cost
	// runs the batch under an estimate 30% low, and refuses nothing.
	w := works[0]
	truth := probe.Cost(w.Items)
	dev := gpu.NewSim(ecfg.WeightBytes() + truth)
	tm, err := timed.New(ecfg, timed.Timing{Launch: 1, Throughput: 1 << 40}, dev)
	if err != nil {
		t.Fatal(err)
	}
	defer tm.Close()
	low := EstimateError{"bias", -0.3}.model(tm)
	if _, err := low.Run(context.Background(), w.Items); err != nil {
		t.Fatalf("a batch of the true cost on a device of that size: %v", err)
	}
	if got := dev.Peak() - ecfg.WeightBytes(); got != truth {
		t.Errorf("the device allocated %d for the batch; want its true cost %d", got, truth)
	}
}
