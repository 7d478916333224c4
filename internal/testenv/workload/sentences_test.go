package workload

import (
	"math"
	"strings"
	"testing"
)

// TestSentencesShape checks the sentence workload against the lognormal it
// claims, with the normal CDF written out here through math.Erf, not with
// the package's own draws: every item within the clip, and the share of
// items at or under 10, 20, 36 and 66 words as the formula says, within
// sampling error; lengths vary within a message.
func TestSentencesShape(t *testing.T) {
	s := Sentences("s", 2000)
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	works := s.Works()
	if len(works) != s.Messages {
		t.Fatalf("%d messages, want %d", len(works), s.Messages)
	}
	var lengths []int
	mixed := 0
	for i, w := range works {
		if w.Chunk != i || w.Chunks != s.Messages || w.JobID != "s" || len(w.Items) != s.Items {
			t.Fatalf("message %d is chunk %d of %d of job %q with %d items", i, w.Chunk, w.Chunks, w.JobID, len(w.Items))
		}
		first := -1
		for _, it := range w.Items {
			n := len(strings.Fields(it.Text))
			if n < s.MinWords || n > s.MaxWords {
				t.Fatalf("item %s has %d words, outside [%d, %d]", it.ID, n, s.MinWords, s.MaxWords)
			}
			if first >= 0 && n != first {
				mixed++
				break
			}
			first = n
		}
	}
	if mixed < len(works)*9/10 {
		t.Errorf("%d of %d messages mix lengths: want lengths drawn per item", mixed, len(works))
	}
	for _, w := range works {
		for _, it := range w.Items {
			lengths = append(lengths, len(strings.Fields(it.Text)))
		}
	}
	cdf := func(x float64) float64 {
		return 0.5 * (1 + math.Erf(math.Log(x/s.MedianWords)/(s.Sigma*math.Sqrt2)))
	}
	for _, k := range []int{10, 20, 36, 66} {
		// Draws are rounded to whole words: k+0.5 rounds down to k.
		want := cdf(float64(k) + 0.5)
		got := 0
		for _, n := range lengths {
			if n <= k {
				got++
			}
		}
		share := float64(got) / float64(len(lengths))
		sd := math.Sqrt(want * (1 - want) / float64(len(lengths)))
		if math.Abs(share-want) > 4*sd+0.005 {
			t.Errorf("share of items of at most %d words: %.3f, want %.3f (sd %.3f)", k, share, want, sd)
		}
	}
}

func TestSentencesValidate(t *testing.T) {
	for _, s := range []SentenceSpec{
		{Messages: -1, Items: 8, MedianWords: 20, Sigma: 0.6, MinWords: 1, MaxWords: 9},
		{Messages: 1, Items: 0, MedianWords: 20, Sigma: 0.6, MinWords: 1, MaxWords: 9},
		{Messages: 1, Items: 8, MedianWords: math.NaN(), Sigma: 0.6, MinWords: 1, MaxWords: 9},
		{Messages: 1, Items: 8, MedianWords: 20, Sigma: -1, MinWords: 1, MaxWords: 9},
		{Messages: 1, Items: 8, MedianWords: 20, Sigma: 0.6, MinWords: 5, MaxWords: 4},
	} {
		if s.Validate() == nil {
			t.Errorf("%+v: no error", s)
		}
	}
}
