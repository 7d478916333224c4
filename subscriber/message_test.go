package subscriber

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queuetest"
)

// messageEnds is one received message with everything its ends reach: the
// work queue and its keeper, the DLQ, the bucket, and the admission it
// holds 60 of 100 units of.
type messageEnds struct {
	q, dlq   *queuetest.Mem
	payloads *memPayloads
	s        *Subscriber // its admission only
	t        *task
}

func newMessageEnds(t *testing.T) *messageEnds {
	t.Helper()
	e := &messageEnds{q: queuetest.NewMem(), dlq: queuetest.NewMem(), payloads: newMemPayloads(), s: holdSubscriber(t, 100)}
	e.q.Put(`{"v":1,"job_id":"j1","chunk":0,"items":[{"id":"a","text":"x"}]}`, nil)
	k, m := newTestKeeper(e.q, 30*time.Second, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	go k.run(ctx)
	t.Cleanup(func() {
		cancel()
		if err := k.close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	l := receiveAll(t, e.q, k, 1, 30*time.Second)[0]
	w, err := job.DecodeWork([]byte(l.msg.Body))
	if err != nil {
		t.Fatal(err)
	}
	if !e.s.adm.tryAcquire(60) {
		t.Fatal("no room for 60 of 100")
	}
	e.t = &task{lease: l, work: w, hold: e.s.newHold(need{weight: 60}, 60), ends: &ends{
		keeper: k, dlq: e.dlq, payloads: e.payloads, m: m, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		retry: backoff.Policy{First: time.Second, Max: job.MaxDelay}, maxMessageBytes: job.MaxMessageBytes,
		settling: func(string) {}, ended: newIDSet(),
	}}
	return e
}

// A message ends once, by whichever end comes first: what a later end would
// do (a DLQ copy, a marker, a fresh copy, a visibility change) never
// happens, and what the message held in admission is back after the first.
func TestMessageEndsOnceByItsFirstEnd(t *testing.T) {
	ends := []struct {
		name string
		end  func(*task)
	}{
		{"ack", func(t *task) { t.Ack() }},
		{"release", func(t *task) { t.Release(time.Minute) }},
		{"hand back", func(t *task) { t.HandBack(time.Minute, "wait") }},
		{"dead letter", func(t *task) { t.DeadLetter("invalid_input", "bad") }},
		{"cancel", func(t *task) { t.Cancel() }},
	}
	// What each end leaves behind once the keeper has sent it, alone.
	type trace struct{ deletes, visibility, sends, dlq, markers int }
	seen := func(e *messageEnds) trace {
		return trace{e.q.Calls("Delete"), e.q.Calls("ChangeVisibility"), e.q.Calls("Send"),
			len(e.dlq.All()), e.payloads.count()}
	}
	alone := map[string]trace{}
	for _, first := range ends {
		synctest.Test(t, func(t *testing.T) {
			e := newMessageEnds(t)
			first.end(e.t)
			time.Sleep(time.Second) // past the keeper's batching delay
			alone[first.name] = seen(e)
		})
	}
	for _, first := range ends {
		for _, later := range ends {
			t.Run(first.name+" then "+later.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					e := newMessageEnds(t)
					first.end(e.t)
					if err := unreleased(e.s); err != nil {
						t.Errorf("after %s: %v", first.name, err)
					}
					for _, l := range ends {
						l.end(e.t)
					}
					later.end(e.t)
					time.Sleep(time.Second)
					if got, want := seen(e), alone[first.name]; got != want {
						t.Errorf("%s, then every end: %+v; %s alone: %+v", first.name, got, first.name, want)
					}
					if err := unreleased(e.s); err != nil {
						t.Error(err)
					}
				})
			})
		}
	}
}

func (p *memPayloads) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.objs)
}

// Each outcome ends its message the one way it names, and the two that are
// not ends (the message went on, or waits for the model) leave it held.
func TestOutcomeEndsItsMessage(t *testing.T) {
	type trace struct{ deletes, visibility, sends, dlq, markers int }
	cases := []struct {
		name string
		o    outcome
		want trace
	}{
		{"ack", endAck(), trace{deletes: 1}},
		{"failed", endFailed(), trace{visibility: 1}},
		{"release", endRelease(0), trace{visibility: 1}},
		{"hand back", endHandBack(time.Minute, "wait"), trace{deletes: 1, sends: 1}},
		{"dead letter", endDeadLetter("invalid_input", "bad"), trace{deletes: 1, dlq: 1, markers: 1}},
		{"cancel", endCancel(), trace{deletes: 1, markers: 1}},
		{"carried", outcome{kind: carried}, trace{}},
		{"waits", outcome{kind: waits}, trace{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newMessageEnds(t)
				(&Subscriber{}).end(e.t, c.o)
				time.Sleep(time.Second) // past the keeper's batching delay
				got := trace{e.q.Calls("Delete"), e.q.Calls("ChangeVisibility"), e.q.Calls("Send"),
					len(e.dlq.All()), e.payloads.count()}
				if got != c.want {
					t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
				}
				if ended := e.t.ended.Load(); ended != (c.want != trace{}) {
					t.Errorf("%s: message ended %v", c.name, ended)
				}
			})
		})
	}
}

