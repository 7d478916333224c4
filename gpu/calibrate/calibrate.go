// Package calibrate measures a model's cost model on a device. A model's
// analytic cost model counts the bytes of the buffers a forward pass asks
// for. A GPU takes more: its driver rounds allocations up to a granularity,
// a GEMM library takes workspace. So on a real device the estimate is a cost
// model measured there: Calibrate runs a sweep of batches on a Meter, fits
// bytes = PerToken×tokens + PerItem×items + PerBatch to what each batch
// really held, and raises PerBatch until no batch is under-estimated;
// SaveCostModel writes the result, and LoadCostModel gives it to a
// gpu.CostModelSetter, refusing one fitted for another model or device
// (`subscriber -calibrate` and `-cost-model`).
package calibrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/job"
)

// A Meter is a model that can say how much device memory one batch really
// took. Calibrate measures through it. Any model can be one: what the sweep
// needs of the model is the longest item it reads and how it counts tokens.
type Meter interface {
	gpu.Model
	// MaxTokens is the most tokens the model reads from one item. The
	// sweep makes items of 1 to MaxTokens words.
	MaxTokens() int
	// CountTokens is how many tokens the model reads from text, as its
	// Cost counts them; the fit is over these counts.
	CountTokens(text string) int
	// Measure runs items as one batch, as Run would, and returns the most
	// device memory the batch held at once, as the device counts it, in
	// bytes. For a real GPU that is the drop in the driver's free memory
	// (cuMemGetInfo) from just before the batch allocates to where it holds
	// the most (after its last allocation and the library calls that take
	// workspace, before its first free): allocator rounding and workspace
	// included, memory held before the batch began not. Calibrate runs
	// batches one at a time with nothing else on the device, so the drop is
	// the batch's own. An out-of-memory error wraps gpu.ErrOutOfMemory, as
	// Run's does; the outputs are discarded.
	Measure(ctx context.Context, items []job.Item) (peak int64, err error)
}

// Sweep is the set of batches Calibrate measures: for every item count from
// 1 to MaxItems (all of 1 to 16, then about 25% apart, MaxItems included),
// batches whose token totals spread from 1 token per item to MaxTokens per
// item, both ends included, each total split at random among the items so
// that lengths are mixed. The batches are the same for the same Sweep and
// model configuration.
type Sweep struct {
	// MaxItems is the most items in one batch. It should be the largest
	// batch the subscriber runs (-max-batch messages of up to the
	// publisher's -chunk-items each): the fitted model is checked against
	// batches of this range only.
	MaxItems int
	// Points is how many token totals are measured for MaxItems items;
	// smaller item counts get proportionally fewer (at least 4), so that
	// totals are about as far apart for every count. More points make the
	// margin (see Calibration) smaller and the sweep longer.
	Points int
	// Seed picks the random splits and words.
	Seed uint64
}

// DefaultSweep covers batches of up to maxItems items with 64 points at the
// largest count, seed 1.
func DefaultSweep(maxItems int) Sweep { return Sweep{MaxItems: maxItems, Points: 64, Seed: 1} }

// minPoints is the fewest token totals measured for an item count.
const minPoints = 4

// Validate reports a Sweep that cannot run.
func (s Sweep) Validate() error {
	var errs []error
	if s.MaxItems < 1 {
		errs = append(errs, fmt.Errorf("sweep: max items %d: want at least 1", s.MaxItems))
	}
	if s.Points < 2 {
		errs = append(errs, fmt.Errorf("sweep: points %d: want at least 2 (both ends of the token range)", s.Points))
	}
	return errors.Join(errs...)
}

// itemCounts is every count from 1 to 16, then counts about 25% apart up to
// maxItems, which is always included: where one more item matters most
// relative to the batch, every count is measured.
func itemCounts(maxItems int) []int {
	var ns []int
	for n := 1; n < maxItems; {
		ns = append(ns, n)
		if n < 16 {
			n++
		} else {
			n = max(n+1, n*5/4)
		}
	}
	return append(ns, maxItems)
}

