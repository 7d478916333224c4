// Package batcher gathers items into batches, bounded by count and bytes,
// and hands each batch to a handler, with a bound on the handlers running
// at once.
//
// A batch goes to the handler when it is full, when it has waited the
// longest delay allowed, or when Flush or Shutdown asks for it. The design
// is gocloud.dev/pubsub/batcher's with a delay added: an SQS call of up to
// ten entries costs the same whether it carries one or ten, so an item may
// wait a little for company.
//
// Cut is the one rule for cutting a list into groups bounded by a count
// and a size: the batches here, a job's chunks, SendMessageBatch calls,
// a model server's shared requests.
package batcher

import (
	"context"
	"sync"
	"time"
)

// Options bound batches and handlers. Each field's zero means no bound, so
// the zero Options hand each item over at once, as a batch of its own.
type Options struct {
	// MaxItems is the most items in a batch.
	MaxItems int
	// MaxBytes is the most bytes in a batch, by the sizes given to Add. An
	// item larger than MaxBytes is a batch of its own.
	MaxBytes int
	// MaxDelay is the longest a batch that is not full waits for more
	// items: counted from when its first item was added, or from when the
	// batch before it was taken, whichever is later.
	MaxDelay time.Duration
	// MaxHandlers is the most handler calls running at once. A batch ready
	// while every handler is busy waits, and goes when one returns, with
	// the items that joined it meanwhile.
	MaxHandlers int
	// OnCaller makes Add and Flush run the handler, on their own goroutine
	// and before they return, for the batches they make ready and that may
	// start at once: the caller that fills a batch pays for its call, and
	// no goroutine is started for it. Without it, every handler call has a
	// goroutine of its own and Add and Flush never wait for a handler. A
	// batch whose delay is over runs on the timer's goroutine either way,
	// and one that waited for a free handler on a goroutine of its own.
	OnCaller bool
}

// take returns how many of n items, whose sizes size gives, make the first
// batch (by Bounds.Take), and whether that batch is full (see full).
func (o Options) take(n int, size func(i int) int) (k int, full bool) {
	k, bytes := Bounds{Count: o.MaxItems, Size: int64(o.MaxBytes)}.Take(n, func(i int) (int, int64) { return 1, int64(size(i)) })
	return k, k < n || o.full(k, int(bytes))
}

// full reports whether a batch of n items and bytes takes no more: it
// holds MaxItems, or MaxBytes or more. (take also counts one full whose
// next item would take it over MaxBytes.)
func (o Options) full(n, bytes int) bool {
	return (o.MaxItems > 0 && n >= o.MaxItems) || (o.MaxBytes > 0 && bytes >= o.MaxBytes)
}

// fits reports whether n items of bytes in all, the first of them pending
// or more, make one batch.
func (o Options) fits(n, bytes int) bool {
	return (o.MaxItems <= 0 || n <= o.MaxItems) && (o.MaxBytes <= 0 || bytes <= o.MaxBytes || n == 1)
}

// Split cuts items, in order, into the batches a Batcher with o makes of
// items that are all pending at once: within MaxItems and MaxBytes, size
// giving each item's bytes (Cut, each item counting one). The batches share
// items' backing array.
func Split[T any](items []T, size func(T) int, o Options) [][]T {
	return Cut(items, Bounds{Count: o.MaxItems, Size: int64(o.MaxBytes)}, func(t T) (int, int64) { return 1, int64(size(t)) })
}

// A Batcher gathers items and hands them to its handler in batches, in the
// order they were added (batches that run at once may finish in any
// order). Its methods may be called from any goroutine. The handler may run
// on several at once, up to MaxHandlers, and owns the slice it is given; it
// may call Add and Flush, but not Shutdown, which would wait for it.
type Batcher[T any] struct {
	opts    Options
	handler func([]T)

	mu      sync.Mutex
	pending []entry[T]
	bytes   int // of what is pending
	// due is set once what is pending must go without waiting to fill a
	// batch: its delay is over, or Flush asked. Cleared when nothing is
	// pending.
	due     bool
	closed  bool // Shutdown was called: nothing waits any more
	running int  // handler calls started and not returned
	// deadline is when the first pending batch goes, full or not; zero
	// when none is set. The timer is not stopped when a batch goes before
	// its deadline: it fires as set, finds the deadline ahead (or none),
	// and sets itself again for what is left. So a batch that fills costs
	// no timer call, and a timer set for an earlier batch cannot send the
	// next items early, in a batch of one.
	deadline time.Time
	timer    *time.Timer
	timerSet bool          // the timer is set and has not fired
	drained  chan struct{} // made by Shutdown, closed once nothing is pending or running
}

type entry[T any] struct {
	item T
	size int
}

