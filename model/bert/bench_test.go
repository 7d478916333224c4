package bert

import (
	"github.com/vramq/vramq/internal/testenv/cputime"

	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkEmbed runs the encoder on a model of all-MiniLM-L6-v2's shape
// (generated weights; speed does not depend on their values) for batches
// of full-length items, with each matrix-product backend, and reports items/s, tokens/s and items per CPU second (all
// threads), the figure that holds still on a shared machine.
// golden/onnx/bench.mjs runs ONNX Runtime on the same shapes: the baseline.
//
//	go test -run '^$' -bench BenchmarkEmbed -benchtime 3x ./model/bert/
func BenchmarkEmbed(b *testing.B) {
	m := randomModel(miniLM, 1)
	r := rand.New(rand.NewPCG(2, 2))
	saved := backend
	defer func() { backend = saved }()
	for _, g := range []gemmBackend{gonumGEMM, fmaGEMM} {
		if !g.available() {
			continue
		}
		backend = g
		for _, batch := range []int{8, 32} {
			for _, seq := range []int{16, 128} {
				benchEmbed(b, m, r, g.String(), batch, seq)
			}
		}
	}
}

func benchEmbed(b *testing.B, m *Model, r *rand.Rand, backend string, batch, seq int) {
	lengths := make([]int, batch)
	for i := range lengths {
		lengths[i] = seq
	}
	ids := randomIDs(r, miniLM.VocabSize, lengths...)
	b.Run(fmt.Sprintf("%s/batch=%d/seq=%d", backend, batch, seq), func(b *testing.B) {
		cpu0 := cputime.Process()
		for b.Loop() {
			if _, err := m.Embed(ids); err != nil {
				b.Fatal(err)
			}
		}
		cpu := (cputime.Process() - cpu0).Seconds()
		s := b.Elapsed().Seconds()
		b.ReportMetric(float64(b.N*batch)/s, "items/s")
		b.ReportMetric(float64(b.N*batch*seq)/s, "tokens/s")
		if cpu > 0 {
			b.ReportMetric(float64(b.N*batch)/cpu, "items/cpu-s")
		}
	})
}
