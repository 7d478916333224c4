package modelserver

import (
	"context"
	"errors"
	"sync"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
)

// A group runs a batch's requests, as an errgroup would, with two contexts
// for each: sent, which a request sent to the server runs under, and wait,
// which its waits for a turn run under (the gate, the concurrency bound,
// the rate limits, a retry's delay). The group's first error ends every
// wait, so no request starts after it. It ends the requests already sent
// too, unless it is a backoff: the server took those before it asked for
// the wait and is spending their tokens, so they are answered, and their
// items' outputs go back with the backoff (fault.PartialError) rather than
// being asked for again once it ends.
type group struct {
	wg           sync.WaitGroup
	once         sync.Once
	err          error
	sent, wait   context.Context
	cancel, halt context.CancelFunc
	unlink       func() bool
}

func newGroup(sent, wait context.Context) *group {
	g := &group{}
	g.sent, g.cancel = context.WithCancel(sent)
	g.wait, g.halt = context.WithCancel(wait)
	g.unlink = context.AfterFunc(g.sent, g.halt)
	return g
}

func (g *group) Go(f func(sent, wait context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := f(g.sent, g.wait); err != nil {
			g.once.Do(func() {
				// A wait that sent's end ended through the link reads
				// Canceled, however sent ended, and may be the first to
				// return: when sent's parent's deadline passes, the link's
				// goroutine can cancel wait before the deadline reaches it.
				// Before the group's own error nothing cancels sent but its
				// parent, so sent's error is the cause.
				if errors.Is(err, context.Canceled) && g.sent.Err() != nil {
					err = g.sent.Err()
				}
				g.err = err
				g.halt()
				if !errors.Is(err, fault.ErrBackoff) {
					g.cancel()
				}
			})
		}
	}()
}

// Wait waits for every request and returns the first error.
func (g *group) Wait() error {
	g.wg.Wait()
	g.unlink()
	g.halt()
	g.cancel()
	return g.err
}

// partial is err with the outputs of the items that finished (answered, or
// refused as the item's own fault) when err is a backoff and some did.
func partial(err error, outs []job.Output) error {
	if !errors.Is(err, fault.ErrBackoff) {
		return err
	}
	done := make([]bool, len(outs))
	some := false
	for i, o := range outs {
		// Every output Run settles on has one or the other: an answer, or
		// the item's own error.
		done[i] = o.Response != nil || o.Error != nil
		some = some || done[i]
	}
	if !some {
		return err
	}
	return &fault.PartialError[job.Output]{Err: err, Outputs: outs, Done: done}
}
