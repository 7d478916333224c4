package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/vramq/vramq/job"
)

// HeavySpec is a workload whose message sizes have a heavy tail: each
// message's items per message and words per item are drawn from bounded
// Pareto distributions, once per message (a message is a document cut into
// passages of about one length), so most messages are small and a few are
// many times the mean, with every size in between (unlike Mixed's two
// sizes). Drawing a length per item instead would average the tail away
// within a message.
type HeavySpec struct {
	JobID    string
	Messages int
	// Items bounds the items per message, with tail index ItemsAlpha.
	MinItems, MaxItems int
	ItemsAlpha         float64
	// Words bounds the words per item, with tail index WordsAlpha.
	MinWords, MaxWords int
	WordsAlpha         float64
	Seed               uint64
}

// HeavyTailed is the heavy-tailed shape of the benchmarks: 8 to 64 items of
// 24 to 600 words, both with tail index 1.1. Its smallest message is Mixed's
// small one; its largest is four times Mixed's large one (32 items of 600
// words), and with the reference model's default config fits a 40 MiB budget.
func HeavyTailed(jobID string, messages int) HeavySpec {
	return HeavySpec{JobID: jobID, Messages: messages, MinItems: 8, MaxItems: 64, ItemsAlpha: 1.1,
		MinWords: 24, MaxWords: 600, WordsAlpha: 1.1, Seed: 1}
}

// Validate reports what is wrong with s.
func (s HeavySpec) Validate() error {
	items := Sizes{Kind: Heavy, Min: s.MinItems, Max: s.MaxItems, Alpha: s.ItemsAlpha}
	words := Sizes{Kind: Heavy, Min: s.MinWords, Max: s.MaxWords, Alpha: s.WordsAlpha}
	if err := items.Validate(); err != nil {
		return fmt.Errorf("items per message: %w", err)
	}
	if err := words.Validate(); err != nil {
		return fmt.Errorf("words per item: %w", err)
	}
	if s.Messages < 0 {
		return fmt.Errorf("%d messages: want at least 0", s.Messages)
	}
	return nil
}

func (s HeavySpec) String() string {
	return fmt.Sprintf("heavy-tailed: %d-%d items per message (Pareto, alpha %g), %d-%d words per item (Pareto, alpha %g)",
		s.MinItems, s.MaxItems, s.ItemsAlpha, s.MinWords, s.MaxWords, s.WordsAlpha)
}

// Works returns the messages, chunk i of job s.JobID for i in [0,
// s.Messages). The same spec always gives the same messages.
func (s HeavySpec) Works() []job.Work {
	items := Sizes{Kind: Heavy, Min: s.MinItems, Max: s.MaxItems, Alpha: s.ItemsAlpha}
	words := Sizes{Kind: Heavy, Min: s.MinWords, Max: s.MaxWords, Alpha: s.WordsAlpha}
	r := rand.New(rand.NewPCG(s.Seed, math.MaxUint32))
	works := make([]job.Work, s.Messages)
	var b strings.Builder
	for i := range works {
		w := job.Work{V: job.Version, JobID: s.JobID, Chunk: i, Chunks: s.Messages, Items: make([]job.Item, items.words(r))}
		n := words.words(r)
		for k := range w.Items {
			w.Items[k] = job.Item{ID: fmt.Sprintf("%d-%d", i, k), Text: text(&b, n, r.Uint64)}
		}
		works[i] = w
	}
	return works
}
