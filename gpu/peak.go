package gpu

import (
	"sync"
	"sync/atomic"
)

// A PeakCounter is an Allocator that passes allocations on to another and
// keeps the most that was held through it at once: what a model's Measure
// (see package calibrate) reports. Wrapping one Run's allocator, it sees
// that batch and no other. Safe for concurrent use.
type PeakCounter struct {
	mem Allocator

	mu        sync.Mutex
	held, max int64
}

// NewPeakCounter counts what is allocated through it from mem (nil:
// allocates nothing, counts all the same).
func NewPeakCounter(mem Allocator) *PeakCounter { return &PeakCounter{mem: mem} }

// Alloc allocates n bytes from the wrapped Allocator and counts them.
func (c *PeakCounter) Alloc(n int64) (func(), error) {
	free := func() {}
	if c.mem != nil {
		var err error
		if free, err = c.mem.Alloc(n); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	c.held += n
	c.max = max(c.max, c.held)
	c.mu.Unlock()
	var freed atomic.Bool
	return func() {
		if freed.Swap(true) {
			return
		}
		free()
		c.mu.Lock()
		c.held -= n
		c.mu.Unlock()
	}, nil
}

// Peak is the most that was held through c at once.
func (c *PeakCounter) Peak() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.max
}
