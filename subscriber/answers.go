package subscriber

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// What a backend has answered is kept, in memory and in the bucket, so that no answer is asked twice
// (the run stage's).

// A message that waits for the model (pause.go) stays in this process, so
// the answers a backoff came with for some of its items are kept on its task
// and only its other items are asked again when it runs after the wait: a
// model server's answer is paid for (tokens of a rate limit, a quota), and a
// chunk of 32 long generations that backs off after 31 would otherwise ask
// all 32 again, at every backoff. Its result is still written once, whole,
// in the order of its items. A message handed back, or redelivered after a
// process dies, finds them in the answer store instead (below).
type answered struct {
	items []job.Item   // the message's items, as received
	outs  []job.Output // by item, where done
	done  []bool       // by item
	idx   []int        // for each item of t.work now, its index in items
}

// keep records the outputs of t's items that done marks as finished (outs
// and done are aligned with t.work.Items now), and leaves t.work with the
// other items, to run after the wait. It reports whether any was kept.
func (t *task) keep(outs []job.Output, done []bool) bool {
	if !slices.Contains(done, true) {
		return false
	}
	a := t.answered
	if a == nil {
		n := len(t.work.Items)
		a = &answered{items: t.work.Items, outs: make([]job.Output, n), done: make([]bool, n), idx: make([]int, n)}
		for i := range a.idx {
			a.idx[i] = i
		}
		t.answered = a
	}
	var rest []job.Item
	var idx []int
	for i, it := range t.work.Items {
		if done[i] {
			a.outs[a.idx[i]], a.done[a.idx[i]] = outs[i], true
			continue
		}
		rest, idx = append(rest, it), append(idx, a.idx[i])
	}
	w := *t.work
	w.Items = rest
	t.work, a.idx = &w, idx
	return true
}

// whole returns t's outputs for all its items, outs being those of
// t.work.Items now, and gives t.work its items back; outs as they are when
// nothing was kept.
func (t *task) whole(outs []job.Output) []job.Output {
	a := t.answered
	if a == nil || len(outs) != len(a.idx) {
		return outs
	}
	all := slices.Clone(a.outs)
	for i, o := range outs {
		all[a.idx[i]] = o
	}
	w := *t.work
	w.Items = a.items
	t.work, t.answered = &w, nil
	return all
}

// keptBytes is what the answers t's result holds from outside t's items
// now take of a result (gpu.AnswerBytes): those kept through a wait or
// recalled (answered), and, for a message run in parts, those its parts got
// (told). A model that bounds a run's answers by what a result may hold
// counts them as the run's own (gpu.WithKept), so that a kept answer counts
// exactly as a fresh one.
func (t *task) keptBytes() int64 {
	if t.of != nil {
		return t.of.keptBytes()
	}
	var n int64
	if a := t.answered; a != nil {
		for i, o := range a.outs {
			if a.done[i] {
				n += gpu.AnswerBytes(o)
			}
		}
	}
	if a := t.told; a != nil {
		a.mu.Lock()
		for _, o := range a.outs {
			n += gpu.AnswerBytes(o)
		}
		a.mu.Unlock()
	}
	return n
}

// answerBucket is what the answer store needs of the payload bucket besides
// Payloads: a chunk's answers are found by listing its prefix, and deleted
// once its result is out. *payload.Store has both.
type answerBucket interface {
	Lister
	Delete(ctx context.Context, key string) error
}

// An answerStore keeps each item's answer in the payload bucket as soon as
// the model has it (gpu.WithAnswers), until its chunk's result is out, so
// that no answer is asked for twice: a model server's answer is paid for,
// and whatever ends a message before its result (a backoff, an overload
// late in a batch, a SIGTERM, a scale-in, a crash) hands back a chunk whose
// next run, in this process or another, reads what was answered and asks
// only for the rest. pause.go keeps answers on a task that waits in this
// process; this keeps them past it.
//
// The store costs a PutObject per answered item, and, on a message received
// before (ApproximateReceiveCount above 1, or a hand-back's copy,
// AttrHandedBack), a ListObjectsV2 and a GetObject per answer kept; on a
// message whose answers were kept, a ListObjectsV2 and a DeleteObject per
// answer once its result is out. A model that never tells answers
// (in-process models) stores none. Answers of a chunk whose result never
// goes out (dead-lettered) stay until the bucket's lifecycle expires
// answers/ (infra/bucket.tf).
type answerStore struct {
	put    Payloads // counted (countedPayloads)
	bucket answerBucket
	log    *slog.Logger
	m      *metrics
	// cleaning tracks the deletes started by forget.
	cleaning sync.WaitGroup
}

// newAnswerStore returns the answer store on p, or nil when p cannot list and
// delete (a bucket that can only be read and written).
func newAnswerStore(counted Payloads, p Payloads, log *slog.Logger, m *metrics) *answerStore {
	b, ok := p.(answerBucket)
	if !ok {
		return nil
	}
	return &answerStore{put: counted, bucket: b, log: log, m: m}
}

// answersOf is where the answers of t's chunk are kept: under the tenant
// that sent it, its job and its chunk.
func answersOf(t *task) string {
	return job.AnswersPrefix(t.lease.msg.Attributes[job.AttrTenant], t.work.JobID, t.work.Chunk)
}

