// Package logscrape reads a subscriber process's log as it is written: it
// passes every byte on to the log file and notes, line by line, when the
// process has started and when its SDK retried a receive.
package logscrape

import (
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Writer writes a subscriber's log to its file and notes when its SDK
// retried a receive.
type Writer struct {
	mu      sync.Mutex
	f       *os.File
	partial []byte
	retries []time.Time
	lines   int
}

// New writes to f; Close closes it.
func New(f *os.File) *Writer { return &Writer{f: f} }

// Started reports whether the process has written a line: the subscriber's
// first is written after its signal handlers are in place.
func (w *Writer) Started() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lines > 0
}

// RetryMark is what the SDK's log line of a retried receive holds.
const RetryMark = "retrying request SQS/ReceiveMessage"

func (w *Writer) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Lines may arrive split across writes: look at whole ones only.
	w.partial = append(w.partial, b...)
	for {
		i := slices.Index(w.partial, '\n')
		if i < 0 {
			break
		}
		w.lines++
		if strings.Contains(string(w.partial[:i]), RetryMark) {
			w.retries = append(w.retries, time.Now())
		}
		w.partial = w.partial[i+1:]
	}
	return w.f.Write(b)
}

// RetriesSince is how many receives the SDK retried at or after t: each may
// have stranded up to ten messages until their visibility timeout.
func (w *Writer) RetriesSince(t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, r := range w.retries {
		if !r.Before(t) {
			n++
		}
	}
	return n
}

// Close closes the log file.
func (w *Writer) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.f.Close()
}
