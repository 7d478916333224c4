package queuetest

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// Mem is an in-memory SQS queue for unit tests of code over queue.Queue:
// visibility timeouts, receive counts, receipt handles that go stale when a
// message is redelivered, long polls, and a redrive to a DLQ. It also records
// protocol violations a consumer must never commit, such as touching a
// message after deleting it. Safe for concurrent use; it passes
// RunConformance, and runs inside a testing/synctest bubble.
type Mem struct {
	mu         sync.Mutex
	msgs       []*memMsg
	byHandle   map[string]*memMsg
	nextID     int
	wake       chan struct{} // closed and replaced whenever messages may have become visible
	dlq        *Mem
	maxReceive int
	calls      map[string]int
	violations []string

	// SendErr, when set, decides the error of each Send entry. Set it
	// before the queue is in use.
	SendErr func(body string) error
	// MaxBytes is the most a Send call may carry, its messages'
	// job.MessageSize in all: job.MaxBatchBytes, as on SQS, when zero. Send
	// refuses a larger call whole, and an entry with a character SQS does
	// not accept, as SQS does. Set it before the queue is in use.
	MaxBytes int
}

// sqsRefused is what SQS refuses in a body or an attribute value (its
// SendMessage documentation's list), and above U+FFFF, which the fauxqs
// emulator refuses too.
var sqsRefused = regexp.MustCompile(`[^\x{9}\x{A}\x{D}\x{20}-\x{D7FF}\x{E000}-\x{FFFD}]`)

func refusedChars(m queue.Outgoing) bool {
	if sqsRefused.MatchString(m.Body) {
		return true
	}
	for _, v := range m.Attributes {
		if sqsRefused.MatchString(v) {
			return true
		}
	}
	return false
}

type memMsg struct {
	id, body  string
	attrs     map[string]string
	group     string
	visibleAt time.Time
	received  time.Time // its last receive: SQS's 12 hours of visibility count from it
	receives  int
	handle    string
	deleted   bool
}

// NewMem returns an empty queue.
func NewMem() *Mem {
	return &Mem{byHandle: map[string]*memMsg{}, wake: make(chan struct{}), calls: map[string]int{}}
}

var (
	_ queue.Queue  = (*Mem)(nil)
	_ queue.Sender = (*Mem)(nil)
)

// Redrive makes the queue move a message to dlq, as SQS's redrive policy
// does, when a receive finds it received maxReceive times already. Call it
// before the queue is in use.
func (q *Mem) Redrive(dlq *Mem, maxReceive int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dlq, q.maxReceive = dlq, maxReceive
}

func (q *Mem) notify() {
	close(q.wake)
	q.wake = make(chan struct{})
}

// Put puts a message on the queue, visible at once, as a producer's send
// does, without Send's checks.
func (q *Mem) Put(body string, attrs map[string]string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.put(body, attrs)
}

func (q *Mem) put(body string, attrs map[string]string) { q.putDelayed(body, attrs, "", 0) }

func (q *Mem) putDelayed(body string, attrs map[string]string, group string, delay time.Duration) {
	q.nextID++
	q.msgs = append(q.msgs, &memMsg{id: fmt.Sprintf("m%d", q.nextID), body: body, attrs: attrs, group: group,
		visibleAt: time.Now().Add(delay)})
	q.notify()
}

func (q *Mem) Send(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls["Send"]++
	total, limit := 0, q.MaxBytes
	if limit == 0 {
		limit = job.MaxBatchBytes
	}
	for _, m := range msgs {
		total += job.MessageSize(m.Body, m.Attributes)
	}
	if total > limit {
		return nil, &queue.Error{Kind: queue.ErrRefused, Code: "BatchRequestTooLong"}
	}
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if refusedChars(m) {
			errs[i] = &queue.Error{Kind: queue.ErrRefused, Code: "InvalidMessageContents"}
			continue
		}
		if q.SendErr != nil {
			if errs[i] = q.SendErr(m.Body); errs[i] != nil {
				continue
			}
		}
		if m.Delay < 0 || m.Delay > job.MaxDelay {
			errs[i] = &queue.Error{Kind: queue.ErrRefused, Code: "InvalidParameterValue"}
			continue
		}
		q.putDelayed(m.Body, m.Attributes, m.GroupID, m.Delay.Truncate(time.Second))
	}
	return errs, nil
}

