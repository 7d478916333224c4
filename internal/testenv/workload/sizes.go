package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Kind names an item-size distribution.
type Kind string

// The distributions a Load can draw from.
const (
	// Fixed: every item has the same number of words.
	Fixed Kind = "fixed"
	// Uniform: words uniform on [Min, Max].
	Uniform Kind = "uniform"
	// Bimodal is the mix of Mixed: most messages small, one in LargeEvery
	// large, with more and longer items. It shapes messages, not items,
	// because that is what the source articles describe: a large input
	// arrives as a whole, it is not scattered over small ones.
	Bimodal Kind = "bimodal"
	// Heavy: a bounded Pareto distribution, many short items and a long
	// tail of longer ones up to Max.
	Heavy Kind = "heavy"
)

// Kinds lists every Kind, for usage messages.
var Kinds = []Kind{Fixed, Uniform, Bimodal, Heavy}

// ParseKind reads a Kind by name.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("item sizes %q: want fixed, uniform, bimodal or heavy", s)
}

// Sizes is a distribution of item sizes in words. The reference model reads
// one token per word and at most 512 of them per item, so with it a word is a
// token of working memory up to that cut.
type Sizes struct {
	Kind Kind
	// Words is every item's length under Fixed.
	Words int
	// Min and Max bound the length under Uniform and Heavy; under Heavy Min
	// is also the Pareto scale, the most common length.
	Min, Max int
	// Alpha is the Pareto tail index under Heavy: the smaller, the heavier
	// the tail (below 2 its variance is infinite without the cut at Max).
	Alpha float64
	// Bimodal's shape: every LargeEvery-th message (0: none) has LargeItems
	// items of LargeWords words, the others SmallItems of SmallWords.
	LargeEvery             int
	SmallItems, SmallWords int
	LargeItems, LargeWords int
}

// MixedSizes is the Bimodal shape of Mixed.
func MixedSizes() Sizes {
	m := Mixed("", 0)
	return Sizes{Kind: Bimodal, LargeEvery: m.LargeEvery,
		SmallItems: m.SmallItems, SmallWords: m.SmallWords, LargeItems: m.LargeItems, LargeWords: m.LargeWords}
}

// Validate reports what is wrong with the parameters of s's kind.
func (s Sizes) Validate() error {
	switch s.Kind {
	case Fixed:
		if s.Words < 1 {
			return fmt.Errorf("fixed sizes: %d words per item; want at least 1", s.Words)
		}
	case Uniform:
		if s.Min < 1 || s.Max < s.Min {
			return fmt.Errorf("uniform sizes: %d to %d words; want 1 <= min <= max", s.Min, s.Max)
		}
	case Heavy:
		if s.Min < 1 || s.Max < s.Min {
			return fmt.Errorf("heavy sizes: %d to %d words; want 1 <= min <= max", s.Min, s.Max)
		}
		if !(s.Alpha > 0) || math.IsInf(s.Alpha, 0) {
			return fmt.Errorf("heavy sizes: tail index %v; want a positive number", s.Alpha)
		}
	case Bimodal:
		if s.LargeEvery < 0 || s.SmallItems < 1 || s.SmallWords < 1 || s.LargeItems < 1 || s.LargeWords < 1 {
			return errors.New("bimodal sizes: want items and words per message of at least 1 and large-every of at least 0")
		}
	default:
		return fmt.Errorf("item sizes %q: want fixed, uniform, bimodal or heavy", s.Kind)
	}
	return nil
}

func (s Sizes) String() string {
	switch s.Kind {
	case Fixed:
		return fmt.Sprintf("fixed(%d words)", s.Words)
	case Uniform:
		return fmt.Sprintf("uniform(%d-%d words)", s.Min, s.Max)
	case Heavy:
		return fmt.Sprintf("heavy(Pareto from %d words, alpha %g, cut at %d)", s.Min, s.Alpha, s.Max)
	case Bimodal:
		return fmt.Sprintf("bimodal(%dx%d words, every %dth message %dx%d words)",
			s.SmallItems, s.SmallWords, s.LargeEvery, s.LargeItems, s.LargeWords)
	}
	return string(s.Kind)
}

// MeanWords is the expected words per item: what a count-based strategy
// tuned for the average item would be sized on. Under Bimodal it is the mean
// over items of a long run of messages.
func (s Sizes) MeanWords() float64 {
	switch s.Kind {
	case Fixed:
		return float64(s.Words)
	case Uniform:
		return float64(s.Min+s.Max) / 2
	case Heavy:
		return boundedParetoMean(float64(s.Min), float64(s.Max), s.Alpha)
	case Bimodal:
		if s.LargeEvery == 0 {
			return float64(s.SmallWords)
		}
		small := float64(s.LargeEvery - 1)
		return (small*float64(s.SmallItems*s.SmallWords) + float64(s.LargeItems*s.LargeWords)) /
			(small*float64(s.SmallItems) + float64(s.LargeItems))
	}
	return 0
}

// words draws one item's length (not for Bimodal, whose lengths are fixed
// per message).
func (s Sizes) words(r *rand.Rand) int {
	switch s.Kind {
	case Uniform:
		return s.Min + r.IntN(s.Max-s.Min+1)
	case Heavy:
		// Inverse of the bounded Pareto CDF, so every draw is within
		// [Min, Max] and none is thrown away; rounding to a whole word
		// keeps it there, since both bounds are whole.
		lo, hi := float64(s.Min), float64(s.Max)
		u := r.Float64()
		x := lo / math.Pow(1-u*(1-math.Pow(lo/hi, s.Alpha)), 1/s.Alpha)
		return min(max(int(math.Round(x)), s.Min), s.Max)
	}
	return s.Words
}

// boundedParetoMean is the mean of a Pareto distribution of index a and
// scale lo cut at hi.
func boundedParetoMean(lo, hi, a float64) float64 {
	if hi <= lo {
		return lo
	}
	norm := 1 - math.Pow(lo/hi, a)
	if a == 1 {
		return lo * math.Log(hi/lo) / norm
	}
	return a / (a - 1) * (lo - math.Pow(lo, a)*math.Pow(hi, 1-a)) / norm
}
