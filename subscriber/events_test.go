package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
)

// List makes memPayloads a Lister, for completion events.
func (p *memPayloads) List(ctx context.Context, prefix string) ([]string, error) {
	p.mu.Lock()
	var keys []string
	for k := range p.objs {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	if p.listed == nil {
		p.listed = map[string]int{}
	}
	if parts := strings.Split(prefix, "/"); len(parts) > 1 {
		p.listed[parts[1]] += len(keys)
	}
	hook := p.listHook
	p.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, prefix, len(keys)); err != nil {
			return nil, err
		}
	}
	sort.Strings(keys)
	return keys, nil
}

// listedFor is how many keys List returned for job jobID, in all.
func (p *memPayloads) listedFor(jobID string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.listed[jobID]
}

// memSink records the events published; fail, when set, decides each
// publish's error.
type memSink struct {
	mu     sync.Mutex
	tries  int
	events []job.CompletionEvent
	fail   func(try int) error
}

func (s *memSink) Publish(ctx context.Context, sent *job.CompletionEvent, body []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tries++
	if s.fail != nil {
		if err := s.fail(s.tries); err != nil {
			return err
		}
	}
	var ev job.CompletionEvent
	if err := json.Unmarshal(body, &ev); err != nil || ev != *sent {
		return errors.New("bad event")
	}
	s.events = append(s.events, ev)
	return nil
}

func (s *memSink) sent() (int, []job.CompletionEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tries, append([]job.CompletionEvent(nil), s.events...)
}

func putManifest(t *testing.T, p *memPayloads, jobID string, chunks int) {
	t.Helper()
	m := job.Manifest{V: job.Version, JobID: jobID, Chunks: chunks, Items: chunks, CreatedAt: time.Now().UTC()}
	for range chunks {
		m.ChunkItems = append(m.ChunkItems, 1)
	}
	b, _ := json.Marshal(m)
	if _, err := p.Put(context.Background(), job.ManifestKey(jobID), b); err != nil {
		t.Fatal(err)
	}
}

// Two subscribers on one queue and bucket, chunks redelivered (sent twice),
// one chunk dead-lettered, and checks repeated after the job settled: one
// event, partial, with the counts; a job with a chunk pending sends none.
func TestCompletionEventOnceAcrossSubscribersAndRedeliveries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, sink := newMemPayloads(), &memSink{}
		putManifest(t, p, "j", 4)
		putManifest(t, p, "running", 2)
		h1 := start(t, 64*mib, Config{Payloads: p, Events: sink})
		h2 := startWith(t, 64*mib, Config{Payloads: p, Events: sink}, func(h *harness, c *Config) {
			c.Queue, c.Results, c.DLQ = h1.work, h1.results, h1.dlq
		})
		for _, c := range []int{0, 1, 2, 0, 1, 2} {
			h1.send("j", c, "mb=1")
		}
		h1.send("j", 3, "mb=1 invalid") // dead-lettered: every item refused
		h1.send("running", 0, "mb=1")
		wait.For(t, time.Minute, "7 results, 1 dead letter and an event", func() bool {
			r, _ := h1.results.Stats()
			d, _ := h1.dlq.Stats()
			n, _ := sink.sent()
			return r == 7 && d == 1 && n >= 1
		})
		h1.shutdown()
		h2.shutdown()
		// Late redeliveries of the job's chunks, at once.
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if err := h2.sub.checkSettled(context.Background(), "j", &jobSettle{witness: -1}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		tries, evs := sink.sent()
		if tries != 1 || len(evs) != 1 {
			t.Fatalf("%d publishes, events %+v; want exactly one", tries, evs)
		}
		ev := evs[0]
		want := job.CompletionEvent{V: job.Version, Event: job.EventJobSettled, JobID: "j", Revision: 1, Status: job.EventPartial,
			Chunks: 4, ChunksDone: 3, ChunksFailed: 1, Items: 4, ItemsDone: 3,
			ResultsURI: "s3://mem/results/j/", FailedURI: "s3://mem/failed/j/", At: ev.At}
		if ev != want {
			t.Errorf("event %+v; want %+v", ev, want)
		}
		if _, ok := p.object(job.DoneKey("j")); !ok {
			t.Error("no done marker")
		}
		if _, ok := p.object(job.DoneKey("running")); ok {
			t.Error("a done marker for a job with a chunk pending")
		}
	})
}

