package workload

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/job"
)

func wordCounts(works []job.Work) []int {
	var n []int
	for _, w := range works {
		for _, it := range w.Items {
			n = append(n, len(strings.Fields(it.Text)))
		}
	}
	return n
}

func TestLoadIsDeterministicForASeed(t *testing.T) {
	for _, k := range Kinds {
		t.Run(string(k), func(t *testing.T) {
			l := Load{JobID: "d", Jobs: 2, Messages: 6, Sizes: testSizes(k), Seed: 7}
			if diff := cmp.Diff(l.Works(), l.Works()); diff != "" {
				t.Fatalf("two calls differ (-first +second):\n%s", diff)
			}
			if k == Bimodal || k == Fixed {
				return // lengths do not depend on the seed
			}
			other := l
			other.Seed = 8
			if slices.Equal(wordCounts(l.Works()), wordCounts(other.Works())) {
				t.Error("seeds 7 and 8 gave the same item lengths")
			}
			// Jobs draw their own items, or every job would be a copy.
			if slices.Equal(wordCounts(l.Job(0)), wordCounts(l.Job(1))) {
				t.Error("jobs 0 and 1 have the same item lengths")
			}
		})
	}
}

func testSizes(k Kind) Sizes {
	switch k {
	case Fixed:
		return Sizes{Kind: Fixed, Words: 24}
	case Uniform:
		return Sizes{Kind: Uniform, Min: 24, Max: 600}
	case Heavy:
		return Sizes{Kind: Heavy, Min: 24, Max: 600, Alpha: 1.2}
	}
	return MixedSizes()
}

// The bimodal load is today's Mixed, message for message, so the demo and
// the tests built on Mixed see the same workload through either.
func TestBimodalLoadIsMixed(t *testing.T) {
	l := Load{JobID: "m", Messages: 23, Sizes: MixedSizes(), Seed: 1}
	if diff := cmp.Diff(Mixed("m", 23).Works(), l.Works()); diff != "" {
		t.Errorf("bimodal load differs from Mixed (-Mixed +load):\n%s", diff)
	}
}

func TestLoadCutsJobsIntoMessages(t *testing.T) {
	for _, tc := range []struct {
		name      string
		load      Load
		wantItems []int // per message
	}{
		{"items by chunk", Load{Items: 20, ChunkItems: 8, Sizes: testSizes(Fixed)}, []int{8, 8, 4}},
		{"messages", Load{Messages: 3, Sizes: testSizes(Uniform)}, []int{8, 8, 8}},
		{"bimodal by items", Load{Items: 50, Sizes: MixedSizes()}, []int{32, 8, 8, 2}},
		{"bimodal by messages", Load{Messages: 6, Sizes: MixedSizes()}, []int{32, 8, 8, 8, 8, 32}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.load.JobID, tc.load.Jobs = "j", 2
			if err := tc.load.Validate(); err != nil {
				t.Fatal(err)
			}
			for j, id := range []string{"j-0", "j-1"} {
				works := tc.load.Job(j)
				var got []int
				for i, w := range works {
					got = append(got, len(w.Items))
					if w.JobID != id || w.Chunk != i || w.Chunks != len(works) {
						t.Errorf("message %d is %s chunk %d of %d; want %s chunk %d of %d", i, w.JobID, w.Chunk, w.Chunks, id, i, len(works))
					}
					if err := w.Validate(); err != nil {
						t.Errorf("message %d: %v", i, err)
					}
				}
				if !slices.Equal(got, tc.wantItems) {
					t.Errorf("job %d: items per message %v, want %v", j, got, tc.wantItems)
				}
			}
			if n := len(tc.load.Works()); n != 2*len(tc.wantItems) {
				t.Errorf("Works gave %d messages for two jobs of %d", n, len(tc.wantItems))
			}
		})
	}
}

// draws are n item lengths from s, as Load draws them, without the texts.
func draws(s Sizes, n int, seed uint64) []int {
	r := rand.New(rand.NewPCG(seed, 0))
	out := make([]int, n)
	for i := range out {
		out[i] = s.words(r)
	}
	return out
}

func TestSizesStayWithinBounds(t *testing.T) {
	for _, k := range []Kind{Fixed, Uniform, Heavy} {
		s := testSizes(k)
		lo, hi := s.Min, s.Max
		if k == Fixed {
			lo, hi = s.Words, s.Words
		}
		// Texts are costly to make: a few hundred are checked, and 20,000 draws
		// of the sampler they come from.
		texts := wordCounts(Load{Items: 300, Sizes: s, Seed: 3}.Works())
		if got := [2]int{slices.Min(texts), slices.Max(texts)}; got[0] < lo || got[1] > hi {
			t.Errorf("%s: texts of %d to %d words; want within [%d, %d]", k, got[0], got[1], lo, hi)
		}
		counts := draws(s, 20000, 3)
		if got := [2]int{slices.Min(counts), slices.Max(counts)}; got[0] < lo || got[1] > hi {
			t.Errorf("%s: items of %d to %d words; want within [%d, %d]", k, got[0], got[1], lo, hi)
		}
		if k == Uniform && (slices.Min(counts) != lo || slices.Max(counts) != hi) {
			t.Errorf("uniform: 20000 items reached only %d to %d words of [%d, %d]", slices.Min(counts), slices.Max(counts), lo, hi)
		}
	}
}