// keeper returns what keeps an answer of a batch's item (watchItems calls
// it as the answer arrives), and wait, which returns once every keep
// started has ended: the batch's messages may be handed back only after
// their answers are stored, or another process would ask again. A keep
// that fails is logged and the item is asked again on a later run: the
// answer is in this batch's outputs still. nil without a store.
func (a *answerStore) keeper(ctx context.Context) (keep func(t *task, it job.Item, out job.Output), wait func()) {
	if a == nil {
		return nil, func() {}
	}
	var wg sync.WaitGroup
	// The keeps outlive the batch's context: an answer got is stored
	// whatever ends the batch, within its own time.
	keepCtx := context.WithoutCancel(ctx)
	keep = func(t *task, it job.Item, out job.Output) {
		body, err := json.Marshal(out)
		if err != nil {
			return // the result fails to encode too, and says so
		}
		t.lease.answersKept.Store(true)
		key := job.AnswerKey(answersOf(t), it.ID)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(keepCtx, sendTimeout)
			defer cancel()
			if _, err := a.put.Put(ctx, key, body); err != nil {
				a.log.Warn("keeping an answer failed: the item is asked again if its message is handed back",
					"message_id", t.lease.msg.ID, "job_id", t.work.JobID, "chunk", t.work.Chunk, "item", it.ID, "err", err)
				return
			}
			a.m.answersStored.Inc()
		})
	}
	return keep, wg.Wait
}

// mayHold reports whether answers may be kept for t's chunk: only a message
// that was received before (or is a hand-back's copy, whose receive count
// starts again) can have been answered in part. A copy that had no room
// for AttrHandedBack among SQS's ten attributes is asked whole again.
func (a *answerStore) mayHold(t *task) bool {
	return a != nil && (t.lease.msg.ReceiveCount > 1 || t.lease.msg.Attributes[AttrHandedBack] != "")
}

// recallReads bounds the answers read at once for one message.
const recallReads = 8

// recall reads the answers kept for t's items and keeps them on t
// (run.go), leaving t.work with the items that have none. An answer
// that cannot be read in time, or does not belong to its item, is not
// used: the item is asked again. It returns ctx's error only.
func (a *answerStore) recall(ctx context.Context, t *task) error {
	rctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	prefix := answersOf(t)
	keys, err := a.bucket.List(rctx, prefix)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.log.Warn("listing kept answers failed: the message's items are all asked", "message_id", t.lease.msg.ID,
			"job_id", t.work.JobID, "chunk", t.work.Chunk, "err", err)
		return nil
	}
	if len(keys) == 0 {
		return nil
	}
	items := t.work.Items
	byKey := make(map[string]int, len(items))
	for i, it := range items {
		byKey[job.AnswerKey(prefix, it.ID)] = i
	}
	outs := make([]job.Output, len(items))
	done := make([]bool, len(items))
	g, gctx := errgroup.WithContext(rctx)
	g.SetLimit(recallReads)
	for _, key := range keys {
		i, ok := byKey[key]
		if !ok {
			continue
		}
		delete(byKey, key) // a key listed twice is read once
		g.Go(func() error {
			body, err := a.put.Read(gctx, key)
			if err != nil {
				if gctx.Err() == nil {
					a.log.Warn("reading a kept answer failed: the item is asked again", "message_id", t.lease.msg.ID,
						"key", key, "err", err)
				}
				return nil
			}
			var o job.Output
			if json.Unmarshal(body, &o) != nil || o.ID != items[i].ID || o.Response == nil {
				a.log.Warn("a kept answer is not its item's: the item is asked again", "message_id", t.lease.msg.ID, "key", key)
				return nil
			}
			outs[i], done[i] = o, true
			return nil
		})
	}
	_ = g.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if t.keep(outs, done) {
		t.lease.answersKept.Store(true)
		a.m.answersRecalled.Add(float64(countTrue(done)))
		a.log.Info("a redelivered message's kept answers read: only its other items are asked", "message_id", t.lease.msg.ID,
			"job_id", t.work.JobID, "chunk", t.work.Chunk, "answered", countTrue(done), "asked", len(t.work.Items))
	}
	return nil
}

// forget deletes the answers kept for t's chunk, if any, its result being
// out, off the caller's goroutine (the outbox's, which acks others). A
// delete that fails leaves the answer to the bucket's lifecycle.
func (a *answerStore) forget(t *task) {
	if a == nil || !t.lease.answersKept.Load() {
		return
	}
	a.cleaning.Go(func() { a.clean(t) })
}

// wait waits for the deletes forget started.
func (a *answerStore) wait() {
	if a != nil {
		a.cleaning.Wait()
	}
}

func (a *answerStore) clean(t *task) {
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	prefix := answersOf(t)
	keys, err := a.bucket.List(ctx, prefix)
	if err != nil {
		a.log.Warn("listing kept answers to delete failed: they expire by the bucket's lifecycle", "job_id", t.work.JobID,
			"chunk", t.work.Chunk, "err", err)
		return
	}
	for _, key := range keys {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		if err := a.bucket.Delete(ctx, key); err != nil {
			a.log.Warn("deleting a kept answer failed: it expires by the bucket's lifecycle", "key", key, "err", err)
		}
	}
}
