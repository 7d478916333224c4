package main

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber"
)

// TestOfflineBoundN checks the bound for n devices against the arithmetic
// written out: n devices share the work (one launch still comes first) and
// the memory-time.
func TestOfflineBoundN(t *testing.T) {
	tm := timed.Timing{Launch: 10 * time.Millisecond, Throughput: 1 << 20}
	costs := []int64{1 << 20, 1 << 20, 4 << 20} // 6 s of work at 1 MiB/s
	budget := int64(8 << 20)
	one := offlineBoundN(costs, tm, budget, 1)
	if one != offlineBound(costs, tm, budget) {
		t.Fatalf("n=1 differs from the one-device bound: %+v", one)
	}
	if math.Abs(one.WorkSeconds-6.01) > 1e-9 {
		t.Fatalf("one device's work bound %.4f s, want 6.01", one.WorkSeconds)
	}
	three := offlineBoundN(costs, tm, budget, 3)
	if math.Abs(three.WorkSeconds-(6.0/3+0.01)) > 1e-9 {
		t.Errorf("three devices' work bound %.4f s, want 2.01", three.WorkSeconds)
	}
	// Memory-time: (1+1+16) MiB·s / 8 MiB = 2.25 s on one device.
	if math.Abs(one.MemorySeconds-2.25) > 1e-9 || math.Abs(three.MemorySeconds-0.75) > 1e-9 {
		t.Errorf("memory bounds %.4f and %.4f s, want 2.25 and 0.75", one.MemorySeconds, three.MemorySeconds)
	}
	if want := 3 / 2.01; math.Abs(three.MessagesPerS-want) > 1e-9 || three.Binding != "device throughput" {
		t.Errorf("three devices: %.4f messages/s bound by %s, want %.4f by device throughput", three.MessagesPerS, three.Binding, want)
	}
}

func TestShapeWorks(t *testing.T) {
	works, _, err := shapeWorks("1-in-3", 9)
	if err != nil {
		t.Fatal(err)
	}
	var large int
	for _, w := range works {
		if len(w.Items) == 32 {
			large++
		}
	}
	if len(works) != 9 || large != 3 {
		t.Errorf("1-in-3 of 9: %d messages, %d large; want 9 and 3", len(works), large)
	}
	if works, _, err := shapeWorks("heavy", 5); err != nil || len(works) != 5 {
		t.Errorf("heavy of 5: %d messages, %v", len(works), err)
	}
	for _, bad := range []string{"1-in-0", "1-in-x", "2-in-5", "", "pareto"} {
		if _, _, err := shapeWorks(bad, 5); err == nil {
			t.Errorf("shape %q accepted", bad)
		}
	}
}

// fakeWork is a work queue that hands out msgs once and fails the deletes
// of the handles in fail.
type fakeWork struct {
	msgs []subscriber.Message
	fail map[string]bool
}

func (f *fakeWork) Receive(context.Context, int, time.Duration, time.Duration) ([]subscriber.Message, error) {
	m := f.msgs
	f.msgs = nil
	return m, nil
}

func (f *fakeWork) Delete(_ context.Context, handles []string) ([]error, error) {
	errs := make([]error, len(handles))
	for i, h := range handles {
		if f.fail[h] {
			errs[i] = errors.New("receipt handle invalid")
		}
	}
	return errs, nil
}

func (f *fakeWork) ChangeVisibility(context.Context, []string, time.Duration) ([]error, error) {
	return nil, nil
}

// TestRecordingQueueCountsCompletions checks the per-subscriber spread:
// only deletes SQS confirmed count, large ones by the large set, and a
// message's first receipt is kept across subscribers.
func TestRecordingQueueCountsCompletions(t *testing.T) {
	msg := func(h string, chunk string) subscriber.Message {
		return subscriber.Message{Handle: h, Attributes: map[string]string{job.AttrJobID: "j", job.AttrChunk: chunk}}
	}
	rec := &receipts{first: map[job.Key]time.Time{}}
	large := map[job.Key]bool{{JobID: "j", Chunk: 1}: true, {JobID: "j", Chunk: 2}: true}
	fw := &fakeWork{msgs: []subscriber.Message{msg("a", "0"), msg("b", "1"), msg("c", "2")}, fail: map[string]bool{"c": true}}
	q := &recordingQueue{Queue: fw, rec: rec, large: large, keys: map[string]job.Key{}}
	ctx := context.Background()
	if _, err := q.Receive(ctx, 10, 0, 0); err != nil {
		t.Fatal(err)
	}
	first, ok := rec.firstReceipt(job.Key{JobID: "j", Chunk: 1})
	if !ok {
		t.Fatal("no first receipt noted")
	}
	if _, err := q.Delete(ctx, []string{"a", "b", "c", "unknown"}); err != nil {
		t.Fatal(err)
	}
	if n, big := q.completed(); n != 2 || big != 1 {
		t.Errorf("completed %d, large %d; want 2 and 1 (c's delete failed)", n, big)
	}
	// Another subscriber receiving chunk 1 again does not move its first receipt.
	other := &recordingQueue{Queue: &fakeWork{msgs: []subscriber.Message{msg("d", "1")}}, rec: rec, large: large, keys: map[string]job.Key{}}
	if _, err := other.Receive(ctx, 10, 0, 0); err != nil {
		t.Fatal(err)
	}
	if again, _ := rec.firstReceipt(job.Key{JobID: "j", Chunk: 1}); !again.Equal(first) {
		t.Error("a second receipt moved the first")
	}
}
