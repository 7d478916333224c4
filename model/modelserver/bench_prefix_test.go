package modelserver

// The prefix figures of issue 36, against internal/testenv/fakeoai with its
// prefix cache, over TCP, its clock running prefixBenchSpeed times as fast
// as the real one. Not a pass/fail test: it prints what it measured, and
// bench/modelserver.md records the figures and the command. It runs only
// when VRAMQ_BENCH_PREFIX is set.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

const (
	prefixBenchSpeed   = 5
	prefixBenchPrompts = 8    // system prompts
	prefixBenchWords   = 2000 // tokens of each
	prefixBenchItems   = 512
	prefixBenchBatch   = 8 // items per message
	prefixBenchWorkers = 8 // messages in flight
	prefixBenchOut     = 32
)

// prefixItems is the job: item i asks a question under system prompt i mod
// prefixBenchPrompts, so that arrival order interleaves them. keyed sends
// the system prompt as a message of its own, which gives each item a prefix
// key (job.PrefixKey); otherwise it leads the one user message, the same
// words to the server's cache, and the item has no key: arrival order, as
// a consumer unaware of prefixes sends it. grouped orders the job as the
// publisher does with options.group_prefixes.
func prefixItems(keyed, grouped bool) []job.Item {
	items := make([]job.Item, prefixBenchItems)
	for i := range items {
		p := i % prefixBenchPrompts
		system := strings.Repeat(fmt.Sprintf("s%d ", p), prefixBenchWords)
		q := fmt.Sprintf("question %d [[len=%d]]", i, prefixBenchOut)
		var msgs []map[string]string
		if keyed {
			msgs = []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": q}}
		} else {
			msgs = []map[string]string{{"role": "user", "content": system + q}}
		}
		b, _ := json.Marshal(map[string]any{"model": "fake-model", "messages": msgs, "max_tokens": 2 * prefixBenchOut})
		items[i] = job.Item{ID: fmt.Sprintf("i%d", i), Body: b}
	}
	if !grouped {
		return items
	}
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = job.PrefixKey(job.EndpointChatCompletions, it.Body)
	}
	out := make([]job.Item, len(items))
	for i, j := range job.PrefixOrder(keys) {
		out[i] = items[j]
	}
	return out
}

type prefixResult struct {
	tokensPerSec, itemsPerSec, hitRate float64
	preemptions                        int64
	failed                             int
}

// runPrefix sends items, prefixBenchBatch to a Run, prefixBenchWorkers Runs
// at once, to a fresh server of blocks KV blocks, and measures in server
// time.
func runPrefix(t *testing.T, blocks int, items []job.Item) prefixResult {
	s := fakeoai.New(fakeoai.Config{Speed: prefixBenchSpeed, TokenLatency: benchTokenLatency, MaxModelLen: 4096,
		NumGPUBlocks: blocks, PrefixCaching: true, MaxNumBatchedTokens: 2048})
	defer s.Close()
	m, err := Open(t.Context(), Config{BaseURL: s.URL(), Models: []string{"fake-model"}, Logger: quiet(),
		MaxConcurrency: 32, MaxOutputTokens: 2 * prefixBenchOut})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	batches := make(chan []job.Item, len(items)/prefixBenchBatch+1)
	for i := 0; i < len(items); i += prefixBenchBatch {
		batches <- items[i:min(i+prefixBenchBatch, len(items))]
	}
	close(batches)
	var mu sync.Mutex
	var r prefixResult
	start := s.Now()
	var wg sync.WaitGroup
	for range prefixBenchWorkers {
		wg.Go(func() {
			for b := range batches {
				outs, err := m.Run(context.Background(), "", b)
				mu.Lock()
				if err != nil {
					r.failed += len(b)
				}
				for _, o := range outs {
					if o.Error != nil {
						r.failed++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	secs := s.Now().Sub(start).Seconds()
	st := s.Stats()
	r.tokensPerSec = float64(st.PromptTokens+st.CompletionTokens) / secs
	r.itemsPerSec = float64(len(items)-r.failed) / secs
	r.hitRate = float64(st.PrefixHitTokens) / float64(st.PrefixQueryTokens)
	r.preemptions = st.Preemptions
	return r
}

// prefixBenchRounds runs each case this many times, interleaved, and
// reports the median: one run is a few real seconds, and a shared machine's
// load moves it by a fifth.
const prefixBenchRounds = 3

func TestBenchPrefix(t *testing.T) {
	if os.Getenv("VRAMQ_BENCH_PREFIX") == "" {
		t.Skip("set VRAMQ_BENCH_PREFIX=1 to run the prefix benchmark")
	}
	cases := []struct {
		name           string
		keyed, grouped bool
	}{{"arrival order", false, false}, {"subscriber's order alone", true, false}, {"publisher's chunks and subscriber's order", true, true}}
	for _, pool := range []struct {
		name   string
		blocks int
	}{{"768 blocks of 16: not every prefix fits", 768}, {"4,096 blocks: every prefix fits", 4096}} {
		runs := make([][]prefixResult, len(cases))
		for range prefixBenchRounds {
			for i, c := range cases {
				runs[i] = append(runs[i], runPrefix(t, pool.blocks, prefixItems(c.keyed, c.grouped)))
			}
		}
		t.Logf("%s (median of %d)", pool.name, prefixBenchRounds)
		med := make([]prefixResult, len(cases))
		for i, c := range cases {
			slices.SortFunc(runs[i], func(a, b prefixResult) int { return cmp.Compare(a.tokensPerSec, b.tokensPerSec) })
			med[i] = runs[i][len(runs[i])/2]
			r := med[i]
			t.Logf("  %-42s %8.0f tokens/s (runs %s)  %6.1f items/s  hit rate %5.1f%%  preemptions %5d  failed %d",
				c.name, r.tokensPerSec, prefixRates(runs[i]), r.itemsPerSec, 100*r.hitRate, r.preemptions, r.failed)
		}
		t.Logf("  prefix-aware / arrival order: %.2f× tokens/s", med[2].tokensPerSec/med[0].tokensPerSec)
	}
}

func prefixRates(rs []prefixResult) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%.0f", r.tokensPerSec)
	}
	return strings.Join(s, ", ")
}
