package gpu_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vramq/vramq/gpu"
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
