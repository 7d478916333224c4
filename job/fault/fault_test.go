package fault_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
)

// A backoff error keeps its time through wrapping, and is ErrBackoff.
func TestBackoffUntil(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	err := fmt.Errorf("batch: %w", &fault.BackoffError{Until: at, Reason: "429 rate_limit_exceeded"})
	if until, ok := fault.BackoffUntil(err); !ok || !until.Equal(at) || !errors.Is(err, fault.ErrBackoff) {
		t.Errorf("BackoffUntil(%v) = %v, %v; want %v, and ErrBackoff", err, until, ok, at)
	}
	if _, ok := fault.BackoffUntil(fmt.Errorf("x: %w", fault.ErrNeedsOperator)); ok {
		t.Error("BackoffUntil found a time in an ErrNeedsOperator")
	}
	if _, ok := fault.BackoffUntil(fmt.Errorf("throttled: %w", fault.ErrBackoff)); ok {
		t.Error("BackoffUntil found a time in an ErrBackoff that says none")
	}
	kinds := []error{fault.ErrInvalidInput, fault.ErrBackoff, fault.ErrNeedsOperator}
	for i, a := range kinds {
		for j, b := range kinds {
			if i != j && errors.Is(a, b) {
				t.Errorf("the kinds overlap: %v is %v", a, b)
			}
		}
	}
	if errors.Is(&fault.BackoffError{}, fault.ErrNeedsOperator) {
		t.Error("a BackoffError is ErrNeedsOperator")
	}
}

// A partial error is its cause and carries its outputs through wrapping;
// slices of different lengths carry nothing, nor does a partial error of
// another output type.
func TestPartial(t *testing.T) {
	cause := &fault.BackoffError{Until: time.Unix(1e9, 0), Reason: "429"}
	outs := []job.Output{{ID: "a"}, {ID: "b"}}
	err := fmt.Errorf("batch: %w", &fault.PartialError[job.Output]{Err: cause, Outputs: outs, Done: []bool{true, false}})
	if got, done, ok := fault.Partial[job.Output](err); !ok || len(got) != 2 || got[0].ID != "a" || !done[0] || done[1] {
		t.Errorf("Partial(%v) = %v, %v, %v", err, got, done, ok)
	}
	if _, ok := fault.BackoffUntil(err); !ok || !errors.Is(err, fault.ErrBackoff) {
		t.Errorf("%v is not its backoff", err)
	}
	if !strings.Contains(err.Error(), "1 of 2 items finished") {
		t.Errorf("Error() = %q; want the count finished", err)
	}
	if _, _, ok := fault.Partial[job.Output](&fault.PartialError[job.Output]{Err: cause, Outputs: outs, Done: []bool{true}}); ok {
		t.Error("Partial took slices of different lengths")
	}
	if _, _, ok := fault.Partial[job.Output](cause); ok {
		t.Error("Partial found outputs in a plain backoff")
	}
	if _, _, ok := fault.Partial[string](err); ok {
		t.Error("Partial[string] read a PartialError[job.Output]")
	}
}
