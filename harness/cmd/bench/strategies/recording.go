package strategies

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// receipts notes when each message was first received, by any subscriber.
type receipts struct {
	mu    sync.Mutex
	first map[job.Key]time.Time
}

func (r *receipts) firstReceipt(k job.Key) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.first[k]
	return t, ok
}

// recordingQueue is one subscriber's work queue: it notes first receipts in
// rec, and counts the messages, and the large ones, this subscriber deleted.
type recordingQueue struct {
	queue.Queue
	rec   *receipts
	large map[job.Key]bool // read only

	mu        sync.Mutex
	keys      map[string]job.Key // by receipt handle, until deleted
	resent    map[job.Key]int    // copies sent back (a hand-back), whose original's delete is no completion
	done, big int64
}

// Send notes the copies a hand-back sends to the work queue: the delete of
// the original that follows is not a completion.
func (q *recordingQueue) Send(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
	errs, err := q.Queue.Send(ctx, msgs)
	if err != nil {
		return errs, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, m := range msgs {
		chunk, cerr := strconv.Atoi(m.Attributes[job.AttrChunk])
		if cerr != nil || i < len(errs) && errs[i] != nil {
			continue
		}
		if q.resent == nil {
			q.resent = map[job.Key]int{}
		}
		q.resent[job.Key{JobID: m.Attributes[job.AttrJobID], Chunk: chunk}]++
	}
	return errs, err
}

func (q *recordingQueue) Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]queue.Message, error) {
	msgs, err := q.Queue.Receive(ctx, max, wait, visibility)
	now := time.Now()
	q.rec.mu.Lock()
	q.mu.Lock()
	for _, m := range msgs {
		chunk, cerr := strconv.Atoi(m.Attributes[job.AttrChunk])
		k := job.Key{JobID: m.Attributes[job.AttrJobID], Chunk: chunk}
		if cerr != nil {
			continue
		}
		q.keys[m.Handle] = k
		if _, seen := q.rec.first[k]; !seen {
			q.rec.first[k] = now
		}
	}
	q.mu.Unlock()
	q.rec.mu.Unlock()
	return msgs, err
}

func (q *recordingQueue) Delete(ctx context.Context, handles []string) ([]error, error) {
	errs, err := q.Queue.Delete(ctx, handles)
	if err != nil {
		return errs, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, h := range handles {
		if i < len(errs) && errs[i] != nil {
			continue
		}
		if k, ok := q.keys[h]; ok {
			delete(q.keys, h)
			if q.resent[k] > 0 {
				q.resent[k]--
				continue
			}
			q.done++
			if q.large[k] {
				q.big++
			}
		}
	}
	return errs, err
}

// completed is how many messages, and large ones, this subscriber deleted.
func (q *recordingQueue) completed() (n, large int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.done, q.big
}
