package job

import (
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestChunkOfKey(t *testing.T) {
	const p = "results/j/"
	for _, tc := range []struct {
		key  string
		want int
		ok   bool
	}{
		{"results/j/0.json", 0, true},
		{"results/j/1.json", 1, true},
		{"results/j/9.json", 9, true},
		{"results/j/01.json", 0, false},
		{"results/j/+1.json", 0, false},
		{"results/j/-0.json", 0, false},
		{"results/j/-1.json", 0, false},
		{"results/j/ 1.json", 0, false},
		{"results/j/1.json.bak", 0, false},
		{"results/j/1.JSON", 0, false},
		{"results/j/1", 0, false},
		{"results/j/0x1.json", 0, false},
		{"results/j/1_0.json", 0, false},
		{"results/j/10.json", 0, false}, // at the job's chunk count
		{"results/j/99999999999999999999.json", 0, false},
		{"results/j2/1.json", 0, false},
		{"results/j/sub/1.json", 0, false},
		{"failed/j/1.json", 0, false},
	} {
		got, ok := ChunkOfKey(p, tc.key, 10)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ChunkOfKey(%q) = %d, %v; want %d, %v", tc.key, got, ok, tc.want, tc.ok)
		}
	}
	// The keys the writers write are the keys the rule reads, for every kind.
	for c := range 12 {
		for _, k := range []struct{ prefix, key string }{
			{ResultPrefix("j"), ResultKey("j", c)},
			{FailedPrefix("j"), FailedKey("j", c)},
			{CancelledPrefix("j"), CancelledKey("j", c)},
			{ItemErrorsPrefix("j"), ItemErrorsKey("j", c)},
		} {
			if got, ok := ChunkOfKey(k.prefix, k.key, 12); !ok || got != c {
				t.Errorf("ChunkOfKey(%q) = %d, %v; want %d", k.key, got, ok, c)
			}
		}
	}
}

func set(cs ...int) map[int]bool {
	m := map[int]bool{}
	for _, c := range cs {
		m[c] = true
	}
	return m
}

// A result wins over a failed marker, either over a cancelled one; chunks
// outside the job count nowhere; the status follows.
func TestSettle(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		results, failed, cancelled  map[int]bool
		done, fail, cancel, pending []int
		status, statusCancelAsked   string
	}{
		{"nothing yet", set(), set(), set(), nil, nil, nil, []int{0, 1, 2, 3}, StatusRunning, EventCancelled},
		{"result over failure over cancel", set(0, 1), set(1, 2), set(0, 2, 3), []int{0, 1}, []int{2}, []int{3}, nil,
			EventCancelled, EventCancelled},
		{"all done", set(0, 1, 2, 3), set(1), set(), []int{0, 1, 2, 3}, nil, nil, nil, EventComplete, EventComplete},
		{"one failed", set(0, 1, 2), set(3, 7), set(), []int{0, 1, 2}, []int{3}, nil, nil, EventPartial, EventPartial},
		{"past the count", set(0, 4, -1), set(5), set(6), []int{0}, nil, nil, []int{1, 2, 3}, StatusRunning, EventCancelled},
	} {
		tl := Settle(4, tc.results, tc.failed, tc.cancelled)
		keys := func(m map[int]bool) []int {
			var out []int
			for c := range 4 {
				if m[c] {
					out = append(out, c)
				}
			}
			return out
		}
		if d := cmp.Diff([][]int{tc.done, tc.fail, tc.cancel, tc.pending},
			[][]int{keys(tl.Done), keys(tl.Failed), keys(tl.Cancelled), tl.PendingChunks()}); d != "" {
			t.Errorf("%s: done, failed, cancelled, pending (-want +got):\n%s", tc.name, d)
		}
		if len(tl.Done)+len(tl.Failed)+len(tl.Cancelled) > 4 {
			t.Errorf("%s: a chunk in two sets: %+v", tc.name, tl)
		}
		if tl.Pending() != len(tc.pending) || tl.Settled() != (len(tc.pending) == 0) {
			t.Errorf("%s: pending %d, settled %v", tc.name, tl.Pending(), tl.Settled())
		}
		if got := tl.Status(false); got != tc.status {
			t.Errorf("%s: status %q; want %q", tc.name, got, tc.status)
		}
		if got := tl.Status(true); got != tc.statusCancelAsked {
			t.Errorf("%s: status with a cancel record %q; want %q", tc.name, got, tc.statusCancelAsked)
		}
	}
}

