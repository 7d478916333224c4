package modelserver

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A backoff keeps what the batch finished. Two chat requests are out when
// an embeddings request is answered 429 with an hour's wait: they are
// answered, not cancelled, and their items' outputs come with the backoff
// (fault.PartialError). (That nothing is sent after it is in the
// subscriber's TestE2EModelServerBackoffKeepsFinishedChunks, one request at
// a time.)
func TestBackoffKeepsFinishedItems(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{TokenLatency: 100 * time.Millisecond, Faults: []fakeoai.Fault{
			{Kind: fakeoai.FaultStatus, Status: 429, RetryAfter: time.Hour, Times: 1, Paths: []string{"/v1/embeddings"}}}})
		defer s.Close()
		// The 429 comes once the chat requests are out (their 8 tokens
		// take 800 ms), not before.
		base := s.Client().Transport
		client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Path == "/v1/embeddings" {
				time.Sleep(300 * time.Millisecond)
			}
			return base.RoundTrip(r)
		})}
		m, err := Open(t.Context(), Config{BaseURL: s.URL(), HTTPClient: client, Models: []string{"fake-model"},
			MaxConcurrency: 3, MaxWait: time.Minute, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		// A process's first request goes alone (gate.go); this one opens
		// the gate for the batch.
		if _, err := m.Run(t.Context(), "", []job.Item{chatItem("w", "warm", 1)}); err != nil {
			t.Fatal(err)
		}
		before := s.Stats().Requests

		items := []job.Item{chatItem("c0", "one", 8), chatItem("c1", "two", 8), embedItem("e", "three")}
		outs, err := m.Run(t.Context(), "", items)
		if !errors.Is(err, fault.ErrBackoff) || outs != nil {
			t.Fatalf("Run = %d outputs, %v; want none and a backoff", len(outs), err)
		}
		got, done, ok := fault.Partial[job.Output](err)
		if !ok {
			t.Fatalf("the backoff %v carries no outputs", err)
		}
		if diff := cmp.Diff([]bool{true, true, false}, done); diff != "" {
			t.Errorf("finished items (-want +got):\n%s", diff)
		}
		wantOK(t, got[:2])
		for i, o := range got[:2] {
			if o.ID != items[i].ID {
				t.Errorf("output %d is %q's; want %q's", i, o.ID, items[i].ID)
			}
		}
		if n := s.Stats().Requests - before; n != 3 {
			t.Errorf("%d requests; want 3", n)
		}
	})
}

// A wait ended because the requests' context ended returns that context's
// error (here its deadline), not the Canceled of the link that ended it:
// Run under a context that times out says so, whichever of its waits or
// requests returns first (TestUnansweredTryGivesBackItsTurn failed about
// once in 100 runs on that race).
func TestGroupWaitEndedBySentHasSentsError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sent, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		// wait's own parent never ends: only the link to sent ends it.
		g := newGroup(sent, t.Context())
		g.Go(func(_, wait context.Context) error {
			<-wait.Done()
			return wait.Err()
		})
		if err := g.Wait(); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Wait: %v; want the requests' context's deadline", err)
		}
	})
}
