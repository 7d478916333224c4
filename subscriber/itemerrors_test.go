package subscriber

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/job"
)

// Issue 20, item 3: an item the model refuses by its content costs only
// itself. Its chunk's result carries the other items' outputs and, for it,
// an error; a chunk whose every item is refused still goes to the DLQ.
func TestRefusedItemIsAnItemError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{MaxBatch: 1})
		h.send("mixed", 0, "mb=1", "mb=1 invalid", "mb=2 xx")
		h.send("allbad", 0, "invalid", "mb=1 invalid")
		h.endedAll(2)
		h.shutdown()
		got, _ := h.resultsByKey()
		r, ok := got[job.Key{JobID: "mixed"}]
		if !ok || len(got) != 1 {
			t.Fatalf("results %v, want the mixed chunk's only", got)
		}
		if len(r.Outputs) != 3 || r.ItemsFailed != 1 {
			t.Fatalf("mixed result: %d outputs, %d failed; want 3, 1: %+v", len(r.Outputs), r.ItemsFailed, r.Outputs)
		}
		for i, want := range []float32{4, 0, 7} { // the test model answers an item's text length
			o := r.Outputs[i]
			if o.ID != []string{"i0", "i1", "i2"}[i] {
				t.Errorf("output %d is %s", i, o.ID)
			}
			if i == 1 {
				if o.Error == nil || o.Error.Code != job.ItemInvalidInput ||
					!strings.Contains(o.Error.Message, "item i1: gpu: invalid input") || o.Embedding != nil {
					t.Errorf("refused item: %+v (error %+v); want invalid_input and no embedding", o, o.Error)
				}
				continue
			}
			if o.Error != nil || len(o.Embedding) != 1 || o.Embedding[0] != want {
				t.Errorf("output %s: %+v (error %+v), want embedding [%v]", o.ID, o, o.Error, want)
			}
		}
		if n := counter(h.sub.m.itemsFailed); n != 1 {
			t.Errorf("items_failed_total %v, want 1", n)
		}
		reasons := h.reasons()
		if len(reasons) != 1 || !strings.HasPrefix(reasons["allbad/0"], "invalid_input: item i0: ") {
			t.Errorf("dead letters %v, want allbad/0's invalid input only", reasons)
		}
		// Bounded: each chunk once whole, then once per item.
		if n := h.model.runs.Load(); n != 2+3+2 {
			t.Errorf("model ran %d times, want 7", n)
		}
	})
}

// An item run alone that outlives its timeout keeps its message's admission
// until the model returns, as a batch does: the message is released for a
// retry, but the device memory the item still uses is not handed to another
// message, which would run out of memory beside it.
func TestTimedOutItemKeepsAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{MaxBatch: 1, InferenceTimeout: time.Second, RetryDelay: 10 * time.Minute})
		h.send("slow", 0, "mb=20", "invalid", "mb=20 stubborn ms=60000")
		waitFor(t, time.Minute, "the slow item timed out", func() bool {
			return counter(h.sub.m.released.WithLabelValues("backoff")) == 1
		})
		h.send("next", 0, "mb=50")
		waitFor(t, 5*time.Minute, "next ended", func() bool { r, _ := h.results.Stats(); d, _ := h.dlq.Stats(); return r+d == 1 })
		time.Sleep(2 * time.Minute) // the stubborn item has returned
		if n := counter(h.sub.m.oomRetries); n != 0 {
			t.Errorf("%d out-of-memory retries: the timed-out item's memory was admitted to another message", n)
		}
		if r, _ := h.results.Stats(); r != 1 {
			t.Errorf("%d results, want next's", r)
		}
		h.stop()
		<-h.done
	})
}
