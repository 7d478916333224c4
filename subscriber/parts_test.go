package subscriber

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/vramq/vramq/job"
)

// checkOutputs checks that r answers specs in order: for each item its
// text's length (the test model's answer), or, where code says, an error
// with that code.
func checkOutputs(t *testing.T, r job.Result, specs []string, codes map[int]string) {
	t.Helper()
	if len(r.Outputs) != len(specs) || r.ItemsFailed != len(codes) {
		t.Fatalf("%d outputs, %d failed; want %d, %d", len(r.Outputs), r.ItemsFailed, len(specs), len(codes))
	}
	for i, o := range r.Outputs {
		if o.ID != fmt.Sprint("i", i) {
			t.Fatalf("output %d is %s: out of order", i, o.ID)
		}
		if code, ok := codes[i]; ok {
			if o.Error == nil || o.Error.Code != code || o.Embedding != nil {
				t.Errorf("item %s: %+v (error %+v), want the error %s", o.ID, o, o.Error, code)
			}
			continue
		}
		if o.Error != nil || len(o.Embedding) != 1 || o.Embedding[0] != float32(len(specs[i])) {
			t.Errorf("item %s: %+v (error %+v), want embedding [%d]", o.ID, o, o.Error, len(specs[i]))
		}
	}
}

// Issue 25, item 10: a chunk of 100 texts estimated at 237 MiB against a
// 179 MiB budget, each text fitting alone, was dead-lettered as too_large.
// It runs in parts that each fit, its outputs in order in one result, and
// never more on the device than the budget.
func TestChunkOverBudgetRunsInParts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 179*mib, Config{})
		specs := make([]string, 100)
		var total int
		for i := range specs {
			mb := 2
			if i*37%100 < 37 { // 37 of 100, spread: i·37 mod 100 takes every value once
				mb = 3
			}
			total += mb
			specs[i] = fmt.Sprintf("mb=%d ms=20", mb)
		}
		if total != 237 {
			t.Fatalf("the chunk is %d MiB, want the issue's 237", total)
		}
		h.send("wide", 0, specs...)
		h.send("next", 0, "mb=1")
		h.endedAll(2)
		h.shutdown()
		if d := h.reasons(); len(d) != 0 {
			t.Fatalf("dead letters %v, want none", d)
		}
		got, _ := h.resultsByKey()
		checkOutputs(t, got[job.Key{JobID: "wide"}], specs, nil)
		if runs := h.model.runs.Load(); runs < 3 {
			t.Errorf("model ran %d times, want the chunk in two parts or more and the next message", runs)
		}
		if h.dev.OOMs() != 0 || h.dev.Peak() > h.sub.MaxBudget() {
			t.Errorf("%d OOMs, device peak %d over the budget %d", h.dev.OOMs(), h.dev.Peak(), h.sub.MaxBudget())
		}
	})
}

// An item that alone exceeds the largest budget is the only one that is too
// large: in a chunk of several it is answered with a too_large error and the
// others run; a chunk whose every item is too large, one item or more, is
// dead-lettered too_large as before. A refused item in a chunk run in parts
// is found within its part.
func TestTooLargeItemIsAnItemError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{})
		mixed := []string{"mb=1", "mb=30", "mb=200", "mb=30", "mb=1 x"}
		h.send("mixed", 0, mixed...)
		refused := make([]string, 100)
		for i := range refused {
			refused[i] = "mb=1"
		}
		refused[70] = "mb=1 invalid"
		h.send("refused", 0, refused...)
		h.send("huge", 0, "mb=100", "mb=100")
		h.send("one", 0, "mb=100")
		h.endedAll(4)
		h.shutdown()
		got, _ := h.resultsByKey()
		checkOutputs(t, got[job.Key{JobID: "mixed"}], mixed, map[int]string{2: "too_large"})
		if o := got[job.Key{JobID: "mixed"}].Outputs[2]; o.Error != nil && !strings.Contains(o.Error.Message, "200.0MiB") {
			t.Errorf("too large item's error %q does not give its estimate", o.Error.Message)
		}
		checkOutputs(t, got[job.Key{JobID: "refused"}], refused, map[int]string{70: job.ItemInvalidInput})
		reasons := h.reasons()
		if len(reasons) != 2 || !strings.HasPrefix(reasons["huge/0"], "too_large: ") || !strings.HasPrefix(reasons["one/0"], "too_large: ") {
			t.Errorf("dead letters %v, want huge/0 and one/0 too_large", reasons)
		}
		if h.dev.OOMs() != 0 {
			t.Errorf("%d OOMs", h.dev.OOMs())
		}
	})
}
