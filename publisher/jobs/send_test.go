package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vramq/vramq/job/fault"
)

// queueFunc is a Queue made of a function.
type queueFunc func(ctx context.Context, entries []Entry) ([]error, error)

func (f queueFunc) SendBatch(ctx context.Context, entries []Entry) ([]error, error) {
	return f(ctx, entries)
}

var _ Queue = queueFunc(nil)

func testSender(t *testing.T, q Queue) *sender {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return &sender{queue: q, attempts: 5, retry: sendRetry(100 * time.Millisecond),
		maxBatchBytes: 1 << 20, concurrency: 4, m: m, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func chunks(n, size int) []Chunk {
	out := make([]Chunk, n)
	for i := range out {
		out[i] = Chunk{Index: i, Items: 1, Body: strings.Repeat("x", size)}
	}
	return out
}

func TestBatches(t *testing.T) {
	s := testSender(t, nil)
	var got []int
	for _, b := range s.batches("j", "", chunks(23, 10)) {
		got = append(got, len(b))
	}
	if fmt.Sprint(got) != "[10 10 3]" {
		t.Errorf("batches of %v, want [10 10 3]", got)
	}
	// Payload bound: 300 KiB messages, 1 MiB per call: three per batch.
	got = nil
	for _, b := range s.batches("j", "", chunks(7, 300<<10)) {
		got = append(got, len(b))
	}
	if fmt.Sprint(got) != "[3 3 1]" {
		t.Errorf("batches of %v, want [3 3 1]", got)
	}
}

// flaky fails each entry's first failures sends (retryably), and records
// every successful send.
type flaky struct {
	mu       sync.Mutex
	failures int
	seen     map[int]int // chunk → sends attempted
	sent     map[int]int // chunk → successful sends
}

func (f *flaky) SendBatch(_ context.Context, entries []Entry) ([]error, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs := make([]error, len(entries))
	for i, e := range entries {
		f.seen[e.Chunk]++
		if e.Chunk%3 == 0 && f.seen[e.Chunk] <= f.failures {
			errs[i] = &EntryError{Code: "InternalError", Message: "injected"}
			continue
		}
		f.sent[e.Chunk]++
	}
	return errs, nil
}

func TestSendRetriesFailedEntries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &flaky{failures: 2, seen: map[int]int{}, sent: map[int]int{}}
		s := testSender(t, q)
		start := time.Now()
		n, err := s.send(t.Context(), "j", "", chunks(25, 10))
		if err != nil || n != 25 {
			t.Fatalf("sent %d, %v; want 25, nil", n, err)
		}
		for c := range 25 {
			if q.sent[c] != 1 {
				t.Errorf("chunk %d sent %d times", c, q.sent[c])
			}
		}
		// Two retries: 50-100ms, then 100-200ms.
		if d := time.Since(start); d < 150*time.Millisecond || d > 300*time.Millisecond {
			t.Errorf("took %v of backoff, want 150-300ms", d)
		}
		if got := testutil.ToFloat64(s.m.sendRetries); got != 18 { // 9 chunks of 25 are multiples of 3, twice
			t.Errorf("retries counted %v, want 18", got)
		}
		if got := testutil.ToFloat64(s.m.failedEntries.WithLabelValues("InternalError")); got != 18 {
			t.Errorf("failed entries counted %v, want 18", got)
		}
	})
}

func TestSendGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &flaky{failures: 100, seen: map[int]int{}, sent: map[int]int{}}
		s := testSender(t, q)
		n, err := s.send(t.Context(), "j", "", chunks(10, 10))
		if err == nil || n != 6 {
			t.Fatalf("sent %d, %v; want 6 and an error", n, err)
		}
		if q.seen[0] != 5 {
			t.Errorf("chunk 0 tried %d times, want 5", q.seen[0])
		}
	})
}

func TestSendPermanentEntryError(t *testing.T) {
	calls := 0
	s := testSender(t, queueFunc(func(_ context.Context, entries []Entry) ([]error, error) {
		calls++
		errs := make([]error, len(entries))
		errs[1] = &EntryError{Code: "InvalidMessageContents", Message: "no", SenderFault: true}
		return errs, nil
	}))
	s.concurrency = 1
	n, err := s.send(t.Context(), "j", "", chunks(3, 10))
	var ee *EntryError
	if !errors.As(err, &ee) || ee.Code != "InvalidMessageContents" || n != 2 || calls != 1 {
		t.Errorf("sent %d in %d calls, %v; want 2 in 1 and the entry's error", n, calls, err)
	}
}

// An entry that fails by the setup (a disabled KMS key) is not sent again:
// no retry can succeed until an operator acts, and the job says so at once;
// one that was throttled is sent again, as SQS's own trouble is.
func TestSendNeedsOperatorEntryIsNotRetried(t *testing.T) {
	for _, tc := range []struct {
		code          string
		calls, sent   int
		needsOperator bool
	}{
		{"KmsDisabled", 1, 0, true},
		{"AWS.SimpleQueueService.KmsThrottled", 2, 1, false},
	} {
		synctest.Test(t, func(t *testing.T) {
			calls := 0
			s := testSender(t, queueFunc(func(_ context.Context, entries []Entry) ([]error, error) {
				calls++
				errs := make([]error, len(entries))
				if calls == 1 {
					errs[0] = &EntryError{Code: tc.code, Message: "injected"}
				}
				return errs, nil
			}))
			n, err := s.send(t.Context(), "j", "", chunks(1, 10))
			if calls != tc.calls || n != tc.sent || errors.Is(err, fault.ErrNeedsOperator) != tc.needsOperator {
				t.Errorf("%s: sent %d in %d calls, %v; want %d in %d, needing an operator: %v", tc.code, n, calls, err, tc.sent, tc.calls, tc.needsOperator)
			}
		})
	}
}

func TestSendCallError(t *testing.T) {
	s := testSender(t, queueFunc(func(context.Context, []Entry) ([]error, error) {
		return nil, errors.New("connection refused")
	}))
	n, err := s.send(t.Context(), "j", "", chunks(30, 10))
	if err == nil || n != 0 {
		t.Errorf("sent %d, %v", n, err)
	}
}
