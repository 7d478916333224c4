package subscriber

import (
	"reflect"
	"testing"
	"testing/synctest"
	"time"
)

// Each outcome ends its message the one way it names, and the two that are
// not ends (the message went on, or waits for the model) leave it held.
func TestOutcomeEndsItsMessage(t *testing.T) {
	type trace struct{ deletes, visibility, sends, dlq, markers int }
	cases := []struct {
		name string
		o    outcome
		want trace
	}{
		{"ack", endAck(), trace{deletes: 1}},
		{"failed", endFailed(), trace{visibility: 1}},
		{"release", endRelease(0), trace{visibility: 1}},
		{"hand back", endHandBack(time.Minute, "wait"), trace{deletes: 1, sends: 1}},
		{"dead letter", endDeadLetter("invalid_input", "bad"), trace{deletes: 1, dlq: 1, markers: 1}},
		{"cancel", endCancel(), trace{deletes: 1, markers: 1}},
		{"carried", outcome{kind: carried}, trace{}},
		{"waits", outcome{kind: waits}, trace{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newMessageEnds(t)
				(&Subscriber{}).end(e.t, c.o)
				time.Sleep(time.Second) // past the keeper's batching delay
				got := trace{e.q.Calls("Delete"), e.q.Calls("ChangeVisibility"), e.q.Calls("Send"),
					len(e.dlq.All()), e.payloads.count()}
				if got != c.want {
					t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
				}
				if ended := e.t.ended.Load(); ended != (c.want != trace{}) {
					t.Errorf("%s: message ended %v", c.name, ended)
				}
			})
		})
	}
}

// The struct that wires the stages stays small (issue 32): a stage's state
// goes in that stage's struct, not beside the others'.
func TestSubscriberWiresStagesInFewFields(t *testing.T) {
	if n := reflect.TypeFor[Subscriber]().NumField(); n > 15 {
		t.Errorf("Subscriber has %d fields; at most 15: group the new state into its stage's struct", n)
	}
}
