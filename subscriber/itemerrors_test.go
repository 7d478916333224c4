package subscriber

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/wait"
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
					!strings.Contains(o.Error.Message, "item i1: invalid input") || o.Embedding != nil {
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
		wait.For(t, time.Minute, "the slow item timed out", func() bool {
			return counter(h.sub.m.released.WithLabelValues("backoff")) == 1
		})
		h.send("next", 0, "mb=50")
		wait.For(t, 5*time.Minute, "next ended", func() bool { r, _ := h.results.Stats(); d, _ := h.dlq.Stats(); return r+d == 1 })
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

// Issue 25, item 9: the refused item of a chunk of 999 texts is found by
// halving, in O(log n) runs through the model, not one run per item (1,001
// runs, holding the device all along); every other item keeps its output.
func TestRefusedItemFoundByHalving(t *testing.T) {
	for _, bad := range []int{0, 500, 998} {
		t.Run(fmt.Sprint("bad item ", bad), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 999
				h := start(t, 64*mib, Config{MaxBatch: 1})
				specs := make([]string, n)
				for i := range specs {
					specs[i] = fmt.Sprint("mb=0 text", i)
				}
				specs[bad] = "invalid"
				h.send("big", 0, specs...)
				h.endedAll(1)
				h.shutdown()
				got, _ := h.resultsByKey()
				r, ok := got[job.Key{JobID: "big"}]
				if !ok {
					t.Fatalf("no result; dead letters %v", h.reasons())
				}
				if len(r.Outputs) != n || r.ItemsFailed != 1 {
					t.Fatalf("%d outputs, %d failed; want %d, 1", len(r.Outputs), r.ItemsFailed, n)
				}
				for i, o := range r.Outputs {
					if o.ID != fmt.Sprint("i", i) {
						t.Fatalf("output %d is %s: out of order", i, o.ID)
					}
					if i == bad {
						if o.Error == nil || o.Error.Code != job.ItemInvalidInput || o.Embedding != nil {
							t.Errorf("refused item: %+v (error %+v)", o, o.Error)
						}
						continue
					}
					if o.Error != nil || len(o.Embedding) != 1 || o.Embedding[0] != float32(len(specs[i])) {
						t.Fatalf("output %s: %+v (error %+v)", o.ID, o, o.Error)
					}
				}
				// The whole once, then at most two halves per level of a
				// bisection of 999 (⌈log₂ 999⌉ = 10 levels).
				if runs := h.model.runs.Load(); runs > 1+2*10 {
					t.Errorf("model ran %d times for one refused item in %d, want at most 21", runs, n)
				}
			})
		})
	}
}

// The search is bounded: a chunk with many refused items spread through it
// costs at most the bound's runs, not one per item or the 2n of a full
// bisection. Items it did not get to run apart are answered with an error
// that says so; the items of the groups that ran keep their outputs, and
// the chunk is not dead-lettered.
func TestRefusedItemSearchIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 999
		h := start(t, 64*mib, Config{MaxBatch: 1})
		specs := make([]string, n)
		for i := range specs {
			specs[i] = "mb=0"
			if i%20 == 3 {
				specs[i] = "invalid"
			}
		}
		h.send("spread", 0, specs...)
		h.endedAll(1)
		h.shutdown()
		bound := isolationRuns(n)
		if runs := h.model.runs.Load(); runs > int64(1+bound) {
			t.Errorf("model ran %d times, want at most 1 + %d", runs, bound)
		}
		got, _ := h.resultsByKey()
		r, ok := got[job.Key{JobID: "spread"}]
		if !ok {
			t.Fatalf("no result; dead letters %v", h.reasons())
		}
		answered, unsearched := 0, 0
		for i, o := range r.Outputs {
			switch {
			case o.Error == nil:
				answered++
				if specs[i] == "invalid" {
					t.Errorf("refused item %s has an answer", o.ID)
				}
			case strings.Contains(o.Error.Message, "stopped at its bound"):
				unsearched++
			case specs[i] != "invalid":
				t.Errorf("item %s: error %+v, but the model does not refuse it", o.ID, o.Error)
			}
		}
		if answered == 0 || unsearched == 0 || r.ItemsFailed != n-answered {
			t.Errorf("%d answered, %d not searched, %d failed of %d", answered, unsearched, r.ItemsFailed, n)
		}
	})
}
