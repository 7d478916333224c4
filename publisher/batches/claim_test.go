package batches

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/jobs"
)

// A validator refreshes its claim after a window of chunks is sent, once
// validationBeat has passed since the last time, so that a long validation
// is not taken for a dead one. Here each SendMessageBatch call takes
// validationBeat, and 50 one-request chunks go out in two windows (40, then
// 10): the last refresh follows the last send, and the record says the
// batch was claimed when it went in progress. Without refreshes it would
// keep its claim's time, five calls earlier.
func TestValidatorRefreshesItsClaim(t *testing.T) {
	c := sqstest.S3(t)
	store := payload.New(c, sqstest.Bucket(t, c))
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	slow := queueFunc(func(_ context.Context, entries []jobs.Entry) ([]error, error) {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(validationBeat)
		return make([]error, len(entries)), nil
	})
	p := newStack(t, store, jobs.Config{ChunkItems: 1}, slow)
	p.now = now
	fileID, _ := putBatchFile(t, store, 50, func(i int) string {
		return fmt.Sprintf(`{"custom_id":"doc-%02d","method":"POST","url":"/v1/embeddings","body":{"model":"bge-small","input":"text %d"}}`, i, i)
	})
	_, bo := createAndValidate(t, p, fileID) // the create, and the sweep that validates it
	raw, err := store.Read(t.Context(), job.BatchKey("", bo.ID))
	if err != nil {
		t.Fatal(err)
	}
	var b batchRecord
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	if b.Status != batchInProgress || b.ValidatingAt != b.InProgressAt {
		t.Errorf("%s, in progress at %d, last claimed at %d: want in_progress, claimed after the last send",
			b.Status, b.InProgressAt, b.ValidatingAt)
	}
}

// queueFunc is a queue that is a function.
type queueFunc func(ctx context.Context, entries []jobs.Entry) ([]error, error)

func (f queueFunc) SendBatch(ctx context.Context, entries []jobs.Entry) ([]error, error) {
	return f(ctx, entries)
}
