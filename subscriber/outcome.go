package subscriber

import "time"

// An outcome is what a stage found out about a message that it does not
// carry on: how the message must end, or that it waits. Stages return
// outcomes and Subscriber.end alone turns them into the message's ends
// (message.go), so how a message ends is read in one place.
type outcome struct {
	kind   outcomeKind
	after  time.Duration // release, handBack: how long the message stays invisible
	why    string        // handBack: the wait that is not its fault; deadLetter: the kind
	reason string        // deadLetter: the detail
}

type outcomeKind int

const (
	// carried: the message went on (its result is in the outbox, which
	// ends it once the result is out); nothing to end here.
	carried outcomeKind = iota
	// waits: the model asks to wait; the message waits holding its lease
	// and its admission, and runs again after the wait (pause.go).
	waits
	acked        // its result or its DLQ copy is out: delete it
	retried      // a failure that may be its own: release it after its retry delay
	released     // release it after after (a lost lease: at once)
	handedBack   // a wait that is not its fault: hand it back, visible after after
	deadLettered // it can never succeed: copy it to the DLQ with why and reason
	cancelled    // its job was cancelled before it ran
)

func endAck() outcome                        { return outcome{kind: acked} }
func endFailed() outcome                     { return outcome{kind: retried} }
func endRelease(after time.Duration) outcome { return outcome{kind: released, after: after} }
func endCancel() outcome                     { return outcome{kind: cancelled} }
func endDeadLetter(kind, reason string) outcome {
	return outcome{kind: deadLettered, why: kind, reason: reason}
}

// endHandBack is a wait that is not the message's fault, why (a
// vramq_subscriber_messages_handed_back_total label), after which it is
// visible again.
func endHandBack(after time.Duration, why string) outcome {
	return outcome{kind: handedBack, after: after, why: why}
}

// end ends t as o says. It is the one place an outcome becomes an end; a
// dead letter and a cancel write to the DLQ or the bucket before they end,
// so a caller that must not wait for them uses endAsync.
func (s *Subscriber) end(t *task, o outcome) {
	switch o.kind {
	case acked:
		t.Ack()
	case retried:
		t.Release(t.retryAfter())
	case released:
		t.Release(o.after)
	case handedBack:
		t.HandBack(o.after, o.why)
	case deadLettered:
		t.DeadLetter(o.why, o.reason)
	case cancelled:
		t.Cancel()
	}
}

// endAsync ends t as o says off the caller (a poller or a runner that must
// not wait for a DLQ or a bucket), giving back what t holds in admission at
// once. Run waits for it (aux) before the outbox closes.
func (s *Subscriber) endAsync(t *task, o outcome) {
	t.hold.release()
	s.aux.Go(func() { s.end(t, o) })
}
