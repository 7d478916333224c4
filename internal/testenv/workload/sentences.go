package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/vramq/vramq/job"
)

// SentenceSpec is a workload of sentences: a fixed number of items per
// message, each item's length in words drawn on its own from a lognormal
// distribution, Williams's (1944) model of sentence lengths (surveyed with
// its rivals in Borbély and Kornai, "Sentence Length", arXiv:1905.09139).
// The distribution's median and spread here are assumptions, not a fit to
// a corpus. Unlike HeavySpec, the length varies within a message, as in a
// job of sentences cut into chunks, so a BERT model sees a realistic mix of
// sequence lengths in every batch.
type SentenceSpec struct {
	JobID    string
	Messages int
	Items    int
	// MedianWords and Sigma are the lognormal's median, e^mu, and the
	// standard deviation of the length's logarithm.
	MedianWords float64
	Sigma       float64
	// MinWords and MaxWords clip the draws.
	MinWords, MaxWords int
	Seed               uint64
}

// Sentences is the sentence-length shape of the benchmarks: 8 items per
// message (loadgen's chunk), median 20 words, sigma 0.6 (so about one
// sentence in six is over 36 words and one in 44 over 66), clipped to 3-200
// words: a BERT with max_seq_length 128 cuts the longest.
func Sentences(jobID string, messages int) SentenceSpec {
	return SentenceSpec{JobID: jobID, Messages: messages, Items: 8, MedianWords: 20, Sigma: 0.6,
		MinWords: 3, MaxWords: 200, Seed: 1}
}

// Validate reports what is wrong with s.
func (s SentenceSpec) Validate() error {
	switch {
	case s.Messages < 0:
		return fmt.Errorf("%d messages: want at least 0", s.Messages)
	case s.Items < 1:
		return fmt.Errorf("%d items per message: want at least 1", s.Items)
	case !(s.MedianWords >= 1) || !(s.Sigma >= 0) || math.IsInf(s.Sigma, 0):
		return fmt.Errorf("median %g words, sigma %g: want a median of at least 1 and a finite sigma of at least 0",
			s.MedianWords, s.Sigma)
	case s.MinWords < 1 || s.MaxWords < s.MinWords:
		return fmt.Errorf("%d-%d words per item: want 1 <= min <= max", s.MinWords, s.MaxWords)
	}
	return nil
}

func (s SentenceSpec) String() string {
	return fmt.Sprintf("sentences: %d items per message, words per item lognormal (median %g, sigma %g) clipped to %d-%d, "+
		"drawn per item", s.Items, s.MedianWords, s.Sigma, s.MinWords, s.MaxWords)
}

// Works returns the messages, chunk i of job s.JobID for i in [0,
// s.Messages). The same spec always gives the same messages.
func (s SentenceSpec) Works() []job.Work {
	r := rand.New(rand.NewPCG(s.Seed, math.MaxUint32-1))
	works := make([]job.Work, s.Messages)
	var b strings.Builder
	for i := range works {
		w := job.Work{V: job.Version, JobID: s.JobID, Chunk: i, Chunks: s.Messages, Items: make([]job.Item, s.Items)}
		for k := range w.Items {
			n := int(math.Round(s.MedianWords * math.Exp(s.Sigma*r.NormFloat64())))
			n = min(max(n, s.MinWords), s.MaxWords)
			w.Items[k] = job.Item{ID: fmt.Sprintf("%d-%d", i, k), Text: text(&b, n, r.Uint64)}
		}
		works[i] = w
	}
	return works
}
