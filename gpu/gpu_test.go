package gpu_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// A backoff error keeps its time through wrapping, and is ErrBackoff.
func TestBackoffUntil(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	err := fmt.Errorf("batch: %w", &gpu.BackoffError{Until: at, Reason: "429 rate_limit_exceeded"})
	if until, ok := gpu.BackoffUntil(err); !ok || !until.Equal(at) || !errors.Is(err, gpu.ErrBackoff) {
		t.Errorf("BackoffUntil(%v) = %v, %v; want %v, and ErrBackoff", err, until, ok, at)
	}
	if _, ok := gpu.BackoffUntil(fmt.Errorf("x: %w", gpu.ErrNeedsOperator)); ok {
		t.Error("BackoffUntil found a time in an ErrNeedsOperator")
	}
	if errors.Is(gpu.ErrNeedsOperator, gpu.ErrBackoff) || errors.Is(&gpu.BackoffError{}, gpu.ErrNeedsOperator) {
		t.Error("the sentinels overlap")
	}
}

// A partial error is its cause and carries its outputs through wrapping;
// slices of different lengths carry nothing.
func TestPartial(t *testing.T) {
	cause := &gpu.BackoffError{Until: time.Unix(1e9, 0), Reason: "429"}
	outs := []job.Output{{ID: "a"}, {ID: "b"}}
	err := fmt.Errorf("batch: %w", &gpu.PartialError{Err: cause, Outputs: outs, Done: []bool{true, false}})
	if got, done, ok := gpu.Partial(err); !ok || len(got) != 2 || got[0].ID != "a" || !done[0] || done[1] {
		t.Errorf("Partial(%v) = %v, %v, %v", err, got, done, ok)
	}
	if _, ok := gpu.BackoffUntil(err); !ok || !errors.Is(err, gpu.ErrBackoff) {
		t.Errorf("%v is not its backoff", err)
	}
	if !strings.Contains(err.Error(), "1 of 2 items finished") {
		t.Errorf("Error() = %q; want the count finished", err)
	}
	if _, _, ok := gpu.Partial(&gpu.PartialError{Err: cause, Outputs: outs, Done: []bool{true}}); ok {
		t.Error("Partial took slices of different lengths")
	}
	if _, _, ok := gpu.Partial(cause); ok {
		t.Error("Partial found outputs in a plain backoff")
	}
}
