package job

import (
	"encoding/json"
	"strconv"
	"strings"
)

// The settlement rule: which keys are a chunk's, what state each chunk of a
// job is in, whether the job is settled, and how many of its items are done
// and failed. The publisher's GET /v1/jobs/{id} (publisher/status.go) and
// the subscriber's completion event (subscriber/events.go) both count with
// these functions and no others, so the two answers cannot disagree.

// StatusRunning is the state of a job some of whose chunks are pending and
// no cancel was asked for; the settled states are EventComplete,
// EventPartial and EventCancelled.
const StatusRunning = "running"

// ChunkOfKey reports which chunk of a job of chunks chunks key names under
// prefix (ResultPrefix, FailedPrefix, CancelledPrefix, ItemErrorsPrefix):
// exactly the key ResultKey and its kin would write, {prefix}{chunk}.json
// with the chunk in strconv.Itoa's form. Anything else under the prefix,
// "01.json", "+1.json", "1.json.bak", a chunk at or past chunks, is no
// chunk's: whoever can write the bucket must not be able to settle a chunk
// with a key the subscribers never write.
func ChunkOfKey(prefix, key string, chunks int) (int, bool) {
	s, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return 0, false
	}
	if s, ok = strings.CutSuffix(s, ".json"); !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= chunks || strconv.Itoa(n) != s {
		return 0, false
	}
	return n, true
}

// ChunkSet is the set of chunks that keys, listed under prefix, name
// (ChunkOfKey); the rest of keys are ignored.
func ChunkSet(prefix string, keys []string, chunks int) map[int]bool {
	set := make(map[int]bool, len(keys))
	for _, k := range keys {
		if n, ok := ChunkOfKey(prefix, k, chunks); ok {
			set[n] = true
		}
	}
	return set
}

// Tally is a job's chunks by state. Each chunk is in at most one set, and a
// chunk in none is pending.
type Tally struct {
	Chunks    int
	Done      map[int]bool // a result is stored
	Failed    map[int]bool // dead-lettered: a failed marker and no result
	Cancelled map[int]bool // deleted unrun: a cancelled marker, no result, no failed marker
}

// Settle tallies a job of chunks chunks from the chunks that have a result,
// a failed marker and a cancelled marker (ChunkSet of each prefix; the maps
// are taken over). A result wins over a failed marker, and either over a
// cancelled marker: a redelivery can run a chunk after it was dead-lettered,
// and anyone who can send to the queue can have a subscriber write a marker
// for a chunk that then runs.
func Settle(chunks int, results, failed, cancelled map[int]bool) Tally {
	t := Tally{Chunks: chunks, Done: map[int]bool{}, Failed: map[int]bool{}, Cancelled: map[int]bool{}}
	for c := range results {
		if c >= 0 && c < chunks {
			t.Done[c] = true
		}
	}
	for c := range failed {
		if c >= 0 && c < chunks && !t.Done[c] {
			t.Failed[c] = true
		}
	}
	for c := range cancelled {
		if c >= 0 && c < chunks && !t.Done[c] && !t.Failed[c] {
			t.Cancelled[c] = true
		}
	}
	return t
}

// Pending is how many chunks have neither a result nor a marker.
func (t Tally) Pending() int {
	return max(t.Chunks-len(t.Done)-len(t.Failed)-len(t.Cancelled), 0)
}

// Settled reports whether no chunk is pending: the job's completion event
// is due.
func (t Tally) Settled() bool { return t.Pending() == 0 }

// PendingChunks lists the pending chunks, in order.
func (t Tally) PendingChunks() []int {
	var out []int
	for c := range t.Chunks {
		if !t.Done[c] && !t.Failed[c] && !t.Cancelled[c] {
			out = append(out, c)
		}
	}
	return out
}

// Status is the job's state. cancelAsked says a cancel record exists
// (DELETE /v1/jobs/{id}): a job with chunks pending is then cancelled
// rather than running. A settled job is cancelled when any chunk was
// deleted unrun, else partial when any was dead-lettered, else complete:
// a job with cancelled chunks is never complete, whatever else is known.
func (t Tally) Status(cancelAsked bool) string {
	switch {
	case t.Pending() > 0 && cancelAsked:
		return EventCancelled
	case t.Pending() > 0:
		return StatusRunning
	case len(t.Cancelled) > 0:
		return EventCancelled
	case len(t.Failed) > 0:
		return EventPartial
	}
	return EventComplete
}

// ItemsFailedOf is how many items of chunk chunk of m the item-error marker
// raw counts: 0 when it is not that chunk's marker, or counts none, or more
// than the chunk holds (anyone who can write the bucket, or whoever could
// once, may have left it; such a count is not used).
func ItemsFailedOf(m *Manifest, chunk int, raw []byte) int {
	var ie ItemErrorsMarker
	if json.Unmarshal(raw, &ie) != nil || ie.JobID != m.JobID || ie.Chunk != chunk ||
		chunk < 0 || chunk >= len(m.ChunkItems) || ie.ItemsFailed <= 0 || ie.ItemsFailed > m.ChunkItems[chunk] {
		return 0
	}
	return ie.ItemsFailed
}

// Items counts the items of m's done chunks: failed, those the model
// refused (itemsFailed, by chunk, from ItemsFailedOf; chunks not done are
// ignored), and done, the others. Items of failed, cancelled and pending
// chunks are in neither.
func (t Tally) Items(m *Manifest, itemsFailed map[int]int) (done, failed int) {
	for c := range t.Done {
		if c >= len(m.ChunkItems) {
			continue
		}
		n := m.ChunkItems[c]
		f := min(max(itemsFailed[c], 0), n)
		done += n - f
		failed += f
	}
	return done, failed
}

// Supersedes reports whether ev, a later count of the same settled job,
// should replace prev, the event already sent (docs/events.md). What a
// count sees only grows: results, failed markers and item-error markers are
// written once and never removed, so chunks done, chunks done or failed,
// and items failed never go down between two counts. ev supersedes prev
// when it saw more of one and no less of any: a count that saw less of
// something (it listed one prefix before a write the other count saw) sends
// nothing, and a later count that saw both sends the union. Each revision
// thus sees strictly more than the one before, so a job has a bounded
// number of them.
func (ev *CompletionEvent) Supersedes(prev *CompletionEvent) bool {
	a := [3]int{ev.ChunksDone, ev.ChunksDone + ev.ChunksFailed, ev.ItemsFailed}
	b := [3]int{prev.ChunksDone, prev.ChunksDone + prev.ChunksFailed, prev.ItemsFailed}
	return a != b && a[0] >= b[0] && a[1] >= b[1] && a[2] >= b[2]
}
