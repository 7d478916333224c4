package jobs

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vramq/vramq/job"
)

// TestPlanGroupsPrefixes: with options.group_prefixes, items interleaved
// across system prompts are cut so that each chunk holds one prompt's
// items; without it, the items keep the order they were sent in.
func TestPlanGroupsPrefixes(t *testing.T) {
	const prompts, per, chunk = 4, 6, 3
	body := func(opts string) []byte {
		var items []string
		for i := range prompts * per {
			b := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":"prompt %d"},{"role":"user","content":"q%d"}]}`, i%prompts, i)
			items = append(items, fmt.Sprintf(`{"id":"i%02d","body":%s}`, i, b))
		}
		s := fmt.Sprintf(`{"endpoint":%q,"items":[%s]`, job.EndpointChatCompletions, strings.Join(items, ","))
		if opts != "" {
			s += `,"options":` + opts
		}
		return []byte(s + "}")
	}
	lim := RequestLimits{MaxItems: 100, MaxChunkItems: 10}
	pl := &Planner{MaxMessageBytes: 256 << 10, MaxItemBytes: maxInlineItem(256 << 10)}
	plan := func(opts string) []*job.Work {
		req, e := DecodeJobRequest(body(opts), lim)
		if e != nil {
			t.Fatal(e)
		}
		id := newJobID()
		p, e := pl.PlanFor(id, req.Endpoint, req.plannedItems(), chunk)
		if e != nil {
			t.Fatal(e)
		}
		return decodeChunks(t, pl, id, p)
	}
	for ci, w := range plan(`{"group_prefixes":true}`) {
		keys := map[string]bool{}
		for _, it := range w.Items {
			keys[job.PrefixKey(job.EndpointChatCompletions, it.Body)] = true
		}
		if len(keys) != 1 {
			t.Errorf("grouped: chunk %d holds %d prefixes, want 1", ci, len(keys))
		}
	}
	n := 0
	for _, w := range plan("") {
		for _, it := range w.Items {
			if want := fmt.Sprintf("i%02d", n); it.ID != want {
				t.Fatalf("not grouped: item %d is %s, want %s", n, it.ID, want)
			}
			n++
		}
	}
}
