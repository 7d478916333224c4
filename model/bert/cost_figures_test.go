package bert

import (
	"testing"

	"github.com/vramq/vramq/internal/bytesize"
)

// TestMiniLMCostFigures is the source of docs/models.md's figures for an
// all-MiniLM-L6-v2-shaped model (-v logs them): what one text is charged at
// 16, 128 and 512 tokens, and how far the charge of a batch of 32 texts of
// one length is above that batch's exact working memory at their own length
// (the bucket's padding and the per-sequence bound on the matrix products'
// overhead together), from 64 and from 256 tokens up.
func TestMiniLMCostFigures(t *testing.T) {
	const batch, maxLen = 32, 512
	for _, l := range []int{16, 128, 512} {
		t.Logf("a text of %d tokens is charged %s", l, bytesize.Format(miniLM.seqBytes(bucketOf(l, maxLen))))
	}
	over := func(from int) (worst float64, at int) {
		for l := from; l <= maxLen; l++ {
			charged := float64(batch * miniLM.seqBytes(bucketOf(l, maxLen)))
			if r := charged/float64(miniLM.WorkingBytes(batch, l)) - 1; r > worst {
				worst, at = r, l
			}
		}
		return worst, at
	}
	for _, c := range []struct {
		from  int
		bound float64
	}{{64, 0.21}, {256, 0.09}} {
		worst, at := over(c.from)
		t.Logf("a batch of %d texts of one length from %d to %d tokens: charged at most %.1f%% over its working memory (at %d tokens)",
			batch, c.from, maxLen, 100*worst, at)
		if worst > c.bound {
			t.Errorf("from %d tokens: charged %.1f%% over the working memory at %d tokens, want at most %.0f%%", c.from, 100*worst, at, 100*c.bound)
		}
	}
}

// TestMiniLMShortTextsInBudget is the source of docs/models.md's figure for
// item 3 of issue 37 (-v logs it): how many 3-token texts, one a message, an
// all-MiniLM-L6-v2-shaped model on a GPU admits in an 8 GiB budget when each
// message is charged the Granule its batch needs once (before), and when a
// batch is charged it once (after: the subscriber's batchShare), in
// batches of the subscriber's default -max-batch of 32 messages; the last
// message to join a batch needs room for its whole cost while it is
// admitted, so a granule more is set aside.
func TestMiniLMShortTextsInBudget(t *testing.T) {
	const budget, maxBatch = 8 << 30, 32
	own := miniLM.seqBytes(bucketOf(3, 512))
	before := budget / (own + Granule)
	batch := maxBatch*own + Granule
	full := (budget - Granule) / batch
	after := full*maxBatch + min(max((budget-Granule-full*batch-Granule)/own, 0), maxBatch-1)
	t.Logf("3-token texts in %s: %d charged a granule each (%s a text), %d charged it once a batch of %d (%s a text)",
		bytesize.Format(budget), before, bytesize.Format(own+Granule), after, maxBatch, bytesize.Format(own))
	if after <= before {
		t.Errorf("charging the granule once a batch admits %d texts, no more than %d", after, before)
	}
}