// The sample follows the distribution: the mean MeanWords promises, and the
// CDF at a few points, within what 20,000 draws allow. The seed is fixed, so
// the test cannot be flaky; the tolerances are several standard errors.
func TestSizesHaveTheirShape(t *testing.T) {
	paretoCDF := func(s Sizes, x float64) float64 {
		lo, hi, a := float64(s.Min), float64(s.Max), s.Alpha
		return (1 - math.Pow(lo/x, a)) / (1 - math.Pow(lo/hi, a))
	}
	for _, tc := range []struct {
		sizes Sizes
		mean  float64
		cdf   func(x float64) float64
	}{
		{Sizes{Kind: Uniform, Min: 24, Max: 600}, 312, func(x float64) float64 { return (x - 24 + 1) / 577 }},
		{Sizes{Kind: Heavy, Min: 24, Max: 600, Alpha: 1.2}, 69.8, nil},
		{Sizes{Kind: Heavy, Min: 10, Max: 10000, Alpha: 1.5}, 29.1, nil},
		{Sizes{Kind: Heavy, Min: 16, Max: 4096, Alpha: 1}, 89.1, nil},
	} {
		s := tc.sizes
		t.Run(s.String(), func(t *testing.T) {
			if got := s.MeanWords(); math.Abs(got-tc.mean) > 0.1 {
				t.Errorf("MeanWords %.2f, want %.1f", got, tc.mean)
			}
			counts := draws(s, 20000, 11)
			sum := 0
			for _, c := range counts {
				sum += c
			}
			mean := float64(sum) / float64(len(counts))
			if math.Abs(mean-s.MeanWords()) > 0.04*s.MeanWords() {
				t.Errorf("sample mean %.1f words; the distribution's is %.1f", mean, s.MeanWords())
			}
			cdf := tc.cdf
			if cdf == nil {
				// P(X <= x) after rounding to whole words.
				cdf = func(x float64) float64 { return paretoCDF(s, x+0.5) }
			}
			// Lengths are whole words, so the CDF steps: the sample's
			// q-quantile x must have P(X < x) <= q <= P(X <= x), give or
			// take the sampling error.
			slices.Sort(counts)
			for _, q := range []float64{0.1, 0.25, 0.5, 0.75, 0.9, 0.99} {
				x := counts[int(q*float64(len(counts)))]
				below, upTo := max(cdf(float64(x-1)), 0), cdf(float64(x))
				if tol := 0.01; q < below-tol || q > upTo+tol {
					t.Errorf("quantile %.2f is %d words, where the distribution has %.3f to %.3f of items", q, x, below, upTo)
				}
			}
			if s.Kind == Heavy && float64(counts[len(counts)/2]) >= 0.8*mean {
				t.Errorf("median %d not well below the mean %.1f: not heavy-tailed", counts[len(counts)/2], mean)
			}
		})
	}
}

func TestMixedSizesMeanIsPerItem(t *testing.T) {
	counts := wordCounts(Mixed("m", 50).Works())
	sum := 0
	for _, c := range counts {
		sum += c
	}
	if got, want := MixedSizes().MeanWords(), float64(sum)/float64(len(counts)); math.Abs(got-want) > 1e-9 {
		t.Errorf("MeanWords %v, want the item mean of Mixed %v", got, want)
	}
}

func TestLoadValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		load Load
		want string
	}{
		{"ok", Load{Messages: 1, Sizes: testSizes(Heavy)}, ""},
		{"no size", Load{Sizes: testSizes(Fixed)}, "needs items or messages"},
		{"negative", Load{Messages: 1, Jobs: -1, Sizes: testSizes(Fixed)}, "negative"},
		{"kind", Load{Messages: 1, Sizes: Sizes{Kind: "pareto"}}, `"pareto"`},
		{"fixed", Load{Messages: 1, Sizes: Sizes{Kind: Fixed}}, "0 words"},
		{"uniform", Load{Messages: 1, Sizes: Sizes{Kind: Uniform, Min: 9, Max: 8}}, "min <= max"},
		{"alpha", Load{Messages: 1, Sizes: Sizes{Kind: Heavy, Min: 1, Max: 8}}, "tail index 0"},
		{"bimodal", Load{Messages: 1, Sizes: Sizes{Kind: Bimodal}}, "bimodal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.load.Validate()
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseKind(t *testing.T) {
	for _, k := range Kinds {
		if got, err := ParseKind(string(k)); got != k || err != nil {
			t.Errorf("ParseKind(%q) = %q, %v", k, got, err)
		}
	}
	if _, err := ParseKind("lognormal"); err == nil {
		t.Error("ParseKind(lognormal) accepted")
	}
}
