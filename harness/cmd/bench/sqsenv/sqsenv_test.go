package sqsenv

import (
	"log/slog"
	"sync/atomic"
	"testing"
)

// Retried receives are counted even when the SDK's log is thrown away, as
// the strategies' is.
func TestRetryCounterCountsOverADiscardHandler(t *testing.T) {
	var n atomic.Int64
	log := slog.New(RetryCounter{slog.DiscardHandler, &n})
	log.Warn("retrying request SQS/ReceiveMessage, attempt 2", "component", "aws-sdk")
	log.Warn("retrying request SQS/SendMessageBatch, attempt 2", "component", "aws-sdk")
	log.Debug("retrying request SQS/ReceiveMessage, attempt 3")
	if got := n.Load(); got != 1 {
		t.Errorf("counted %d retried receives, want 1", got)
	}
}