// Items of done chunks only; a refused item is failed, not done; a marker
// that is not its chunk's, or counts more than the chunk holds, counts none.
func TestItems(t *testing.T) {
	m := &Manifest{JobID: "j", Chunks: 4, Items: 10, ChunkItems: []int{3, 3, 3, 1}}
	marker := func(job string, chunk, n int) []byte {
		return []byte(`{"v":1,"job_id":"` + job + `","chunk":` + itoa(chunk) + `,"items_failed":` + itoa(n) + `}`)
	}
	failed := map[int]int{}
	for c, raw := range map[int][]byte{
		0: marker("j", 0, 1),
		1: marker("j", 1, 4),     // more than the chunk holds
		2: marker("other", 2, 1), // another job's
		3: marker("j", 2, 1),     // another chunk's
	} {
		if n := ItemsFailedOf(m, c, raw); n > 0 {
			failed[c] = n
		}
	}
	if d := cmp.Diff(map[int]int{0: 1}, failed); d != "" {
		t.Errorf("ItemsFailedOf (-want +got):\n%s", d)
	}
	if n := ItemsFailedOf(m, 0, []byte("junk")); n != 0 {
		t.Errorf("ItemsFailedOf(junk) = %d", n)
	}
	failed[2] = 2 // chunk 2 is not done: not counted
	tl := Settle(4, set(0, 1, 3), set(2), nil)
	done, nf := tl.Items(m, failed)
	if done != 6 || nf != 1 {
		t.Errorf("Items = %d done, %d failed; want 6 and 1", done, nf)
	}
}

// A correction is due only for a count that saw more of something and no
// less of anything.
func TestSupersedes(t *testing.T) {
	prev := CompletionEvent{Chunks: 4, ChunksDone: 2, ChunksFailed: 1, ChunksCancelled: 1, ItemsFailed: 1}
	for _, tc := range []struct {
		name string
		ev   CompletionEvent
		want bool
	}{
		{"the same", prev, false},
		{"a result after a dead letter", CompletionEvent{ChunksDone: 3, ChunksCancelled: 1, ItemsFailed: 1}, true},
		{"a failure after a cancel", CompletionEvent{ChunksDone: 2, ChunksFailed: 2, ItemsFailed: 1}, true},
		{"an item-error marker seen late", CompletionEvent{ChunksDone: 2, ChunksFailed: 1, ChunksCancelled: 1, ItemsFailed: 2}, true},
		{"a stale count", CompletionEvent{ChunksDone: 1, ChunksFailed: 2, ChunksCancelled: 1, ItemsFailed: 1}, false},
		{"more done, fewer items failed seen", CompletionEvent{ChunksDone: 3, ChunksFailed: 1, ItemsFailed: 0}, false},
	} {
		if got := tc.ev.Supersedes(&prev); got != tc.want {
			t.Errorf("%s: Supersedes = %v; want %v", tc.name, got, tc.want)
		}
	}
}

func TestDoneRevisionKey(t *testing.T) {
	for rev, want := range map[int]string{0: "done/j.json", 1: "done/j.json", 2: "done/j.2.json", 10: "done/j.10.json"} {
		if got := DoneRevisionKey("j", rev); got != want {
			t.Errorf("DoneRevisionKey(j, %d) = %q; want %q", rev, got, want)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
