package subscriber

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fullRuns reports n full batches at the limit as they would go: each one
// as big as the limit is at the time.
func fullRuns(l *learned, n int) {
	for range n {
		l.ran(l.batchLimit())
	}
}

// After an OOM the limit comes back one step per clean run, confirmed by a
// full batch at each new limit, and stops at MaxBatch.
func TestLearnedGrowsBackAfterCleanRuns(t *testing.T) {
	l := loadLearned("", "m", "d", 16, 4, quiet())
	l.lower(2, 16, 100)
	if got := l.batchLimit(); got != 2 {
		t.Fatalf("limit %d after an OOM split that worked at 2, want 2", got)
	}
	for range 100 {
		l.ran(1) // batches below the limit say nothing about it
	}
	if got := l.batchLimit(); got != 2 {
		t.Fatalf("limit %d after batches that never filled it, want 2", got)
	}
	fullRuns(l, 3)
	if got := l.batchLimit(); got != 2 {
		t.Fatalf("limit %d after 3 of 4 clean full batches, want 2", got)
	}
	var steps []int
	for range 40 {
		before := l.batchLimit()
		fullRuns(l, 1)
		if after := l.batchLimit(); after != before {
			steps = append(steps, after)
		}
	}
	// +1 until 25% is more; a step every 4 full batches (the probe's
	// confirming batch counts as the first of the next run); never above 16.
	want := []int{3, 4, 5, 6, 7, 8, 10, 12, 15, 16}
	if len(steps) != len(want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
	for i := range want {
		if steps[i] != want[i] {
			t.Fatalf("steps %v, want %v", steps, want)
		}
	}
}

// A workload that fits 6 and never 7: each failed probe doubles the clean
// run before the next, so OOMs from probing thin out (no flapping), and the
// limit is never left below what fits.
func TestLearnedFailedProbesBackOff(t *testing.T) {
	const fits, base = 6, 4
	if probeBackoffMax != 1<<6 {
		t.Fatalf("the gaps below assume probeBackoffMax 64, not %d", probeBackoffMax)
	}
	l := loadLearned("", "m", "d", 8, base, quiet())
	l.lower(fits, 8, 100)
	var ooms []int // batch number of each OOM
	for i := range 20000 {
		n := l.batchLimit()
		if n > fits {
			ooms = append(ooms, i)
			l.lower(fits/2, n, 100) // split in halves: 3 worked
			continue
		}
		if n < fits {
			t.Fatalf("batch %d: limit %d below the %d that always fits", i, n, fits)
		}
		l.ran(n)
	}
	if len(ooms) < 2 {
		t.Fatalf("%d failed probes in 20000 batches; the test does not exercise the back-off", len(ooms))
	}
	for k := 1; k < len(ooms); k++ {
		gap := ooms[k] - ooms[k-1] - 1 // clean full batches between two failed probes
		want := base << min(k, 6)      // 6: probeBackoffMax is 2⁶
		if gap != want {
			t.Errorf("%d clean batches between failed probes %d and %d, want %d", gap, k, k+1, want)
		}
	}
	if n := len(ooms); n > 8+20000/(base*probeBackoffMax) {
		t.Errorf("%d failed probes in 20000 batches", n)
	}
}

// An OOM during a probe on a batch no bigger than before the probe is the
// inputs', not the probe's: the limit goes down to what worked.
func TestLearnedOOMBelowProbeLowersToWhatWorked(t *testing.T) {
	l := loadLearned("", "m", "d", 8, 2, quiet())
	l.lower(4, 8, 100)
	fullRuns(l, 2)
	if got := l.batchLimit(); got != 5 {
		t.Fatalf("limit %d, want the probe at 5", got)
	}
	l.lower(2, 4, 100)
	if got := l.batchLimit(); got != 2 {
		t.Errorf("limit %d after a batch of 4 failed and 2 worked, want 2", got)
	}
	if l.need != 4 {
		t.Errorf("next probe after %d, want 4 (doubled)", l.need)
	}
}

// A budget that grows past the one of the last OOM probes at the next full
// batch; one that does not, does not.
func TestLearnedBudgetGrowthProbes(t *testing.T) {
	l := loadLearned("", "m", "d", 8, 32, quiet())
	l.lower(4, 8, 100)
	l.budgetGrew(100)
	fullRuns(l, 1)
	if got := l.batchLimit(); got != 4 {
		t.Fatalf("limit %d after growth to the budget that ran out of memory, want 4", got)
	}
	l.budgetGrew(200)
	fullRuns(l, 1)
	if got := l.batchLimit(); got != 5 {
		t.Fatalf("limit %d at the first full batch after the budget grew, want the probe at 5", got)
	}
}

// Growth off (a negative BatchLimitProbeAfter) is the old behaviour: down only.
func TestLearnedGrowthOff(t *testing.T) {
	l := loadLearned("", "m", "d", 8, -1, quiet())
	l.lower(2, 8, 100)
	l.budgetGrew(1000)
	fullRuns(l, 10000)
	if got := l.batchLimit(); got != 2 {
		t.Errorf("limit %d with growth off, want 2", got)
	}
}

// The state file keeps the limit and a back-off raised by failed probes;
// files written before probes (no probe_after) still load.
func TestLearnedStateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(path, []byte(`{"model":"m","device":"d","batch_limit":3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	l := loadLearned(path, "m", "d", 8, 4, quiet())
	if l.batchLimit() != 3 || l.need != 4 {
		t.Fatalf("old state file loaded as limit %d, next probe after %d; want 3 and 4", l.batchLimit(), l.need)
	}
	fullRuns(l, 4) // probe to 4
	l.lower(2, 4, 100)
	read := func() learnedFile {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var f learnedFile
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	if f := read(); f.BatchLimit != 3 || f.ProbeAfter != 8 {
		t.Errorf("state after a failed probe %+v, want limit 3 and probe_after 8", f)
	}
	again := loadLearned(path, "m", "d", 8, 4, quiet())
	if again.batchLimit() != 3 || again.need != 8 {
		t.Errorf("reloaded limit %d, next probe after %d; want 3 and 8", again.batchLimit(), again.need)
	}
	fullRuns(again, 200)
	if f := read(); f.BatchLimit != 8 {
		t.Errorf("state after growing back %+v, want limit 8", f)
	}
	if back := loadLearned(path, "m", "d", 8, 4, quiet()); back.batchLimit() != 8 {
		t.Errorf("reloaded limit %d after growing back, want 8", back.batchLimit())
	}
}

// A probe that holds (a full batch at the new limit ran) ends the back-off:
// the next probe waits for the configured run again, not the doubled one.
func TestLearnedHeldProbeResetsBackOff(t *testing.T) {
	l := loadLearned("", "m", "d", 8, 2, quiet())
	l.lower(4, 8, 100)
	fullRuns(l, 2) // probe to 5
	l.lower(2, 5, 100)
	if l.batchLimit() != 4 || l.need != 4 {
		t.Fatalf("after a failed probe: limit %d, next probe after %d; want 4 and 4", l.batchLimit(), l.need)
	}
	fullRuns(l, 4) // probe to 5 again
	fullRuns(l, 1) // holds: the first of the next run
	if l.batchLimit() != 5 {
		t.Fatalf("limit %d, want 5", l.batchLimit())
	}
	fullRuns(l, 1)
	if l.batchLimit() != 6 {
		t.Errorf("limit %d after two full batches at 5, want 6 (the run back at 2)", l.batchLimit())
	}
}

// A batch gathered before the limit came down fails at a size above the
// limit: that is no evidence against the limit, or the probe, in force now.
func TestLearnedStaleBatchIsNoEvidence(t *testing.T) {
	l := loadLearned("", "m", "d", 8, 2, quiet())
	l.lower(2, 4, 100) // the inner split of a batch of 8: 4 failed, 2 worked
	l.lower(2, 8, 100) // and the outer
	fullRuns(l, 2)     // probe to 3
	l.lower(2, 4, 100) // another batch of 8 gathered before, split the same way
	l.lower(2, 8, 100)
	if l.batchLimit() != 3 || l.probeFrom != 2 || l.need != 2 {
		t.Errorf("limit %d (probe from %d, next after %d) after stale batches failed; want the probe at 3 still, from 2, run 2",
			l.batchLimit(), l.probeFrom, l.need)
	}
	l.lower(1, 3, 100) // the probe's own size
	if l.batchLimit() != 2 || l.need != 4 {
		t.Errorf("limit %d, next probe after %d after the probe failed; want 2 and 4", l.batchLimit(), l.need)
	}
}
