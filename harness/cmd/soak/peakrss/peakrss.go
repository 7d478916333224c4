// Package peakrss follows the peak resident memory (VmHWM) of a changing set
// of processes, read while each runs: /proc forgets a process once it is
// reaped.
package peakrss

import (
	"context"
	"sync"
	"time"

	"github.com/vramq/vramq/internal/testenv/procmem"
)

// Sampler keeps the highest VmHWM of the processes it was shown. It is safe
// for concurrent use; the zero value is ready.
type Sampler struct {
	mu   sync.Mutex
	peak int64
}

// Run notes the peak of every process pids returns, every second, until ctx
// ends.
func (s *Sampler) Run(ctx context.Context, pids func() []int) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		for _, pid := range pids() {
			s.Note(pid)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Note records process pid's peak resident set size so far (VmHWM), read
// while it runs: /proc forgets a process once it is reaped.
func (s *Sampler) Note(pid int) {
	hwm, err := procmem.Peak(pid)
	if err != nil {
		return // gone already
	}
	s.mu.Lock()
	s.peak = max(s.peak, hwm)
	s.mu.Unlock()
}

// Peak is the highest VmHWM noted, in bytes.
func (s *Sampler) Peak() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}
