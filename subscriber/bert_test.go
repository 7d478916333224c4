package subscriber

import (
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/bert"
)

// A BERT's estimates are what vram admission runs on: with room for about
// one and a half large messages, a bimodal workload runs to the end with no
// out-of-memory error on the device, large messages never two at once, and
// the device's peak use is within the budget.
func TestBERTAdmissionRunsWithoutOOM(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	dir := filepath.Join(t.TempDir(), "admit-bert")
	g := bert.Generated{Config: bert.Config{VocabSize: 30522, HiddenSize: 32, NumLayers: 2, NumHeads: 4,
		IntermediateSize: 128, MaxPositionEmbeddings: 64, TypeVocabSize: 2, LayerNormEps: 1e-12}, MaxSeqLength: 64, Seed: 3}
	if err := bert.Generate(dir, "../model/wordpiece/testdata/tokenizer", g); err != nil {
		t.Fatal(err)
	}
	probe, err := bert.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := workload.Mixed("bert-admit", 20)
	spec.LargeEvery = 2
	works := spec.Works()
	large, small := probe.Cost(works[0].Items), probe.Cost(works[1].Items)
	if large < 4*small {
		t.Fatalf("a large message costs %s, a small one %s: not the bimodal mix", bytesize.Format(large), bytesize.Format(small))
	}
	budget := large * 3 / 2
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, probe.Weights()+budget, Config{MaxBatch: 4}, func(h *harness, c *Config) {
			e, err := bert.Open(dir, h.dev)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close() })
			c.Backend = backend.InProcess{Model: e}
		})
		for _, w := range works {
			h.sendWork(w)
		}
		wait.For(t, 10*time.Minute, "every message deleted", func() bool { return h.sub.Ledger().Deleted == int64(len(works)) })
		h.shutdown()
		if n := h.dev.OOMs(); n != 0 {
			t.Errorf("%d out-of-memory errors on the device under vram admission", n)
		}
		if peak := h.dev.Peak() - probe.Weights(); peak > budget || peak <= small {
			t.Errorf("peak working memory %s, want in (%s, the budget %s]", bytesize.Format(peak), bytesize.Format(small), bytesize.Format(budget))
		}
		if got, _ := h.resultsByKey(); len(got) != len(works) {
			t.Errorf("%d results for %d messages", len(got), len(works))
		}
	})
}
