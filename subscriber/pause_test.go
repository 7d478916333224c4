package subscriber

import (
	"testing"
	"time"
)

// A backoff's visibility ends when the server said, in whole seconds not
// before it, and never past what SQS allows: 12 hours from the receive.
func TestBackoffDelay(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		received time.Time
		until    time.Time
		want     time.Duration
	}{
		{"rounded up", now, now.Add(90*time.Second + time.Millisecond), 91 * time.Second},
		{"a daily quota", now, now.Add(24 * time.Hour), 12*time.Hour - time.Minute},
		{"held for hours", now.Add(-11 * time.Hour), now.Add(5 * time.Hour), 59 * time.Minute},
		{"past", now, now.Add(-time.Second), 0},
		{"no hold left", now.Add(-12 * time.Hour), now.Add(time.Hour), 0},
	} {
		if got := backoffDelay(&lease{received: tc.received}, tc.until, now); got != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
}

func TestBackoffReason(t *testing.T) {
	for reason, want := range map[string]string{
		"429 rate_limit_exceeded":              "rate_limit",
		"rate limit: tokens per minute":        "rate_limit",
		"overloaded_429 429 Too Many Requests": "overloaded",
		"overloaded 503 Service Unavailable":   "overloaded",
		"":                                     "unknown",
	} {
		if got := backoffReason(reason); got != want {
			t.Errorf("backoffReason(%q) = %q; want %q", reason, got, want)
		}
	}
}
