package modelserver

import (
	"context"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

// An item's own KV charge is what Cost charges for it among others: the
// subscriber gives back each item's share of a message's admission by
// them, so they add up to the message's cost, and an item refused without
// a request costs nothing.
func TestItemCostsAddUpToCost(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{}, func(t *testing.T, _ *fakeoai.Server, m *Model) {
		items := []job.Item{chatItem("a", "a short prompt", 16), {ID: "bad", Body: []byte(`{"model":`)},
			chatItem("b", "a longer prompt of a few more words than the first", 256)}
		cost := m.Cost("", items)
		cs := m.ItemCosts("", items)
		var sum int64
		for _, c := range cs {
			sum += c
		}
		if sum != cost || cs[1] != 0 || cs[0] <= 0 || cs[2] <= cs[0] {
			t.Fatalf("item costs %v (sum %d) for a cost of %d; want them to add up, the refused item's 0", cs, sum, cost)
		}
	})
}

// Each answer is told as it arrives (gpu.Answers), with its item's index in
// the batch; an item refused without a request is not an answer.
func TestRunTellsEachAnswer(t *testing.T) {
	inBubble(t, fakeoai.Config{}, Config{}, func(t *testing.T, _ *fakeoai.Server, m *Model) {
		items := []job.Item{chatItem("a", "one", 8), {ID: "bad", Body: []byte(`{"model":`)}, chatItem("c", "three", 8)}
		told := make(chan int, len(items))
		ctx := gpu.WithAnswers(t.Context(), func(i int, out job.Output) {
			if out.ID != items[i].ID || out.Response == nil {
				t.Errorf("told item %d as %+v", i, out)
			}
			told <- i
		})
		if _, err := m.Run(ctx, "", items); err != nil {
			t.Fatal(err)
		}
		close(told)
		seen := map[int]bool{}
		for i := range told {
			seen[i] = true
		}
		if len(seen) != 2 || !seen[0] || !seen[2] {
			t.Errorf("told items %v; want 0 and 2, the answered ones", seen)
		}
		if _, err := m.Run(context.WithoutCancel(t.Context()), "", items[:1]); err != nil {
			t.Fatal(err) // no hook: nothing to tell, nothing fails
		}
	})
}

// Left to its default, the concurrency bound is the KV cache's when the
// cache is followed, so that a user who sets nothing gets the pool's
// worth of requests and not 16; a server without KV metrics keeps 16, its
// only bound; a bound given is kept either way.
func TestDefaultConcurrencyFollowsTheKVCache(t *testing.T) {
	kv := fakeoai.Config{BlockSize: 16, NumGPUBlocks: 2048, MaxNumSeqs: 4096}
	for _, tc := range []struct {
		name string
		fake fakeoai.Config
		set  int
		want int
	}{
		{"kv followed", kv, 0, 2048},
		{"kv followed, bound given", kv, 8, 8},
		{"no kv metrics", fakeoai.Config{NoMetrics: true}, 0, DefaultMaxConcurrency},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inBubble(t, tc.fake, Config{MaxConcurrency: tc.set}, func(t *testing.T, _ *fakeoai.Server, m *Model) {
				if got := m.conc.now(); got != tc.want || m.cfg.MaxConcurrency != tc.want {
					t.Fatalf("concurrency bound %d (config %d); want %d", got, m.cfg.MaxConcurrency, tc.want)
				}
			})
		})
	}
}
