package bert

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkEmbed runs the encoder on a model of all-MiniLM-L6-v2's shape
// (generated weights; speed does not depend on their values) for batches
// of full-length items, and reports items/s and tokens/s.
//
//	go test -run '^$' -bench BenchmarkEmbed -benchtime 3x ./model/bert/
func BenchmarkEmbed(b *testing.B) {
	m := randomModel(miniLM, 1)
	r := rand.New(rand.NewPCG(2, 2))
	for _, batch := range []int{8, 32} {
		for _, seq := range []int{16, 128} {
			b.Run(fmt.Sprintf("batch=%d/seq=%d", batch, seq), func(b *testing.B) {
				lengths := make([]int, batch)
				for i := range lengths {
					lengths[i] = seq
				}
				ids := randomIDs(r, miniLM.VocabSize, lengths...)
				b.ResetTimer()
				for b.Loop() {
					if _, err := m.Embed(ids); err != nil {
						b.Fatal(err)
					}
				}
				s := b.Elapsed().Seconds()
				b.ReportMetric(float64(b.N*batch)/s, "items/s")
				b.ReportMetric(float64(b.N*batch*seq)/s, "tokens/s")
			})
		}
	}
}
