package overhead

import (
	"math"
	"testing"
	"time"
)

func TestSummarizeTimeline(t *testing.T) {
	ms := time.Millisecond
	calls := []timelineCall{
		// Receives 0-4ms and 5-9ms: in flight 8 of 10ms, gaps of 1ms.
		{Action: "ReceiveMessage", Start: 0, End: 4 * ms, Entries: 10},
		{Action: "ReceiveMessage", Start: 5 * ms, End: 9 * ms, Entries: 6},
		// Deletes overlapping the second receive: three calls at once.
		{Action: "DeleteMessageBatch", Start: 6 * ms, End: 8 * ms, Entries: 10, NewConn: true},
		{Action: "DeleteMessageBatch", Start: 7 * ms, End: 12 * ms, Entries: 6},
		// Started after the run: left out.
		{Action: "ReceiveMessage", Start: 11 * ms, End: 12 * ms},
	}
	s := summarize(calls, 10*ms, 16)
	if math.Abs(s.ReceiveIdle-0.2) > 1e-9 {
		t.Errorf("receive idle %v, want 0.2", s.ReceiveIdle)
	}
	if s.ReceiveGapP50 != ms {
		t.Errorf("receive gap p50 %v, want 1ms", s.ReceiveGapP50)
	}
	r, d := s.Actions["ReceiveMessage"], s.Actions["DeleteMessageBatch"]
	if r.Calls != 2 || r.Entries != 8 || r.P50 != 4*ms {
		t.Errorf("receives %+v, want 2 calls of 8 on average, p50 4ms", *r)
	}
	// 2ms + 3ms (cut at the run's end) of 10ms.
	if d.Calls != 2 || math.Abs(d.InFlight-0.5) > 1e-9 {
		t.Errorf("deletes %+v, want 2 calls, 0.5 in flight", *d)
	}
	if s.MaxInFlight != 3 || s.NewConns != 1 {
		t.Errorf("most in flight %d, new connections %d; want 3 and 1", s.MaxInFlight, s.NewConns)
	}
}
