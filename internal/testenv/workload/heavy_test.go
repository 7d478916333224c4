package workload

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/vramq/vramq/job"
)

// TestHeavyTailedShape checks the heavy-tailed workload against the bounded
// Pareto distribution it claims, with the survival function written out here
// (P(X >= x) = (x^-a - H^-a) / (L^-a - H^-a) on [L, H]), not with the
// package's own helpers: every message within the bounds, and the share of
// messages with at least 2, 4 and 8 times the fewest items as the formula
// says, within sampling error.
func TestHeavyTailedShape(t *testing.T) {
	s := HeavyTailed("h", 4000)
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	works := s.Works()
	if len(works) != s.Messages {
		t.Fatalf("%d messages, want %d", len(works), s.Messages)
	}
	counts := make([]int, len(works))
	for i, w := range works {
		if w.Chunk != i || w.Chunks != s.Messages || w.JobID != "h" {
			t.Fatalf("message %d is chunk %d of %d of job %q", i, w.Chunk, w.Chunks, w.JobID)
		}
		counts[i] = len(w.Items)
		if counts[i] < s.MinItems || counts[i] > s.MaxItems {
			t.Fatalf("message %d has %d items, outside [%d, %d]", i, counts[i], s.MinItems, s.MaxItems)
		}
		for _, it := range w.Items {
			if n := len(strings.Fields(it.Text)); n < s.MinWords || n > s.MaxWords {
				t.Fatalf("item %s has %d words, outside [%d, %d]", it.ID, n, s.MinWords, s.MaxWords)
			}
		}
	}
	a, lo, hi := s.ItemsAlpha, float64(s.MinItems), float64(s.MaxItems)
	survival := func(x float64) float64 {
		return (math.Pow(x, -a) - math.Pow(hi, -a)) / (math.Pow(lo, -a) - math.Pow(hi, -a))
	}
	for _, k := range []int{2, 4, 8} {
		// Draws are rounded to whole items: x-0.5 rounds up to x.
		x := float64(k*s.MinItems) - 0.5
		want := survival(x)
		got := float64(len(slices.DeleteFunc(slices.Clone(counts), func(c int) bool { return float64(c) < x }))) / float64(len(counts))
		sd := math.Sqrt(want * (1 - want) / float64(len(counts)))
		if math.Abs(got-want) > 4*sd+0.005 {
			t.Errorf("share of messages with at least %d items: %.3f, want %.3f (sd %.3f)", k*s.MinItems, got, want, sd)
		}
	}
	// The same spec gives the same messages.
	again := s.Works()
	for i := range works {
		if !slices.EqualFunc(works[i].Items, again[i].Items, func(a, b job.Item) bool { return a.ID == b.ID && a.Text == b.Text }) {
			t.Fatalf("message %d differs between two calls", i)
		}
	}
}

func TestHeavySpecValidate(t *testing.T) {
	bad := HeavyTailed("h", 1)
	bad.MaxItems = bad.MinItems - 1
	if bad.Validate() == nil {
		t.Error("max items below min items validated")
	}
	bad = HeavyTailed("h", 1)
	bad.WordsAlpha = 0
	if bad.Validate() == nil {
		t.Error("a zero tail index validated")
	}
}
