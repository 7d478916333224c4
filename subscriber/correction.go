package subscriber

import (
	"log/slog"
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// The correction's steps. A raise of a quarter reaches the 1.43 that undoes
// a 30% under-estimate in two out-of-memory errors (1.25, then 1.56; in the
// benchmark's −30% runs one was enough, bench/README.md); a
// decay of 5% every 100 clean batches takes a raise back over about 500
// batches, so an estimate that stays low costs one out-of-memory error in
// several hundred batches, and one that was low for a while is trusted
// again within a few thousand.
const (
	correctionRaise    = 1.25
	correctionDecay    = 1.05
	correctionCleanRun = 100
)

// correction is what the subscriber learns from running out of memory
// under vram admission about the model's estimates: a factor, at least 1,
// that each message's estimate is multiplied by before admission weighs it.
// Every batch that admission let in fitted the budget by its estimates, so
// an out-of-memory error says the estimates were low (or that another
// process took memory, which the budget's refresh then shows too); the
// factor rises, up to max, and decays back towards 1 after runs of clean
// batches, so exact estimates end up weighed as they are.
//
// It never lowers an estimate (the factor is at least 1) and never makes a
// message that fits the largest budget unable to run: a corrected cost
// above that budget is clamped to it, so the message runs with the device
// to itself instead of being dead-lettered as too large; fits, and so the
// too_large check, still weighs the model's own estimate.
type correction struct {
	max   float64 // 1 turns the correction off
	log   *slog.Logger
	gauge prometheus.Gauge

	mu     sync.Mutex
	factor float64
	clean  int // batches that ran in a row since the last out-of-memory or decay
}

func newCorrection(max float64, log *slog.Logger, gauge prometheus.Gauge) *correction {
	c := &correction{max: math.Max(max, 1), log: log, gauge: gauge, factor: 1}
	gauge.Set(1)
	return c
}

// apply returns the cost admission weighs for a message the model estimates
// at raw, with the factor it used: raw times the factor, but no more than
// largest (the largest budget) unless raw itself is, and never below raw.
func (c *correction) apply(raw, largest int64) (cost int64, factor float64) {
	c.mu.Lock()
	factor = c.factor
	c.mu.Unlock()
	if factor <= 1 || raw <= 0 {
		return raw, factor
	}
	corrected := float64(raw) * factor
	if corrected >= float64(largest) {
		return max(raw, largest), factor
	}
	return max(raw, int64(math.Ceil(corrected))), factor
}

// outOfMemory records a batch that ran out of memory, admitted with factor
// (the largest of its messages'), once all its messages have run in smaller
// batches or alone (runBatch). Only a batch admitted with the factor now
// raises it: the others were weighed before the last raise, and the errors
// of batches running at the same time, or of a batch's halves, are one
// lesson, not several.
func (c *correction) outOfMemory(factor float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clean = 0
	if factor < c.factor || c.factor >= c.max {
		return
	}
	from := c.factor
	c.factor = math.Min(c.factor*correctionRaise, c.max)
	c.gauge.Set(c.factor)
	c.log.Info("estimate correction raised after out of memory", "from", round2(from), "to", round2(c.factor), "max", c.max)
}

// ran records a batch that ran without running out of memory.
func (c *correction) ran() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.factor <= 1 {
		return
	}
	c.clean++
	if c.clean < correctionCleanRun {
		return
	}
	c.clean = 0
	from := c.factor
	c.factor = math.Max(c.factor/correctionDecay, 1)
	c.gauge.Set(c.factor)
	c.log.Info("estimate correction decayed after clean batches", "from", round2(from), "to", round2(c.factor),
		"clean_batches", correctionCleanRun)
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// batchFactor is the largest factor among tasks' admissions.
func batchFactor(tasks []*task) float64 {
	f := 0.0
	for _, t := range tasks {
		f = max(f, t.factor)
	}
	return f
}
