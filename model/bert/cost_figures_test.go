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
