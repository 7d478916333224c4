package subscriber

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
)

// scriptedModel answers its nth run by script[n-1], and runs the test model
// for a nil step or past the script's end.
type scriptedModel struct {
	*testModel
	calls  atomic.Int64
	script []func(ctx context.Context) error
}

func (m *scriptedModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	if n := int(m.calls.Add(1)); n <= len(m.script) && m.script[n-1] != nil {
		return nil, m.script[n-1](ctx)
	}
	return m.testModel.Run(ctx, items)
}

// A receive whose lease lapsed while it ran (a heartbeat held up on a busy
// machine) runs out of memory alone after another receive of the message
// took it over: it must not dead-letter the chunk, which the other receive
// answered, or will (under load in TestE2EOOMStorm, chunks ended both
// answered and dead-lettered). The other receive's result is the evidence
// when it is out first; the lapsed lease when it is not yet.
func TestLapsedReceiveDoesNotDeadLetter(t *testing.T) {
	oom := func(context.Context) error { return fmt.Errorf("injected: %w", gpu.ErrOutOfMemory) }
	for _, tc := range []struct {
		name string
		// visibility: 3 s lets the heartbeat find the first lease lost; ten
		// minutes send no heartbeat within the test, so only the other
		// receive's result can tell.
		visibility time.Duration
		// second is the second receive's run; the first receive's alone
		// run (out of memory) is the third.
		second func(context.Context) error
	}{
		{"answered", 10 * time.Minute, nil},
		{"lapsed", 3 * time.Second, func(context.Context) error { return errors.New("injected: a failure that passes") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				first := make(chan struct{})
				var model *scriptedModel
				h := startWith(t, 64*mib, Config{Visibility: tc.visibility, RetryDelay: time.Second}, func(h *harness, cfg *Config) {
					model = &scriptedModel{testModel: h.model, script: []func(context.Context) error{
						func(ctx context.Context) error { <-first; return oom(ctx) },
						tc.second,
						oom,
					}}
					cfg.Backend = backend.InProcess{Model: model}
				})
				h.send("twice", 0, "mb=1")
				wait.For(t, time.Minute, "the first run", func() bool { return model.calls.Load() == 1 })
				h.work.Expire(h.work.All()[0].Handle)
				wait.For(t, time.Minute, "the second receive's run", func() bool { return model.calls.Load() >= 2 })
				switch tc.name {
				case "answered":
					wait.For(t, time.Minute, "the second receive's result", func() bool { r, _ := h.results.Stats(); return r == 1 })
				case "lapsed":
					wait.For(t, time.Minute, "the first lease found lost", func() bool {
						return counter(h.sub.m.leasesLost.WithLabelValues("extend")) > 0
					})
				}
				close(first)
				wait.For(t, time.Minute, "the first receive's alone run", func() bool { return model.calls.Load() >= 3 })
				wait.For(t, time.Minute, "a result or a dead letter, and every lease ended", func() bool {
					r, _ := h.results.Stats()
					d, _ := h.dlq.Stats()
					return r+d > 0 && h.sub.keeper.held.Load() == 0
				})
				h.shutdown()
				if d := h.dlq.All(); len(d) != 0 {
					t.Errorf("%d dead letters, first %q: another receive of the message holds it or answered it", len(d), d[0].Attributes[job.AttrReason])
				}
				if r, _ := h.results.Stats(); r != 1 {
					t.Errorf("%d results; want the other receive's one", r)
				}
				if live, _ := h.work.Stats(); live != 0 {
					t.Errorf("%d messages left on the work queue", live)
				}
			})
		})
	}
}

// A message dead-lettered whose delete then finds its lease lapsed is
// received again: it must be deleted, not run again, or a chunk in the DLQ
// gets its result too.
func TestDeadLetteredMessageReceivedAgainIsNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var model *scriptedModel
		h := startWith(t, 64*mib, Config{RetryDelay: time.Second}, func(h *harness, cfg *Config) {
			model = &scriptedModel{testModel: h.model, script: []func(context.Context) error{
				func(context.Context) error { return fmt.Errorf("injected: %w", fault.ErrInvalidInput) },
			}}
			cfg.Backend = backend.InProcess{Model: model}
			// The lease lapses while the DLQ copy goes out: the delete that
			// follows it finds the message back on the queue.
			h.dlq.SendErr = func(string) error {
				for _, m := range h.work.All() {
					h.work.Expire(m.Handle)
				}
				return nil
			}
		})
		h.send("dead", 0, "mb=1")
		wait.For(t, time.Minute, "the dead letter", func() bool { d, _ := h.dlq.Stats(); return d == 1 })
		wait.For(t, time.Minute, "the message gone from the work queue", func() bool { live, _ := h.work.Stats(); return live == 0 })
		h.shutdown()
		if r, _ := h.results.Stats(); r != 0 {
			t.Errorf("%d results for a chunk in the DLQ", r)
		}
		if n := model.calls.Load(); n != 1 {
			t.Errorf("the model ran %d times; want once, not again after the dead letter", n)
		}
		if l := h.sub.Ledger(); l.Received != 2 || l.Lost != 1 {
			t.Errorf("ledger %+v: want the message received twice, its first delete lost", l)
		}
	})
}

// A message that comes late in a long poll longer than its visibility is
// not taken for lapsed: poison received then is dead-lettered on that
// receive, not released to be received again.
func TestLateInLongPollIsNotLapsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{Visibility: 3 * time.Second, WaitTime: 20 * time.Second})
		wait.For(t, time.Minute, "the first long poll", func() bool { return h.work.Calls("Receive") > 0 })
		time.Sleep(16 * time.Second) // into that poll, past the visibility
		h.work.Put(`not json`, nil)
		wait.For(t, time.Minute, "the dead letter", func() bool { d, _ := h.dlq.Stats(); return d == 1 })
		h.shutdown()
		if l := h.sub.Ledger(); l.Received != 1 {
			t.Errorf("ledger %+v: want the poison received once", l)
		}
	})
}