// tokenTotals is the token totals measured for n items of at most maxTokens
// tokens each: points totals from n to n×maxTokens, both ends included,
// one drawn at random from each of the equal strata between (so that
// regular steps in the allocator cannot alias with a regular grid), or
// every total when there are no more than points of them.
func tokenTotals(r *rand.Rand, n, maxTokens, points int) []int {
	lo, hi := n, n*maxTokens
	if hi-lo+1 <= points {
		ts := make([]int, 0, hi-lo+1)
		for t := lo; t <= hi; t++ {
			ts = append(ts, t)
		}
		return ts
	}
	ts := []int{lo}
	for j := 1; j < points-1; j++ {
		a := lo + j*(hi-lo)/(points-1)
		b := lo + (j+1)*(hi-lo)/(points-1)
		ts = append(ts, a+r.IntN(b-a))
	}
	return append(ts, hi)
}

// splitTokens splits total tokens among n items of 1 to maxTokens each, in
// proportions drawn at random (exponentially, so that some items are much
// longer than others, as in real traffic).
func splitTokens(r *rand.Rand, total, n, maxTokens int) []int {
	k := make([]int, n)
	w := make([]float64, n)
	var sum float64
	for i := range w {
		w[i] = r.ExpFloat64()
		sum += w[i]
	}
	extra, left := total-n, total-n
	for i := range k {
		add := min(maxTokens-1, int(float64(extra)*w[i]/sum))
		k[i] = 1 + add
		left -= add
	}
	// What rounding and the cap left over goes to items with room, from a
	// random one on; the items can hold n×maxTokens, so one round does it.
	for i := r.IntN(n); left > 0; i = (i + 1) % n {
		add := min(maxTokens-k[i], left)
		k[i] += add
		left -= add
	}
	return k
}

// Batches is the sweep's batches for a model that reads up to maxTokens
// tokens of an item, in the order Calibrate measures them: item counts
// ascending, token totals ascending.
func (s Sweep) Batches(maxTokens int) [][]job.Item {
	r := rand.New(rand.NewPCG(s.Seed, 0x76_72_61_6d_71)) // "vramq"
	var batches [][]job.Item
	for _, n := range itemCounts(s.MaxItems) {
		points := max(minPoints, (s.Points*n+s.MaxItems-1)/s.MaxItems)
		for _, t := range tokenTotals(r, n, maxTokens, points) {
			items := make([]job.Item, n)
			for i, k := range splitTokens(r, t, n, maxTokens) {
				items[i] = job.Item{ID: strconv.Itoa(i), Text: sweepText(r, k)}
			}
			batches = append(batches, items)
		}
	}
	return batches
}

// sweepText is a text of exactly k words (k tokens for the reference tokenizer,
// which splits on anything but letters and digits), each drawn at random so
// that the token ids vary as real text's do.
func sweepText(r *rand.Rand, k int) string {
	var b strings.Builder
	b.Grow(k * 6)
	for i := range k {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte('w')
		b.WriteString(strconv.FormatUint(r.Uint64N(1<<20), 36))
	}
	return b.String()
}

// Sample is one measured batch.
type Sample struct {
	Items  int   `json:"items"`
	Tokens int64 `json:"tokens"`
	// SeqLen is the length a padded batch (see ShapeMeter) ran at: Items
	// items of SeqLen tokens each. 0 for a model that does not pad.
	SeqLen int `json:"seq_len,omitempty"`
	// Scores is the attention scores a padded batch holds, Items × heads ×
	// SeqLen². 0 for a model that does not pad.
	Scores int64 `json:"scores,omitempty"`
	// Bytes is the most device memory the batch held at once.
	Bytes int64 `json:"bytes"`
}

// shape is the batch's size, as a reader would name it.
func (s Sample) shape() string {
	if s.SeqLen > 0 {
		return fmt.Sprintf("batch of %d items × %d tokens", s.Items, s.SeqLen)
	}
	return fmt.Sprintf("batch of %d items, %d tokens", s.Items, s.Tokens)
}

func (s Sample) String() string { return s.shape() + ", " + exactBytes(s.Bytes) }

// Miss is an estimate's largest error over the samples, and the sample where
// it is.
type Miss struct {
	Bytes  int64 // estimate − measured for an over-estimate, measured − estimate for an under-estimate; 0: none
	Sample Sample
}

