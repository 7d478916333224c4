package subscriber

import (
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
)

// probeBackoffMax bounds the clean run a probe waits for, as a multiple of
// the configured one: it doubles after each probe that ran out of memory, so
// a limit just under what fits costs one OOM per that many full batches at
// worst, and not one every few batches.
const probeBackoffMax = 64

// learned is what the subscriber found out by running out of memory: the
// largest batch that fits. It goes down on an OOM split where a smaller
// batch then fitted, unless a message of the batch then failed alone too
// (runBatch: that message was the cause, not the batch's size), and back up
// one step at a time (a probe) after a run of clean full batches or when the
// budget grows, since what did not fit may have been a few large inputs that
// are gone, or memory another process has given back. It is kept in a state
// file so the next start does not find it out again the hard way.
//
// The hysteresis: a probe is confirmed by one full batch at the new limit;
// an OOM before that puts the limit back and doubles the clean run the next
// probe waits for (up to probeBackoffMax times), and a budget increase
// brings a probe forward only when the budget is above the one of the last
// failure.
type learned struct {
	path, model, device string
	log                 *slog.Logger
	m                   *metrics // nil in tests of the policy alone

	mu         sync.Mutex
	limit      int
	max        int   // MaxBatch: never probed above
	base       int   // clean full batches before a probe; 0: never probe
	need       int   // clean full batches before the next probe
	clean      int   // full batches since the limit last changed, none of them out of memory
	probeFrom  int   // the limit before the probe in progress; 0 when none is
	failBudget int64 // the budget at the last OOM
}

type learnedFile struct {
	Model      string `json:"model"`
	Device     string `json:"device"`
	BatchLimit int    `json:"batch_limit"`
	// ProbeAfter is the clean run the next probe waits for, when failed
	// probes have raised it; absent in files from before probes.
	ProbeAfter int `json:"probe_after,omitempty"`
}

// loadLearned starts from maxBatch, or from the limit in the state file at
// path when it is for this model and device. probeAfter is the clean run
// before a probe (Config.BatchLimitProbeAfter); at most 0, never.
func loadLearned(path, model, device string, maxBatch, probeAfter int, log *slog.Logger) *learned {
	l := &learned{path: path, model: model, device: device, log: log, limit: maxBatch, max: maxBatch}
	if probeAfter > 0 {
		l.base, l.need = probeAfter, probeAfter
	}
	if path == "" {
		return l
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return l
	}
	var f learnedFile
	if err == nil {
		err = json.Unmarshal(b, &f)
	}
	switch {
	case err != nil:
		log.Warn("ignoring unreadable state file", "path", path, "err", err)
	case f.Model != model || f.Device != device:
		log.Info("state file is for another model or device; starting afresh", "path", path, "model", f.Model, "device", f.Device)
	case f.BatchLimit > 0 && f.BatchLimit < maxBatch:
		l.limit = f.BatchLimit
		if l.base > 0 && f.ProbeAfter > l.base {
			l.need = min(f.ProbeAfter, l.base*probeBackoffMax)
		}
		log.Warn("batch limit from an earlier out-of-memory", "batch_limit", l.limit, "max_batch", maxBatch, "path", path,
			"probe_after", l.need, "growth", l.base > 0)
	}
	return l
}

func (l *learned) batchLimit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// ran records that a batch of n messages ran without running out of memory,
// and probes one step up when that completes the clean run.
func (l *learned) ran(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n < l.limit {
		return // not full: says nothing about the limit
	}
	l.clean++
	if l.probeFrom > 0 {
		l.log.Info("batch limit probe held", "batch_limit", l.limit, "from", l.probeFrom)
		l.probeFrom, l.need = 0, l.base
	}
	if l.base == 0 || l.limit >= l.max || l.clean < l.need {
		return
	}
	from := l.limit
	l.limit = min(l.max, max(from+1, from*5/4))
	l.probeFrom, l.clean = from, 0
	l.log.Info("batch limit raised: probing", "from", from, "to", l.limit, "clean_batches", l.need, "max_batch", l.max)
	l.changed("probe")
}

// lower records that a batch of worked messages fitted after one of failed
// did not, with the budget at budget. During a probe it is the probe that
// failed: the limit goes back to where it was (or lower, if that is all that
// worked) and the next probe waits for twice the clean run.
func (l *learned) lower(worked, failed int, budget int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if worked >= l.limit || failed > l.limit {
		// A batch bigger than the limit was gathered before the limit
		// came down to where it is: its failure says nothing about the
		// limit now, and the split that found the size that works has
		// reported it already (lower is called at each level).
		return
	}
	from := l.limit
	l.clean, l.failBudget = 0, budget
	if l.probeFrom == 0 {
		l.log.Warn("batch limit lowered after out of memory", "from", from, "to", worked, "failed_at", failed)
		l.limit = worked
		l.changed("oom")
		return
	}
	l.limit = worked
	if failed > l.probeFrom {
		l.limit = max(worked, l.probeFrom) // the size before the probe held
	}
	l.probeFrom = 0
	l.need = min(l.need*2, l.base*probeBackoffMax)
	l.log.Warn("batch limit probe ran out of memory; lowered", "from", from, "to", l.limit, "failed_at", failed,
		"next_probe_after", l.need)
	l.changed("probe_failed")
}

// budgetGrew brings the next probe forward to the next full batch, unless
// the budget is no larger than it was at the last OOM.
func (l *learned) budgetGrew(budget int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.base == 0 || l.limit >= l.max || l.probeFrom > 0 || budget <= l.failBudget || l.clean >= l.need {
		return
	}
	l.log.Info("budget grew: batch limit probe at the next full batch", "batch_limit", l.limit)
	l.clean = l.need
}

// changed exports and saves the limit; l.mu is held.
func (l *learned) changed(cause string) {
	if l.m != nil {
		l.m.batchLimit.Set(float64(l.limit))
		l.m.batchLimitChanges.WithLabelValues(cause).Inc()
	}
	if l.path == "" {
		return
	}
	f := learnedFile{Model: l.model, Device: l.device, BatchLimit: l.limit}
	if l.need > l.base {
		f.ProbeAfter = l.need
	}
	b, _ := json.Marshal(f)
	tmp := l.path + ".tmp"
	err := os.MkdirAll(filepath.Dir(l.path), 0o755)
	if err == nil {
		err = os.WriteFile(tmp, b, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, l.path)
	}
	if err != nil {
		l.log.Warn("could not save the batch limit", "path", l.path, "err", err)
	}
}