// The struct that wires the stages stays small (issue 32): a stage's state
// goes in that stage's struct, not beside the others'.
func TestSubscriberWiresStagesInFewFields(t *testing.T) {
	if n := reflect.TypeFor[Subscriber]().NumField(); n > 15 {
		t.Errorf("Subscriber has %d fields; at most 15: group the new state into its stage's struct", n)
	}
}

// slowReading is a device whose every memory reading takes a while, as
// NVML's can on a busy GPU (the per-process reading most).
type slowReading struct {
	gpu.Device
	took time.Duration
}

func (d slowReading) MemInfo() (gpu.MemInfo, error) {
	time.Sleep(d.took)
	return d.Device.MemInfo()
}

// stageSums reads the sum and count of every stage's histogram, and of
// message_seconds under the name "message".
func stageSums(t *testing.T, h *harness) map[string]*dto.Histogram {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.Histogram{}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "vramq_subscriber_stage_seconds":
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetHistogram()
			}
		case "vramq_subscriber_message_seconds":
			out["message"] = mf.GetMetric()[0].GetHistogram()
		}
	}
	return out
}

// At light load a message waits for nothing in the subscriber: in fake
// time, every stage but its run takes no time at all (the delete's is the
// keeper's batching, after the result is out), and the stage histograms
// say so, once per message. No timer, linger or poll wait is in its way:
// not the batch delay (a second here), not the result linger, and not the
// device reading after the batch, which takes 30 ms here and used to come
// before the results.
func TestLightLoadWaitsForNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const run, reading = 5 * time.Millisecond, 30 * time.Millisecond
		h := startWith(t, 100*mib, Config{MaxBatch: 8, MaxBatchDelay: time.Second}, func(h *harness, c *Config) {
			c.Device = slowReading{h.dev, reading}
			// Debug logging reads the device around each batch, on purpose.
			c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		})
		time.Sleep(time.Minute) // idle: the poller waits in a receive
		synctest.Wait()
		h.send("lone", 0, "mb=1 ms=5")
		wait.For(t, time.Minute, "the delete", func() bool { return h.sub.Ledger().Deleted == 1 })
		h.shutdown()
		got := stageSums(t, h)
		want := map[string]time.Duration{"admit": 0, "batch": 0, "run": run, "encode": 0, "send": 0, "message": run}
		for stage, d := range want {
			hist := got[stage]
			if hist == nil || hist.GetSampleCount() != 1 {
				t.Errorf("stage %s: %v, want one observation", stage, hist)
				continue
			}
			if s := hist.GetSampleSum(); s != d.Seconds() {
				t.Errorf("stage %s took %v, want %v", stage, time.Duration(s*1e9), d)
			}
		}
		if hist := got["delete"]; hist.GetSampleCount() != 1 || hist.GetSampleSum() <= 0 {
			t.Errorf("stage delete: %v, want one observation of the keeper's batching wait", hist)
		}
	})
}

// An id cleared and added again is as new as its latest add: the oldest
// ids are forgotten first, and a cleared one holds no place. (A suspect
// cleared by a clean run and suspected again was forgotten as soon as its
// first add was the oldest.)
func TestIDSetForgetsTheOldestFirst(t *testing.T) {
	s := newIDSet()
	s.add("again", "other")
	s.clear("again")
	s.add("again")
	for i := range maxIDs - 2 {
		s.add(strconv.Itoa(i))
	}
	for _, id := range []string{"other", "again", "0", strconv.Itoa(maxIDs - 3)} {
		if !s.has(id) {
			t.Errorf("%s forgotten with %d ids held; want the bound's %d kept", id, maxIDs, maxIDs)
		}
	}
	s.add("new")
	if s.has("other") || !s.has("again") || !s.has("new") {
		t.Errorf("one past the bound: other kept %v, again kept %v, new kept %v; want the oldest, other, forgotten, and the rest kept",
			s.has("other"), s.has("again"), s.has("new"))
	}
}