// New returns a Batcher that hands batches to handler.
func New[T any](o Options, handler func(batch []T)) *Batcher[T] {
	return &Batcher[T]{opts: o, handler: handler}
}

// Add adds item, of size bytes as counted against MaxBytes, and hands over
// the batch that this makes ready, if any. After Shutdown, items go at once.
func (b *Batcher[T]) Add(item T, size int) {
	b.mu.Lock()
	b.pending = append(b.pending, entry[T]{item, size})
	b.bytes += size
	ready := b.ready()
	b.mu.Unlock()
	b.hand(ready, b.opts.OnCaller)
}

// Flush hands over everything pending without waiting to fill a batch: at
// once where handlers are free, and the rest as they come free. It waits
// only for the handlers it runs itself, under OnCaller.
func (b *Batcher[T]) Flush() {
	b.mu.Lock()
	b.due = len(b.pending) > 0
	ready := b.ready()
	b.mu.Unlock()
	b.hand(ready, b.opts.OnCaller)
}

// Shutdown hands over everything pending, as Flush does, and waits until
// every handler call has returned, or until ctx ends, when it returns ctx's
// error. Items added after it go at once; a second Shutdown waits for them.
func (b *Batcher[T]) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	if b.timerSet { // nothing waits any more
		b.timer.Stop()
		b.timerSet = false
	}
	b.mu.Unlock()
	b.Flush()
	b.mu.Lock()
	if len(b.pending) == 0 && b.running == 0 {
		b.mu.Unlock()
		return nil
	}
	if b.drained == nil {
		b.drained = make(chan struct{})
	}
	drained := b.drained
	b.mu.Unlock()
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Len is the number of items pending: added and not yet handed over.
func (b *Batcher[T]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// hand runs the handler on each batch: one after another on this
// goroutine, or each on a goroutine of its own.
func (b *Batcher[T]) hand(batches [][]T, here bool) {
	for _, batch := range batches {
		if here {
			b.handle(batch)
		} else {
			go b.handle(batch)
		}
	}
}

// handle runs the handler on batch, then starts the batches that waited
// for it to return.
func (b *Batcher[T]) handle(batch []T) {
	b.handler(batch)
	b.mu.Lock()
	b.running--
	ready := b.ready()
	if b.running == 0 && len(b.pending) == 0 && b.drained != nil {
		close(b.drained)
		b.drained = nil
	}
	b.mu.Unlock()
	b.hand(ready, false)
}

// expire hands over what is pending once its deadline has passed.
func (b *Batcher[T]) expire() {
	b.mu.Lock()
	b.timerSet = false
	if b.deadline.IsZero() {
		b.mu.Unlock()
		return
	}
	if wait := time.Until(b.deadline); wait > 0 {
		b.timer.Reset(wait)
		b.timerSet = true
		b.mu.Unlock()
		return
	}
	b.due = true
	ready := b.ready()
	b.mu.Unlock()
	if len(ready) > 0 {
		b.hand(ready[1:], false)
		b.handle(ready[0])
	}
}

// ready takes every batch that may go now, while a handler may start,
// counting a handler as running for each; then it arms the delay of what
// is left. b.mu must be held.
func (b *Batcher[T]) ready() [][]T {
	var out [][]T
	for len(b.pending) > 0 && (b.opts.MaxHandlers <= 0 || b.running < b.opts.MaxHandlers) {
		// Usually what is pending is one batch at most: no need to count.
		k, full := len(b.pending), b.opts.full(len(b.pending), b.bytes)
		if !b.opts.fits(k, b.bytes) {
			k, full = b.opts.take(len(b.pending), func(i int) int { return b.pending[i].size })
		}
		if !full && !b.due && !b.closed && b.opts.MaxDelay > 0 {
			break
		}
		batch := make([]T, k)
		for i := range k {
			batch[i] = b.pending[i].item
			b.bytes -= b.pending[i].size
		}
		n := copy(b.pending, b.pending[k:])
		clear(b.pending[n:])
		b.pending = b.pending[:n]
		b.running++
		b.deadline = time.Time{}
		out = append(out, batch)
	}
	switch {
	case len(b.pending) == 0:
		b.due = false
	case b.deadline.IsZero() && !b.due && !b.closed && b.opts.MaxDelay > 0:
		// A timer already set fires no later than this deadline, which
		// is read before any timer is set: no later than the timer either.
		b.deadline = time.Now().Add(b.opts.MaxDelay)
		switch {
		case b.timerSet:
		case b.timer == nil:
			b.timer = time.AfterFunc(b.opts.MaxDelay, b.expire)
		default:
			b.timer.Reset(b.opts.MaxDelay)
		}
		b.timerSet = true
	}
	return out
}