// A publish that fails is tried again after a backoff, by the check that
// made it: one event, and a check after that sends nothing. A job with a
// chunk deleted unrun is cancelled.
func TestCompletionEventPublishFailureRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		sink := &memSink{fail: func(try int) error {
			if try == 1 {
				return errors.New("sns down")
			}
			return nil
		}}
		putManifest(t, p, "c", 2)
		h := start(t, 64*mib, Config{Payloads: p, Events: sink})
		if _, err := p.Put(t.Context(), job.CancelledKey("c", 1), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		h.send("c", 0, "mb=1")
		wait.For(t, time.Hour, "an event", func() bool { _, evs := sink.sent(); return len(evs) == 1 })
		h.shutdown()
		for range 2 {
			if err := h.sub.checkSettled(context.Background(), "c", &jobSettle{witness: -1}); err != nil {
				t.Fatal(err)
			}
		}
		tries, evs := sink.sent()
		if tries != 2 || len(evs) != 1 {
			t.Fatalf("%d publishes, %d sent; want 2 and 1", tries, len(evs))
		}
		if ev := evs[0]; ev.Status != job.EventCancelled || ev.ChunksDone != 1 || ev.ChunksCancelled != 1 || ev.PublishError != "" {
			t.Errorf("event %+v; want cancelled, 1 done, 1 cancelled, no publish_error", ev)
		}
		b, _ := p.object(job.DoneKey("c"))
		var marker job.CompletionEvent
		if err := json.Unmarshal(b, &marker); err != nil || marker.PublishError != "" {
			t.Errorf("done marker %s after the retry; want publish_error cleared", b)
		}
	})
}

// A publish that fails on every try leaves publish_error on the done
// marker once the check gives up; the next check of the job (a redelivery
// of one of its chunks) sends the event and clears it.
func TestCompletionEventPublishErrorMarkerSentByALaterCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		var down atomic.Bool
		down.Store(true)
		sink := &memSink{fail: func(int) error {
			if down.Load() {
				return errors.New("sns down")
			}
			return nil
		}}
		putManifest(t, p, "c", 1)
		h := start(t, 64*mib, Config{Payloads: p, Events: sink})
		h.send("c", 0, "mb=1")
		wait.For(t, time.Hour, "the check to give up", func() bool {
			return counter(h.sub.m.events.WithLabelValues("dropped")) == 1
		})
		if tries, _ := sink.sent(); tries != settleTries {
			t.Errorf("%d publishes; want %d, one a try", tries, settleTries)
		}
		var marker job.CompletionEvent
		b, _ := p.object(job.DoneKey("c"))
		if err := json.Unmarshal(b, &marker); err != nil || marker.PublishError != "sns down" {
			t.Fatalf("done marker %s after failed publishes; want publish_error", b)
		}
		down.Store(false)
		h.sub.jobSettling("c")
		wait.For(t, time.Minute, "the event", func() bool { _, evs := sink.sent(); return len(evs) == 1 })
		h.shutdown()
		b, _ = p.object(job.DoneKey("c"))
		marker = job.CompletionEvent{}
		if err := json.Unmarshal(b, &marker); err != nil || marker.PublishError != "" || marker.Revision != 1 {
			t.Errorf("done marker %s after the retry; want revision 1, publish_error cleared", b)
		}
	})
}

func TestEventsNeedAListingBucket(t *testing.T) {
	c := Config{Events: &memSink{}}
	err := c.Validate()
	var fe *FieldError
	found := false
	for _, e := range unjoin(err) {
		if errors.As(e, &fe) && fe.Field == "Events" {
			found = true
		}
	}
	if !found {
		t.Errorf("Validate: %v; want an Events error", err)
	}
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
