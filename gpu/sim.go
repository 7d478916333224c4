package gpu

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vramq/vramq/internal/bytesize"
)

// Allocator hands out device memory. Models take their weights and working
// memory from one, so that a simulated device runs out of memory exactly
// where a real one of the same size would.
type Allocator interface {
	// Alloc reserves n bytes. On success free returns them; calling free
	// more than once is harmless. When the memory is not there, err wraps
	// ErrOutOfMemory.
	Alloc(n int64) (free func(), err error)
}

// Sim is a device of fixed capacity whose memory vramq accounts itself: the
// CPU reference model allocates from it, and the subscriber admits work
// against it, so OOM handling can be exercised without a GPU. The zero value
// is a device with no memory; use NewSim. A Sim is safe for concurrent use.
//
// To simulate another process holding memory on a shared device, Alloc it
// from the test: the Sim cannot tell processes apart, so MemInfo counts it in
// Process as well.
type Sim struct {
	capacity int64

	mu   sync.Mutex
	used int64
	peak int64
	ooms int64
}

var (
	_ Device    = (*Sim)(nil)
	_ Allocator = (*Sim)(nil)
)

// NewSim returns a simulated device with capacity bytes of memory.
func NewSim(capacity int64) *Sim {
	return &Sim{capacity: max(capacity, 0)}
}

// Alloc reserves n bytes, or fails with an error wrapping ErrOutOfMemory
// when fewer than n are free. It never blocks waiting for memory: a real
// device doesn't either, and waiting is the admission semaphore's job.
func (s *Sim) Alloc(n int64) (free func(), err error) {
	if n < 0 {
		return nil, fmt.Errorf("sim: allocate %d bytes: negative size", n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Compared as n > capacity-used so a huge n cannot overflow the sum.
	if n > s.capacity-s.used {
		s.ooms++
		return nil, fmt.Errorf("%w: sim: requested %d bytes (%s) with %d in use of %d (%s)",
			ErrOutOfMemory, n, bytesize.Format(n), s.used, s.capacity, bytesize.Format(s.capacity))
	}
	s.used += n
	s.peak = max(s.peak, s.used)
	var freed atomic.Bool
	return func() {
		if freed.Swap(true) {
			return
		}
		s.mu.Lock()
		s.used -= n
		s.mu.Unlock()
	}, nil
}

// Peak is the most memory that has been in use at once.
func (s *Sim) Peak() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// OOMs counts the allocations that failed for want of memory.
func (s *Sim) OOMs() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ooms
}

// Name is "sim".
func (s *Sim) Name() string { return "sim" }

// Simulated is true.
func (s *Sim) Simulated() bool { return true }

// MemInfo reports the capacity and what Alloc has handed out and not yet
// had back.
func (s *Sim) MemInfo() (MemInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return MemInfo{
		Total:   s.capacity,
		Free:    s.capacity - s.used,
		Used:    s.used,
		Process: s.used,
	}, nil
}

// Close does nothing: memory still allocated stays accounted, so a test can
// check for leaks after closing.
func (s *Sim) Close() error { return nil }
