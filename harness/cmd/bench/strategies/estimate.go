package strategies

import (
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// EstimateError is how wrong the model's estimates are made in a run: the
// subscriber admits by the estimate, the simulated device allocates the true
// cost. The zero value is exact.
type EstimateError struct {
	// Kind is "" (exact), "uniform" (each message's estimate off by a
	// factor drawn from [1-Frac, 1+Frac]) or "bias" (every estimate times
	// 1+Frac).
	Kind string
	Frac float64
}

// ParseEstimateError reads -estimate-error: "", "none", "uniform:F" with
// 0 <= F < 1, or "bias:F" with -1 < F (a sign is allowed: bias:+0.3).
func ParseEstimateError(s string) (EstimateError, error) {
	if s == "" || s == "none" {
		return EstimateError{}, nil
	}
	kind, num, ok := strings.Cut(s, ":")
	f, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return EstimateError{}, fmt.Errorf("-estimate-error %q: want uniform:F or bias:F", s)
	}
	switch {
	case kind == "uniform" && f >= 0 && f < 1:
	case kind == "bias" && f > -1:
	default:
		return EstimateError{}, fmt.Errorf("-estimate-error %q: want uniform:F with 0 <= F < 1 or bias:F with F > -1", s)
	}
	return EstimateError{Kind: kind, Frac: f}, nil
}

func (e EstimateError) String() string {
	switch e.Kind {
	case "uniform":
		return fmt.Sprintf("uniform:%g", e.Frac)
	case "bias":
		return fmt.Sprintf("bias:%+g", e.Frac)
	}
	return "none"
}

// factor is what the estimate of items is multiplied by. Under uniform it is
// drawn from a hash of the items, so a message redelivered, or estimated
// twice, gets the same wrong estimate, as from a real cost model.
func (e EstimateError) factor(items []job.Item) float64 {
	switch e.Kind {
	case "bias":
		return 1 + e.Frac
	case "uniform":
		h := fnv.New64a()
		for _, it := range items {
			h.Write([]byte(it.ID))
			h.Write([]byte{0})
			h.Write([]byte(it.Text))
			h.Write([]byte{0})
		}
		u := float64(h.Sum64()>>11) / (1 << 53) // [0, 1)
		return 1 + e.Frac*(2*u-1)
	}
	return 1
}

// misestimated is a timed.Model whose Cost, the estimate the subscriber
// admits by, is off by err; the model's batches still allocate the true cost
// (timed.Model's Run calls its own Cost). Every other method, Launch
// included, is the timed.Model's, so the subscriber treats it as it treats
// the model.
type misestimated struct {
	*timed.Model
	err EstimateError
}

// Cost is the true cost times the error's factor, at least 1 byte.
func (m misestimated) Cost(items []job.Item) int64 {
	c := m.Model.Cost(items)
	return max(1, int64(math.Round(float64(c)*m.err.factor(items))))
}

// model wraps tm with e: tm itself when e is exact.
func (e EstimateError) model(tm *timed.Model) gpu.Model {
	if e.Kind == "" {
		return tm
	}
	return misestimated{tm, e}
}
