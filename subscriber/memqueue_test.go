package subscriber

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/aws/smithy-go"

	"github.com/vramq/vramq/job"
)

// memQueue is an in-memory SQS queue for unit tests of the subscriber's logic:
// visibility timeouts, receive counts, receipt handles that go stale when a
// message is redelivered, long polls, and a redrive to a DLQ. It also records
// protocol violations the subscriber must never commit, such as touching a
// message after deleting it.
type memQueue struct {
	mu         sync.Mutex
	msgs       []*memMsg
	byHandle   map[string]*memMsg
	nextID     int
	wake       chan struct{} // closed and replaced whenever messages may have become visible
	dlq        *memQueue
	maxReceive int
	calls      map[string]int
	violations []string
	// sendErr, when set, decides the error of each Send entry.
	sendErr func(body string) error
	// maxBytes, when set, refuses as SQS does a Send whose messages come
	// to more (job.MessageSize) as a whole; and Send always refuses an
	// entry with a character SQS does not accept, as SQS does.
	maxBytes int
}

// sqsRefused is what SQS refuses in a body or an attribute value (its
// SendMessage documentation's list), and above U+FFFF, which the fauxqs
// emulator refuses too.
var sqsRefused = regexp.MustCompile(`[^\x{9}\x{A}\x{D}\x{20}-\x{D7FF}\x{E000}-\x{FFFD}]`)

func refusedChars(m Outgoing) bool {
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
	visibleAt time.Time
	receives  int
	handle    string
	deleted   bool
}

func newMemQueue() *memQueue {
	return &memQueue{byHandle: map[string]*memMsg{}, wake: make(chan struct{}), calls: map[string]int{}}
}

var (
	_ Queue  = (*memQueue)(nil)
	_ Sender = (*memQueue)(nil)
)

func (q *memQueue) notify() {
	close(q.wake)
	q.wake = make(chan struct{})
}

func (q *memQueue) put(body string, attrs map[string]string) {
	q.nextID++
	q.msgs = append(q.msgs, &memMsg{id: fmt.Sprintf("m%d", q.nextID), body: body, attrs: attrs})
	q.notify()
}

func (q *memQueue) Send(ctx context.Context, msgs []Outgoing) ([]error, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls["Send"]++
	if q.maxBytes > 0 {
		total := 0
		for _, m := range msgs {
			total += job.MessageSize(m.Body, m.Attributes)
		}
		if total > q.maxBytes {
			return nil, &smithy.GenericAPIError{Code: "AWS.SimpleQueueService.BatchRequestTooLong", Message: "batch too long", Fault: smithy.FaultClient}
		}
	}
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if refusedChars(m) {
			errs[i] = &EntryError{Code: "InvalidMessageContents", Message: "invalid character", SenderFault: true}
			continue
		}
		if q.sendErr != nil {
			if errs[i] = q.sendErr(m.Body); errs[i] != nil {
				continue
			}
		}
		q.put(m.Body, m.Attributes)
	}
	return errs, nil
}

func (q *memQueue) Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]Message, error) {
	deadline := time.Now().Add(wait)
	for {
		q.mu.Lock()
		q.calls["Receive"]++
		now := time.Now()
		var out []Message
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
				q.dlq.mu.Lock()
				q.dlq.put(m.body, m.attrs)
				q.dlq.mu.Unlock()
				continue
			}
			m.receives++
			delete(q.byHandle, m.handle)
			m.handle = fmt.Sprintf("%s#%d", m.id, m.receives)
			q.byHandle[m.handle] = m
			m.visibleAt = now.Add(visibility)
			out = append(out, Message{ID: m.id, Handle: m.handle, Body: m.body, Attributes: m.attrs, ReceiveCount: m.receives})
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
func (q *memQueue) inflight(h string, op string) (*memMsg, error) {
	m, ok := q.byHandle[h]
	switch {
	case !ok:
		if _, deleted := q.deletedHandles()[h]; deleted {
			q.violations = append(q.violations, op+" after delete of "+h)
		}
		return nil, &EntryError{Code: "ReceiptHandleIsInvalid", Message: h}
	case m.deleted:
		q.violations = append(q.violations, op+" after delete of "+h)
		return nil, &EntryError{Code: "ReceiptHandleIsInvalid", Message: h}
	case !m.visibleAt.After(time.Now()):
		return nil, &EntryError{Code: "MessageNotInflight", Message: h}
	}
	return m, nil
}

func (q *memQueue) deletedHandles() map[string]struct{} {
	hs := map[string]struct{}{}
	for _, m := range q.msgs {
		if m.deleted {
			hs[m.handle] = struct{}{}
		}
	}
	return hs
}

func (q *memQueue) Delete(ctx context.Context, handles []string) ([]error, error) {
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

func (q *memQueue) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
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
		m.visibleAt = time.Now().Add(timeout)
	}
	q.notify()
	return errs, nil
}

// stats counts messages not deleted: all of them, and those invisible now.
func (q *memQueue) stats() (live, invisible int) {
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

// all returns the messages not deleted.
func (q *memQueue) all() []*memMsg {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*memMsg
	for _, m := range q.msgs {
		if !m.deleted {
			out = append(out, m)
		}
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