func (q *Mem) Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]queue.Message, error) {
	deadline := time.Now().Add(wait)
	for {
		q.mu.Lock()
		q.calls["Receive"]++
		now := time.Now()
		var out []queue.Message
		next := deadline
		for _, m := range q.msgs {
			if m.deleted {
				continue
			}
			if m.visibleAt.After(now) {
				next = minTime(next, m.visibleAt)
				continue
			}
			if len(out) == max {
				break
			}
			if q.dlq != nil && m.receives >= q.maxReceive {
				m.deleted = true
				q.dlq.Put(m.body, m.attrs)
				continue
			}
			m.receives++
			delete(q.byHandle, m.handle)
			m.handle = fmt.Sprintf("%s#%d", m.id, m.receives)
			q.byHandle[m.handle] = m
			m.visibleAt, m.received = now.Add(visibility), now
			out = append(out, queue.Message{ID: m.id, Handle: m.handle, Body: m.body, Attributes: m.attrs, ReceiveCount: m.receives,
				GroupID: m.group})
		}
		wake := q.wake
		q.mu.Unlock()
		if len(out) > 0 || !now.Before(deadline) {
			return out, nil
		}
		t := time.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// inflight finds the message a handle holds now, or reports why not.
func (q *Mem) inflight(h string, op string) (*memMsg, error) {
	m, ok := q.byHandle[h]
	switch {
	case !ok:
		if _, deleted := q.deletedHandles()[h]; deleted {
			q.violations = append(q.violations, op+" after delete of "+h)
		}
		return nil, &queue.Error{Kind: queue.ErrLeaseLost, Code: "ReceiptHandleIsInvalid"}
	case m.deleted:
		q.violations = append(q.violations, op+" after delete of "+h)
		return nil, &queue.Error{Kind: queue.ErrLeaseLost, Code: "ReceiptHandleIsInvalid"}
	case !m.visibleAt.After(time.Now()):
		return nil, &queue.Error{Kind: queue.ErrLeaseLost, Code: "MessageNotInflight"}
	}
	return m, nil
}

func (q *Mem) deletedHandles() map[string]struct{} {
	hs := map[string]struct{}{}
	for _, m := range q.msgs {
		if m.deleted {
			hs[m.handle] = struct{}{}
		}
	}
	return hs
}

func (q *Mem) Delete(ctx context.Context, handles []string) ([]error, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls["Delete"]++
	errs := make([]error, len(handles))
	for i, h := range handles {
		m, err := q.inflight(h, "delete")
		if err != nil {
			errs[i] = err
			continue
		}
		m.deleted = true
	}
	return errs, nil
}

func (q *Mem) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls["ChangeVisibility"]++
	errs := make([]error, len(handles))
	for i, h := range handles {
		m, err := q.inflight(h, "change visibility")
		if err != nil {
			errs[i] = err
			continue
		}
		if time.Now().Add(timeout).Sub(m.received) > job.MaxVisibility {
			errs[i] = &queue.Error{Kind: queue.ErrRefused, Code: "InvalidParameterValue"}
			continue
		}
		m.visibleAt = time.Now().Add(timeout)
	}
	q.notify()
	return errs, nil
}

// Expire ends the visibility timeout of the message handle holds now, as
// if it had lapsed: the next receive takes it, and handle goes stale.
func (q *Mem) Expire(handle string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if m, ok := q.byHandle[handle]; ok {
		m.visibleAt = time.Now()
	}
}

// Stats counts messages not deleted: all of them, and those invisible now.
func (q *Mem) Stats() (live, invisible int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	for _, m := range q.msgs {
		if !m.deleted {
			live++
			if m.visibleAt.After(now) {
				invisible++
			}
		}
	}
	return live, invisible
}

// All returns the messages not deleted, as they are now; Handle is the
// latest receive's.
func (q *Mem) All() []queue.Message {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []queue.Message
	for _, m := range q.msgs {
		if !m.deleted {
			out = append(out, queue.Message{ID: m.id, Handle: m.handle, Body: m.body, Attributes: m.attrs, ReceiveCount: m.receives})
		}
	}
	return out
}

// DeletedHandles lists the last receipt handles of the messages deleted.
func (q *Mem) DeletedHandles() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var hs []string
	for h := range q.deletedHandles() {
		hs = append(hs, h)
	}
	return hs
}

// Calls counts the calls of method name ("Send", "Receive", "Delete",
// "ChangeVisibility") so far.
func (q *Mem) Calls(name string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.calls[name]
}

// Violations lists the protocol violations so far: a delete or a
// visibility change of a message after its delete.
func (q *Mem) Violations() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]string(nil), q.violations...)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
