package publisher_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
)

// Issue 36, item 2, end to end on the emulator: a job sent with
// options.group_prefixes reaches the queue with the items of each system
// prompt in chunks of their own, each group in the order it came.
func TestEndpointJobGroupedByPrefix(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{Jobs: publisher.Jobs{Models: []string{"llama-3.1-8b"}}})
	var items []string
	for i := range 12 {
		body := fmt.Sprintf(`{"model":"llama-3.1-8b","messages":[{"role":"system","content":"prompt %d"},{"role":"user","content":"q%d"}]}`, i%3, i)
		items = append(items, fmt.Sprintf(`{"id":"r%02d","body":%s}`, i, body))
	}
	body := fmt.Sprintf(`{"endpoint":%q,"items":[%s],"options":{"chunk_items":4,"group_prefixes":true}}`,
		job.EndpointChatCompletions, strings.Join(items, ","))
	a := s.mustPost([]byte(body), nil)
	if a.Items != 12 || a.Chunks != 3 {
		t.Fatalf("accepted %+v, want 12 items in 3 chunks", a)
	}
	var got []string
	for _, w := range checkWhole(t, a, e.drain(a.Chunks)) {
		if w == nil {
			t.FailNow()
		}
		for _, it := range w.Items {
			got = append(got, it.ID)
		}
	}
	want := "r00 r03 r06 r09 r01 r04 r07 r10 r02 r05 r08 r11"
	if strings.Join(got, " ") != want {
		t.Errorf("items in chunk order %s, want %s", strings.Join(got, " "), want)
	}
}
