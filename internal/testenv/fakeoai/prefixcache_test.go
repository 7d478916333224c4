package fakeoai_test

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// A prompt's leading blocks that the cache holds are neither computed again
// (the request takes fewer steps) nor held twice; a pool too small for two
// prefixes evicts one for the other, the least recently freed first.
func TestPrefixCache(t *testing.T) {
	doc := func(name string) string { return strings.Repeat(name+" ", 640) } // 40 blocks of 16
	body := func(prefix, q string) string {
		return fmt.Sprintf(`{"model":"fake-model","prompt":%q,"max_tokens":1}`, prefix+q+" [[len=1]]")
	}
	cases := []struct {
		name   string
		blocks int
		// hit tokens after each request: a, a again, b, a again
		hits [4]int64
	}{
		{"the pool holds both", 128, [4]int64{0, 640, 640, 1280}},
		// b's 41 blocks take the 24 never used and evict 17 of a's 40,
		// its last ones: a's first 23 (368 tokens) are still cached.
		{"the pool holds one", 64, [4]int64{0, 640, 640, 640 + 368}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := fakeoai.NewUnstarted(fakeoai.Config{MaxModelLen: 1024, NumGPUBlocks: c.blocks, PrefixCaching: true,
					MaxNumBatchedTokens: 64, TokenLatency: time.Second})
				defer s.Close()
				var took [4]time.Duration
				for i, b := range []string{body(doc("a"), "q1"), body(doc("a"), "q2"), body(doc("b"), "q3"), body(doc("a"), "q4")} {
					start := time.Now()
					if res, got := post(t, s, "/v1/completions", b); res.StatusCode != 200 {
						t.Fatalf("request %d: %d %s", i, res.StatusCode, got)
					}
					took[i] = time.Since(start)
					if st := s.Stats(); st.PrefixHitTokens != c.hits[i] {
						t.Errorf("after request %d: %d prompt tokens from the cache, want %d", i, st.PrefixHitTokens, c.hits[i])
					}
				}
				// 640 prompt tokens at 64 a step take 11 steps (the
				// last holds the "q" and the directive); cached, one.
				if took[0] != 11*time.Second || took[1] != time.Second {
					t.Errorf("took %v uncached and %v cached, want 11s and 1s", took[0], took[1])
				}
				if st := s.Stats(); st.KVBlocksUsed != 0 {
					t.Errorf("%d blocks still held", st.KVBlocksUsed)
				}
				wantMetrics(t, s, map[string]string{
					"vllm:prefix_cache_hits_total{engine=\"0\"," + model + "}": fmt.Sprint(c.hits[3]),
				})
			})
		})
	}
}
