package strategies

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// fakeWork is a work queue that hands out msgs once and fails the deletes
// of the handles in fail.
type fakeWork struct {
	msgs []queue.Message
	fail map[string]bool
}

func (f *fakeWork) Receive(context.Context, int, time.Duration, time.Duration) ([]queue.Message, error) {
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

func (f *fakeWork) Send(_ context.Context, msgs []queue.Outgoing) ([]error, error) {
	return make([]error, len(msgs)), nil
}

// TestRecordingQueueCountsCompletions checks the per-subscriber spread:
// only deletes SQS confirmed count, large ones by the large set, and a
// message's first receipt is kept across subscribers.
func TestRecordingQueueCountsCompletions(t *testing.T) {
	msg := func(h string, chunk string) queue.Message {
		return queue.Message{Handle: h, Attributes: map[string]string{job.AttrJobID: "j", job.AttrChunk: chunk}}
	}
	rec := &receipts{first: map[job.Key]time.Time{}}
	large := map[job.Key]bool{{JobID: "j", Chunk: 1}: true, {JobID: "j", Chunk: 2}: true}
	fw := &fakeWork{msgs: []queue.Message{msg("a", "0"), msg("b", "1"), msg("c", "2")}, fail: map[string]bool{"c": true}}
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
	other := &recordingQueue{Queue: &fakeWork{msgs: []queue.Message{msg("d", "1")}}, rec: rec, large: large, keys: map[string]job.Key{}}
	if _, err := other.Receive(ctx, 10, 0, 0); err != nil {
		t.Fatal(err)
	}
	if again, _ := rec.firstReceipt(job.Key{JobID: "j", Chunk: 1}); !again.Equal(first) {
		t.Error("a second receipt moved the first")
	}
}

// A hand-back (a copy sent to the work queue, then the original deleted)
// is not a completion.
func TestRecordingQueueSkipsHandBacks(t *testing.T) {
	msg := queue.Message{Handle: "a", Attributes: map[string]string{job.AttrJobID: "j", job.AttrChunk: "0"}}
	fw := &fakeWork{msgs: []queue.Message{msg}, fail: map[string]bool{}}
	q := &recordingQueue{Queue: fw, rec: &receipts{first: map[job.Key]time.Time{}}, keys: map[string]job.Key{}}
	ctx := context.Background()
	if _, err := q.Receive(ctx, 10, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Send(ctx, []queue.Outgoing{{Body: "x", Attributes: msg.Attributes}}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Delete(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if q.done != 0 {
		t.Errorf("a hand-back counted as %d completions; want 0", q.done)
	}
}
