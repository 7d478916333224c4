// Package queuetest checks implementations of package queue, as go-cloud's
// drivertest checks its drivers: RunConformance is the contract the
// subscriber relies on, and Mem is an in-memory queue that passes it, for
// unit tests of code over a queue.
package queuetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// QueueSender is what RunConformance checks: a queue the subscriber
// receives from, and sends to.
type QueueSender interface {
	queue.Queue
	queue.Sender
}

// RunConformance checks the queue.Queue and queue.Sender contract the
// subscriber relies on, the classification of errors included, on the empty
// queue newQueue returns (it may skip t
// when its backend is not there). It asserts only what SQS documents, not
// what one implementation happens to do; it runs against SQS (sqsqueue, on
// whatever AWS_ENDPOINT_URL names) and against Mem, so the fake stays
// faithful. It takes some seconds of long polls: run it in a
// testing/synctest bubble where the queue allows.
func RunConformance(t *testing.T, newQueue func(t *testing.T) QueueSender) {
	q := newQueue(t)
	ctx := t.Context()
	receive := func(max int, visibility time.Duration) []queue.Message {
		t.Helper()
		msgs, err := q.Receive(ctx, max, time.Second, visibility)
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	noErrs := func(what string, errs []error, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for i, e := range errs {
			if e != nil {
				t.Fatalf("%s: entry %d: %v", what, i, e)
			}
		}
	}

	var out []queue.Outgoing
	for i := range job.MaxBatch {
		out = append(out, queue.Outgoing{Body: fmt.Sprintf(`{"n":%d}`, i), Attributes: map[string]string{"k": fmt.Sprint(i)}})
	}
	errs, err := q.Send(ctx, out)
	noErrs("send 10", errs, err)
	if len(errs) != job.MaxBatch {
		t.Fatalf("send returned %d entry errors for %d entries", len(errs), job.MaxBatch)
	}

	// Received messages carry body, attributes and a first receive count,
	// and are hidden from the next receive.
	got := map[string]queue.Message{}
	for deadline := time.Now().Add(10 * time.Second); len(got) < job.MaxBatch && time.Now().Before(deadline); {
		for _, m := range receive(job.MaxBatch, time.Minute) {
			if _, dup := got[m.Body]; dup {
				t.Fatalf("message %s received twice while invisible", m.Body)
			}
			got[m.Body] = m
		}
	}
	if len(got) != job.MaxBatch {
		t.Fatalf("received %d of %d", len(got), job.MaxBatch)
	}
	for i := range job.MaxBatch {
		m := got[fmt.Sprintf(`{"n":%d}`, i)]
		if m.Handle == "" || m.ID == "" || m.ReceiveCount != 1 || m.Attributes["k"] != fmt.Sprint(i) {
			t.Errorf("message %d: %+v", i, m)
		}
	}
	if extra := receive(job.MaxBatch, time.Minute); len(extra) != 0 {
		t.Errorf("%d messages received again while invisible", len(extra))
	}

	// A heartbeat on all of them succeeds entry by entry.
	var handles []string
	for _, m := range got {
		handles = append(handles, m.Handle)
	}
	errs, err = q.ChangeVisibility(ctx, handles, time.Minute)
	noErrs("extend 10", errs, err)

	// A release (visibility 0) hands a message back at once, received again
	// with a higher count.
	first := got[`{"n":0}`]
	errs, err = q.ChangeVisibility(ctx, []string{first.Handle}, 0)
	noErrs("release", errs, err)
	var again []queue.Message
	for deadline := time.Now().Add(5 * time.Second); len(again) == 0 && time.Now().Before(deadline); {
		again = receive(1, time.Minute)
	}
	if len(again) != 1 || again[0].Body != first.Body || again[0].ReceiveCount != 2 {
		t.Fatalf("after release, received %+v; want the same message, second receive", again)
	}

	// Deletes remove messages for good.
	handles = handles[:0]
	for _, m := range got {
		if m.Body != first.Body {
			handles = append(handles, m.Handle)
		}
	}
	handles = append(handles, again[0].Handle)
	errs, err = q.Delete(ctx, handles)
	noErrs("delete 10", errs, err)

	// A heartbeat on a deleted message fails for that entry, as a lost lease.
	errs, err = q.ChangeVisibility(ctx, []string{again[0].Handle}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	classified(t, "extending a deleted message", errs[0], queue.ErrLeaseLost)

	// With every message deleted, nothing comes back, even after the
	// visibility timeouts that were set would have passed.
	if left := receive(job.MaxBatch, time.Second); len(left) != 0 {
		t.Errorf("%d messages after deleting all", len(left))
	}

	// An entry with a character SQS does not accept is refused for good,
	// alone: its neighbour goes.
	errs, err = q.Send(ctx, []queue.Outgoing{{Body: "nul \x00"}, {Body: "next"}})
	if err != nil {
		t.Fatal(err)
	}
	classified(t, "sending a NUL", errs[0], queue.ErrRefused)
	if errs[1] != nil {
		t.Errorf("the refused entry's neighbour: %v", errs[1])
	}
	// A call over job.MaxBatchBytes in all is refused for good, whole.
	half := queue.Outgoing{Body: strings.Repeat("x", job.MaxBatchBytes/2+1)}
	_, err = q.Send(ctx, []queue.Outgoing{half, half})
	classified(t, "sending more than a call may carry", err, queue.ErrRefused)
	var next []queue.Message
	for deadline := time.Now().Add(5 * time.Second); len(next) == 0 && time.Now().Before(deadline); {
		next = receive(job.MaxBatch, time.Minute)
	}
	if len(next) != 1 || next[0].Body != "next" {
		t.Fatalf("after the refusals, received %+v; want only the neighbour", next)
	}
	errs, err = q.Delete(ctx, []string{next[0].Handle})
	noErrs("delete", errs, err)

	// A message sent with a delay (a hand-back's copy: DelaySeconds) stays
	// hidden until the delay has passed, then comes with its attributes and
	// a first receive count.
	errs, err = q.Send(ctx, []queue.Outgoing{{Body: "later", Attributes: map[string]string{"k": "v"}, Delay: 2 * time.Second}})
	noErrs("send with a delay", errs, err)
	sent := time.Now()
	var later []queue.Message
	for deadline := sent.Add(10 * time.Second); len(later) == 0 && time.Now().Before(deadline); {
		later = receive(job.MaxBatch, time.Minute)
	}
	if len(later) != 1 || later[0].Body != "later" || later[0].Attributes["k"] != "v" || later[0].ReceiveCount != 1 {
		t.Fatalf("the delayed message: %+v", later)
	}
	if waited := time.Since(sent); waited < 2*time.Second-100*time.Millisecond {
		t.Errorf("a message sent with a 2 s delay was received after %v", waited)
	}
	errs, err = q.Delete(ctx, []string{later[0].Handle})
	noErrs("delete", errs, err)
}

// classified checks that err is a *queue.Error of kind, which names it.
func classified(t *testing.T, what string, err, kind error) {
	t.Helper()
	var qe *queue.Error
	if !errors.As(err, &qe) || !errors.Is(err, kind) || qe.Code == "" {
		t.Errorf("%s: %#v; want a *queue.Error of kind %q, with its code", what, err, kind)
	}
	for _, other := range []error{queue.ErrLeaseLost, queue.ErrRefused} {
		if other != kind && errors.Is(err, other) {
			t.Errorf("%s: %v is also %q", what, err, other)
		}
	}
}
