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

// learned is what the subscriber found out by running out of memory: the
// largest batch that fits. It only ever goes down, and it is kept in a state
// file so the next start does not find it out again the hard way.
type learned struct {
	path, model, device string
	log                 *slog.Logger

	mu    sync.Mutex
	limit int
}

type learnedFile struct {
	Model      string `json:"model"`
	Device     string `json:"device"`
	BatchLimit int    `json:"batch_limit"`
}

func loadLearned(path, model, device string, maxBatch int, log *slog.Logger) *learned {
	l := &learned{path: path, model: model, device: device, log: log, limit: maxBatch}
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
		log.Warn("batch limit from an earlier out-of-memory", "batch_limit", l.limit, "max_batch", maxBatch, "path", path)
	}
	return l
}

func (l *learned) batchLimit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// lower records that a batch of worked messages fitted after one of failed
// did not.
func (l *learned) lower(worked, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if worked >= l.limit {
		return
	}
	l.log.Warn("batch limit lowered after out of memory", "from", l.limit, "to", worked, "failed_at", failed)
	l.limit = worked
	if l.path == "" {
		return
	}
	b, _ := json.Marshal(learnedFile{Model: l.model, Device: l.device, BatchLimit: l.limit})
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
