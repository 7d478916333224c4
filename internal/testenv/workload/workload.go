// Package workload makes the synthetic jobs that the demo, the load generator
// and the end-to-end tests send: the bimodal mix of the source articles, many
// small inputs and now and then a large one that needs many times the memory.
package workload

import (
	"fmt"
	"strings"

	"github.com/vramq/vramq/job"
)

// Spec shapes a workload. Sizes are in items per message and words per item;
// what that costs in device memory is the model's business.
type Spec struct {
	JobID      string
	Messages   int
	LargeEvery int // every LargeEvery-th message is large; 0 for none
	SmallItems int
	SmallWords int
	LargeItems int
	LargeWords int
	Seed       uint64
}

// Mixed is the default bimodal mix: one message in five is large. With the
// reference model's default config a small message needs 240.8 KiB of working
// memory and a large one 16.25 MiB (its items are cut at 512 tokens).
func Mixed(jobID string, messages int) Spec {
	return Spec{JobID: jobID, Messages: messages, LargeEvery: 5,
		SmallItems: 8, SmallWords: 24, LargeItems: 32, LargeWords: 600, Seed: 1}
}

// Large reports whether message i of the workload is a large one.
func (s Spec) Large(i int) bool { return s.LargeEvery > 0 && i%s.LargeEvery == 0 }

// Works returns the work messages, chunk i of job s.JobID for i in
// [0, s.Messages). The same Spec always gives the same texts.
func (s Spec) Works() []job.Work {
	r := s.Seed*0x9e3779b97f4a7c15 + 1
	next := func() uint64 { // xorshift64*: tiny and deterministic
		r ^= r >> 12
		r ^= r << 25
		r ^= r >> 27
		return r * 0x2545f4914f6cdd1d
	}
	works := make([]job.Work, s.Messages)
	var b strings.Builder
	for i := range works {
		items, words := s.SmallItems, s.SmallWords
		if s.Large(i) {
			items, words = s.LargeItems, s.LargeWords
		}
		w := job.Work{V: job.Version, JobID: s.JobID, Chunk: i, Chunks: s.Messages, Items: make([]job.Item, items)}
		for j := range w.Items {
			w.Items[j] = job.Item{ID: fmt.Sprintf("%d-%d", i, j), Text: text(&b, words, next)}
		}
		works[i] = w
	}
	return works
}

var syllables = []string{"ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "zu", "pe", "da", "go", "hi", "ju", "bo", "fe"}

// text is n words from next's draws, space-separated, built in b (reset
// first, so that one builder serves a whole workload).
func text(b *strings.Builder, n int, next func() uint64) string {
	b.Reset()
	for x := range n {
		if x > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(word(next()))
	}
	return b.String()
}

// word makes a pronounceable word of two to four syllables, about 4000 in all.
func word(x uint64) string {
	n := 2 + int(x%3)
	var b strings.Builder
	for range n {
		x /= 16
		b.WriteString(syllables[x%16])
	}
	return b.String()
}