// Percent is Bytes as a percentage of what the sample measured.
func (m Miss) Percent() float64 {
	if m.Sample.Bytes == 0 {
		if m.Bytes == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return 100 * float64(m.Bytes) / float64(m.Sample.Bytes)
}

func (m Miss) String() string {
	if m.Bytes == 0 {
		return "none"
	}
	return fmt.Sprintf("%s (%.1f%%) on a %s (measured %s)",
		exactBytes(m.Bytes), m.Percent(), m.Sample.shape(), exactBytes(m.Sample.Bytes))
}

// Calibration is a fitted cost model and how it was fitted.
type Calibration struct {
	Model, Device string
	// Sweep is the sweep measured (zero when fitted by Fit alone), and
	// MaxTokens the model's context it ran with (for a padded model, its
	// longest sequence).
	Sweep     Sweep
	MaxTokens int
	// Heads is a padded model's attention heads (CalibrateShapes,
	// FitPadded): the cost model is then one of padded shapes
	// (gpu.CostModel.Padded). 0 for the others.
	Heads   int
	Samples []Sample
	// Raw is the least-squares fit, coefficients non-negative and rounded
	// to whole bytes.
	Raw gpu.CostModel
	// WorstUnderRaw is Raw's largest under-estimate of a sample.
	WorstUnderRaw Miss
	// Margin is what PerBatch gets on top of covering every sample, for
	// batches between samples, as the calibration measured it (see
	// measuredMargin): the most a fit covering half the samples
	// under-estimated the other half, and at least the unit the device
	// counts memory in; or MonotoneBound where that is smaller. It is 0
	// when every sample lies exactly on Raw, as an allocator that adds
	// nothing to the buffers' sizes gives, since then so do the batches in
	// between.
	Margin int64
	// MonotoneBound is the margin that would cover every batch of the
	// sweep's range if all that were known of memory is that it never
	// decreases as a batch gains tokens (or length) or items: the most any
	// batch between samples could then be under-estimated. It was the
	// margin before, and is reported beside it: it takes the gap between
	// neighbouring samples of the largest batches (tens of MiB for BERT-base
	// on a GPU) and, being a per-batch constant, charged it to a 3-token
	// text as to a batch of 64 × 512.
	MonotoneBound int64
	// Cost is the fitted model: Raw with PerBatch raised by WorstUnderRaw
	// and Margin. No sample is under-estimated by it.
	Cost gpu.CostModel
	// WorstOver is Cost's largest over-estimate of a sample.
	WorstOver Miss
	FittedAt  time.Time
	// Took is how long the sweep took.
	Took time.Duration
}

// Calibrate measures the sweep's batches one at a time on m, which must have
// the device to itself, and fits a cost model to them (see Fit). device
// names the kind of device, as gpu.Kind gives it; LoadCostModel refuses the model on
// another. A batch that runs out of memory ends the sweep with an error
// naming its size: calibrate with fewer items, or on a device with room.
//
// A first batch is run and not counted, so that one-time setup a backend
// does on its first batch (loading kernels, a library's lazily allocated
// handle) is not taken for memory every batch needs.
func Calibrate(ctx context.Context, m Meter, device string, s Sweep) (*Calibration, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	maxTokens := m.MaxTokens()
	if maxTokens < 1 {
		return nil, fmt.Errorf("calibrate %s: the model reads at most %d tokens of an item; want at least 1", m.Name(), maxTokens)
	}
	start := time.Now()
	batches := s.Batches(maxTokens)
	if _, err := m.Measure(ctx, batches[0]); err != nil {
		return nil, fmt.Errorf("calibrate %s: first batch: %w", m.Name(), err)
	}
	samples := make([]Sample, 0, len(batches))
	for _, items := range batches {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var tokens int64
		for _, it := range items {
			tokens += int64(m.CountTokens(it.Text))
		}
		peak, err := m.Measure(ctx, items)
		if err != nil {
			return nil, fmt.Errorf("calibrate %s: batch of %d items, %d tokens: %w", m.Name(), len(items), tokens, err)
		}
		samples = append(samples, Sample{Items: len(items), Tokens: tokens, Bytes: peak})
	}
	c, err := Fit(samples)
	if err != nil {
		return nil, fmt.Errorf("calibrate %s: %w", m.Name(), err)
	}
	c.Model, c.Device, c.Sweep, c.MaxTokens = m.Name(), device, s, maxTokens
	c.Took = time.Since(start)
	return c, nil
}

// Fit fits bytes = PerToken×tokens + PerItem×items + PerBatch to samples:
// least squares with every coefficient non-negative (Raw), then PerBatch
// raised so that no sample is under-estimated, then by the measured margin
// for batches between samples (see Calibration.Margin). The samples should
// include the corners of the range to be covered: the fewest and most items,
// each with the fewest and most tokens, as a Sweep's do.
func Fit(samples []Sample) (*Calibration, error) {
	if len(samples) == 0 {
		return nil, errors.New("fit: no samples")
	}
	for _, s := range samples {
		if s.Items < 1 || s.Tokens < int64(s.Items) || s.Bytes < 0 || s.SeqLen != 0 || s.Scores != 0 {
			return nil, fmt.Errorf("fit: %v: want at least 1 item, a token per item, no negative bytes and no padded shape "+
				"(FitPadded fits those)", s)
		}
	}
	return fit(samples, form{})
}

// fit is Fit and FitPadded once the samples are checked.
func fit(samples []Sample, f form) (*Calibration, error) {
	raw := leastSquares(samples)
	c := &Calibration{Samples: samples, Raw: raw, Heads: f.heads, FittedAt: time.Now().UTC()}

	exact := true
	for _, s := range samples {
		under := s.Bytes - estimate(raw, s)
		exact = exact && under == 0
		if under > c.WorstUnderRaw.Bytes {
			c.WorstUnderRaw = Miss{Bytes: under, Sample: s}
		}
	}
	covered := raw
	covered.PerBatch += c.WorstUnderRaw.Bytes
	if !exact {
		// The bound from monotonicity covers every batch of the range, so
		// where it is the smaller (dense samples, a fine granule) it is
		// enough.
		c.MonotoneBound = f.coverageMargin(samples, covered)
		c.Margin = min(measuredMargin(samples), c.MonotoneBound)
	}
	c.Cost = covered
	c.Cost.PerBatch += c.Margin
	for _, s := range samples {
		if over := estimate(c.Cost, s) - s.Bytes; over > c.WorstOver.Bytes {
			c.WorstOver = Miss{Bytes: over, Sample: s}
		}
	}
	return c, nil
}

// measuredMargin is how far past the covered fit a batch the fit did not
// see went, as the samples show it: the samples are split in two
// interleaved halves (every other sample of the sweep's order, so each half
// spans the whole range at half the density), each half is fitted and
// covered as fit does, and the margin is the worst under-estimate of the
// other half's samples, whichever half was fitted. A half's samples lie
// twice as far apart as the full sweep's, so what it misses errs large. It is at
// least the unit the device counts memory in (the greatest common divisor
// of the measurements: a GPU driver's 2 MiB granule), since a batch
// between samples can round up one unit further than any sample did.
//
// It is a measurement, not a bound: a device whose memory jumped between
// samples by more than the samples show anywhere else would exceed it. The
// subscriber's out-of-memory split is the backstop for that; the bound
// from monotonicity alone (Calibration.MonotoneBound) charged every message
// tens of MiB against it.
func measuredMargin(samples []Sample) int64 {
	var unit int64
	for _, s := range samples {
		unit = gcd(unit, s.Bytes)
	}
	margin := unit
	if len(samples) < 2 {
		return margin
	}
	for fold := range 2 {
		var fitted, held []Sample
		for i, s := range samples {
			if i%2 == fold {
				fitted = append(fitted, s)
			} else {
				held = append(held, s)
			}
		}
		m := leastSquares(fitted)
		var under int64
		for _, s := range fitted {
			under = max(under, s.Bytes-estimate(m, s))
		}
		m.PerBatch += under
		for _, s := range held {
			margin = max(margin, s.Bytes-estimate(m, s))
		}
	}
	return margin
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// estimate is what m says s's batch takes: linear in its tokens, items and
// attention scores (for a padded batch, gpu.CostModel.Padded).
func estimate(m gpu.CostModel, s Sample) int64 {
	if s.Items == 0 {
		return 0
	}
	return s.Tokens*m.PerToken + int64(s.Items)*m.PerItem + s.Scores*m.PerScore + m.PerBatch
}

// features is how many coefficients the fit has: per token, per item, per
// attention score, per batch, in that order.
const features = 4

// subsets is every subset of the features, larger ones first and, among
// those of one size, in lexicographic order: the order leastSquares tries
// them in.
var subsets = func() [][]int {
	var all [][]int
	for mask := range 1 << features {
		var sub []int
		for i := range features {
			if mask&(1<<i) != 0 {
				sub = append(sub, i)
			}
		}
		all = append(all, sub)
	}
	slices.SortStableFunc(all, func(a, b []int) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return slices.Compare(a, b)
	})
	return all
}()

// leastSquares fits the samples with non-negative coefficients: the
// unconstrained least squares of every subset of the coefficients (the
// others held at 0), the feasible one of least squared error. With four
// unknowns that is exact and cheap. A feature no sample has (attention
// scores, for a model without attention) makes every subset with it
// singular, so it gets 0. Ties, as when every batch has one item and items
// cannot be told from batches, go to the first subset in the order tried,
// which charges per item rather than per batch: per item is the larger
// charge for the batches of several items the samples did not show.
func leastSquares(samples []Sample) gpu.CostModel {
	// Columns scaled to at most 1, so the normal equations are well
	// conditioned whatever the units.
	var scale [features]float64
	var maxY float64
	raw := func(s Sample) [features]float64 {
		return [features]float64{float64(s.Tokens), float64(s.Items), float64(s.Scores), 1}
	}
	for _, s := range samples {
		xs := raw(s)
		for i := range features {
			scale[i] = max(scale[i], xs[i])
		}
		maxY = max(maxY, float64(s.Bytes))
	}
	if maxY == 0 {
		return gpu.CostModel{}
	}
	for i := range scale {
		if scale[i] == 0 {
			scale[i] = 1 // a column of zeros: singular in any subset with it
		}
	}
	x := func(s Sample) [features]float64 {
		xs := raw(s)
		for i := range xs {
			xs[i] /= scale[i]
		}
		return xs
	}
	var ata [features][features]float64
	var aty [features]float64
	for _, s := range samples {
		xs, y := x(s), float64(s.Bytes)/maxY
		for i := range features {
			aty[i] += xs[i] * y
			for j := range features {
				ata[i][j] += xs[i] * xs[j]
			}
		}
	}
	var best [features]float64
	bestSSE := math.Inf(1)
	for _, sub := range subsets {
		beta, ok := solve(ata, aty, sub)
		if !ok {
			continue
		}
		var sse float64
		for _, s := range samples {
			xs := x(s)
			d := float64(s.Bytes) / maxY
			for i := range features {
				d -= beta[i] * xs[i]
			}
			sse += d * d
		}
		// Better only by more than rounding: a tie keeps the earlier.
		if sse < bestSSE-1e-12*max(1, bestSSE) || math.IsInf(bestSSE, 1) {
			best, bestSSE = beta, sse
		}
	}
	coef := func(i int) int64 { return max(0, int64(math.Round(best[i]*maxY/scale[i]))) }
	return gpu.CostModel{PerToken: coef(0), PerItem: coef(1), PerScore: coef(2), PerBatch: coef(3)}
}

// solve solves the normal equations restricted to the coefficients in sub
// (the rest 0) by Gaussian elimination with partial pivoting. ok is false
// when they are singular (columns that cannot be told apart) or a
// coefficient comes out negative.
func solve(ata [features][features]float64, aty [features]float64, sub []int) (beta [features]float64, ok bool) {
	k := len(sub)
	var m [features][features + 1]float64
	for i, si := range sub {
		for j, sj := range sub {
			m[i][j] = ata[si][sj]
		}
		m[i][k] = aty[si]
	}
	var scale float64
	for i := range k {
		scale = max(scale, math.Abs(m[i][i]))
	}
	for col := range k {
		p := col
		for r := col + 1; r < k; r++ {
			if math.Abs(m[r][col]) > math.Abs(m[p][col]) {
				p = r
			}
		}
		if math.Abs(m[p][col]) <= 1e-10*scale {
			return beta, false
		}
		m[col], m[p] = m[p], m[col]
		for r := range k {
			if r == col {
				continue
			}
			f := m[r][col] / m[col][col]
			for c := col; c <= k; c++ {
				m[r][c] -= f * m[col][c]
			}
		}
	}
	for i, si := range sub {
		b := m[i][k] / m[i][i]
		if b < -1e-9 {
			return beta, false
		}
		beta[si] = max(b, 0)
	}
	return beta, true
}

// form is how a fit's batches are described: by tokens and items (heads
// 0), or as padded shapes of items × seqLen of a model with heads attention
// heads (FitPadded).
type form struct{ heads int }

// coords are a sample's coordinates for the coverage margin: y its items,
// x its tokens, or for a padded batch its length. Memory never decreases as
// either grows (for a padded batch every buffer, attention scores
// included, grows with items and with length).
func (f form) coords(s Sample) (x, y int64) {
	if f.heads > 0 {
		return int64(s.SeqLen), int64(s.Items)
	}
	return s.Tokens, int64(s.Items)
}

// at is est at coordinates (x, y).
func (f form) at(est gpu.CostModel, x, y int64) int64 {
	if f.heads > 0 {
		return est.Padded(y, x, int64(f.heads))
	}
	return est.Bytes(x, y)
}

// minX is the least x a batch of y items has: a token per item, or a
// padded length of 1.
func (f form) minX(y int64) int64 {
	if f.heads > 0 {
		return 1
	}
	return y
}

// coverageMargin is the most that a batch of the samples' range, between
// samples, could be under-estimated by est, if memory never decreases as a
// batch gains tokens (or length) or items. A batch (x, n) then needs no
// more than the least any sample of at least x and n items measured, so its
// under-estimate is at most that least measurement less est(x, n). That
// bound only rises where x or n just passes a sample's, so it is enough to
// take its largest value over n in {1} ∪ {sample items + 1} and x in
// {minX(n)} ∪ {sample x + 1}; a batch no sample dominates is outside the
// range. The coefficients of est are non-negative, so est grows with x and
// n too, which the argument needs.
func (f form) coverageMargin(samples []Sample, est gpu.CostModel) int64 {
	type point struct{ x, y, bytes int64 }
	byX := make([]point, len(samples))
	for i, s := range samples {
		x, y := f.coords(s)
		byX[i] = point{x, y, s.Bytes}
	}
	slices.SortFunc(byX, func(a, b point) int { return -compareInt64(a.x, b.x) })
	itemSet := map[int64]bool{1: true}
	for _, p := range byX {
		itemSet[p.y+1] = true
	}
	var margin int64
	for n := range itemSet {
		// Candidates, descending, with the least measurement of the
		// samples dominating each: one pass down the sorted samples.
		least := int64(math.MaxInt64)
		i := 0
		check := func(x int64) {
			for ; i < len(byX) && byX[i].x >= x; i++ {
				if byX[i].y >= n {
					least = min(least, byX[i].bytes)
				}
			}
			if least != math.MaxInt64 {
				margin = max(margin, least-f.at(est, x, n))
			}
		}
		xs := []int64{f.minX(n)}
		for _, p := range byX {
			if p.x+1 > f.minX(n) {
				xs = append(xs, p.x+1)
			}
		}
		slices.SortFunc(xs, func(a, b int64) int { return -compareInt64(a, b) })
		for _, x := range slices.Compact(xs) {
			check(x)
		}
	}
	return margin
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// exactBytes formats n for a reader and exactly: "2.0MiB (2097152 B)".
func exactBytes(n int64) string {
	if n > -1024 && n < 1024 {
		return bytesize.Format(n)
	}
	return fmt.Sprintf("%s (%d B)", bytesize.Format(n), n)
}

func formatModel(m gpu.CostModel, padded bool) string {
	s := fmt.Sprintf("%d B/token + %d B/item + %d B/batch", m.PerToken, m.PerItem, m.PerBatch)
	if padded {
		s = fmt.Sprintf("%d B/padded token + %d B/attention score + %d B/item + %d B/batch", m.PerToken, m.PerScore, m.PerItem, m.PerBatch)
	}
	if m.PerBatch >= 1024 {
		s += " (" + bytesize.Format(m.PerBatch) + ")"
	}
	return s
}

// String is the report of the calibration, several lines.
func (c *Calibration) String() string {
	var b strings.Builder
	minItems, maxItems := math.MaxInt, 0
	for _, s := range c.Samples {
		minItems, maxItems = min(minItems, s.Items), max(maxItems, s.Items)
	}
	fmt.Fprintf(&b, "cost model of %s on %s, fitted %s", c.Model, c.Device, c.FittedAt.Format(time.RFC3339))
	if c.Took > 0 {
		fmt.Fprintf(&b, " in %v", c.Took.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "\n  samples:           %d batches of %d to %d items", len(c.Samples), minItems, maxItems)
	switch {
	case c.Heads > 0:
		fmt.Fprintf(&b, " padded to 1 to %d tokens, %d attention heads (seed %d)", c.MaxTokens, c.Heads, c.Sweep.Seed)
	case c.MaxTokens > 0:
		fmt.Fprintf(&b, ", 1 to %d tokens per item (seed %d)", c.MaxTokens, c.Sweep.Seed)
	}
	fmt.Fprintf(&b, "\n  least squares:     %s\n", formatModel(c.Raw, c.Heads > 0))
	fmt.Fprintf(&b, "  worst under-estimate of the least squares: %s\n", c.WorstUnderRaw)
	fmt.Fprintf(&b, "  per batch raised by %s to cover every sample, and by a margin of %s for batches between samples\n",
		exactBytes(c.WorstUnderRaw.Bytes), exactBytes(c.Margin))
	fmt.Fprintf(&b, "  (the margin is the less of what held-out samples measured and the bound from monotonicity alone, %s)\n",
		exactBytes(c.MonotoneBound))
	fmt.Fprintf(&b, "  fitted model:      %s\n", formatModel(c.Cost, c.Heads > 0))
	fmt.Fprintf(&b, "  worst over-estimate of the fitted model: %s\n", c.WorstOver)
	b.WriteString("  (the subscriber charges the per-batch bytes once per message: an upper bound for a batch of several)")
	return b.String()
}

// CostModelFile is a calibrated cost model as SaveCostModel writes it: the
// coefficients, what they were fitted for, and the figures of the fit.
type CostModelFile struct {
	// Model and Device are the names of the model and device the cost
	// model was fitted on; LoadCostModel refuses it for any other.
	Model  string `json:"model"`
	Device string `json:"device"`
	// Form is how the coefficients apply: "" (absent) for tokens and items
	// (gpu.CostModel.Bytes), FormPadded for padded shapes of a model with
	// Heads attention heads (gpu.CostModel.Padded).
	Form  string `json:"form,omitempty"`
	Heads int    `json:"heads,omitempty"`
	gpu.CostModel
	Samples int `json:"samples"`
	// MaxItems and MaxTokens bound the batches measured: the range the
	// model was checked on (for the padded form, MaxTokens is the longest
	// sequence).
	MaxItems              int       `json:"max_items"`
	MaxTokens             int       `json:"max_tokens"`
	WorstUnderEstimateRaw int64     `json:"worst_under_estimate_raw"`
	Margin                int64     `json:"margin"`
	WorstOverEstimate     int64     `json:"worst_over_estimate"`
	FittedAt              time.Time `json:"fitted_at"`
}

// FormPadded is CostModelFile.Form for a cost model of padded shapes.
const FormPadded = "padded"

// File is the calibration as a cost model file.
func (c *Calibration) File() CostModelFile {
	maxItems := 0
	for _, s := range c.Samples {
		maxItems = max(maxItems, s.Items)
	}
	form := ""
	if c.Heads > 0 {
		form = FormPadded
	}
	return CostModelFile{
		Model: c.Model, Device: c.Device, Form: form, Heads: c.Heads, CostModel: c.Cost,
		Samples: len(c.Samples), MaxItems: maxItems, MaxTokens: c.MaxTokens,
		WorstUnderEstimateRaw: c.WorstUnderRaw.Bytes, Margin: c.Margin, WorstOverEstimate: c.WorstOver.Bytes,
		FittedAt: c.FittedAt,
	}
}

// Validate reports a file that cannot be used: no model or device named, or
// a negative coefficient.
func (f CostModelFile) Validate() error {
	var errs []error
	if f.Model == "" {
		errs = append(errs, errors.New(`no "model": the cost model must name the model it was fitted for`))
	}
	if f.Device == "" {
		errs = append(errs, errors.New(`no "device": the cost model must name the device it was fitted on`))
	}
	switch f.Form {
	case "":
		if f.Heads != 0 || f.PerScore != 0 {
			errs = append(errs, fmt.Errorf(`heads %d, per score %d: only a cost model of the %q form has attention`, f.Heads, f.PerScore,
				FormPadded))
		}
	case FormPadded:
		if f.Heads < 1 {
			errs = append(errs, fmt.Errorf(`heads %d: a cost model of the %q form needs the model's attention heads`, f.Heads, FormPadded))
		}
	default:
		errs = append(errs, fmt.Errorf(`form %q: want none or %q`, f.Form, FormPadded))
	}
	if err := f.CostModel.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// SaveCostModel writes f to path as JSON. It writes a temporary file beside
// path and renames it over, so a reader never sees half a file.
func SaveCostModel(path string, f CostModelFile) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("cost model %s: %w", path, err)
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("cost model: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, there is nothing to remove
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("cost model: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("cost model: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("cost model: %w", err)
	}
	return nil
}

// ReadCostModel reads a cost model file and validates it. Unknown fields
// and missing coefficients are errors: a misspelt "per_batch" read as 0
// would under-estimate every batch.
func ReadCostModel(path string) (CostModelFile, error) {
	var f CostModelFile
	data, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("cost model: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return f, fmt.Errorf("cost model %s: %w", path, err)
	}
	var present map[string]json.RawMessage
	if err := json.Unmarshal(data, &present); err != nil {
		return f, fmt.Errorf("cost model %s: %w", path, err)
	}
	var missing []string
	keys := []string{"per_token", "per_item", "per_batch"}
	if f.Form == FormPadded {
		keys = append(keys, "per_score", "heads")
	}
	for _, k := range keys {
		if _, ok := present[k]; !ok {
			missing = append(missing, `"`+k+`"`)
		}
	}
	if len(missing) > 0 {
		return f, fmt.Errorf("cost model %s: missing %s", path, strings.Join(missing, ", "))
	}
	if err := f.Validate(); err != nil {
		return f, fmt.Errorf("cost model %s: %w", path, err)
	}
	return f, nil
}

// LoadCostModel reads the cost model file at path and gives it to m, whose
// Cost applies it from then on. It refuses a file fitted for another model
// (m.Name() differs) or on another device (device, as Device.Name says,
// differs): a cost model measured where the allocator adds nothing would
// under-estimate every batch on a GPU whose driver rounds allocations up.
// It refuses a file whose form does not fit m (see AttentionModel). m must
// be a gpu.CostModelSetter.
func LoadCostModel(path string, m gpu.Model, device string) (CostModelFile, error) {
	f, err := ReadCostModel(path)
	if err != nil {
		return f, err
	}
	var errs []error
	if f.Model != m.Name() {
		errs = append(errs, fmt.Errorf("fitted for model %q, not %q", f.Model, m.Name()))
	}
	if f.Device != device {
		errs = append(errs, fmt.Errorf("fitted on device %q, not %q", f.Device, device))
	}
	// A cost model without the length² term would under-estimate a
	// transformer's long batches; one with it, fitted for another number of
	// heads, would mis-scale them.
	heads := 0
	if a, ok := m.(AttentionModel); ok {
		heads = a.AttentionHeads()
	}
	switch {
	case heads > 0 && f.Form != FormPadded:
		errs = append(errs, fmt.Errorf("a cost model of tokens and items, not of padded shapes (form %q), for a model with attention",
			FormPadded))
	case heads > 0 && f.Heads != heads:
		errs = append(errs, fmt.Errorf("fitted for %d attention heads, not %d", f.Heads, heads))
	case heads == 0 && f.Form != "":
		errs = append(errs, fmt.Errorf("a cost model of padded shapes (form %q), for a model without attention", f.Form))
	}
	if len(errs) > 0 {
		return f, fmt.Errorf("cost model %s: %w; calibrate this model on this device", path, errors.Join(errs...))
	}
	s, ok := m.(gpu.CostModelSetter)
	if !ok {
		return f, fmt.Errorf("cost model %s: model %s does not take a calibrated cost model", path, m.Name())
	}
	if err := s.SetCostModel(f.CostModel); err != nil {
		return f, fmt.Errorf("cost model %s: %w", path, err)
	}
	return f, nil
}
