package modelserver

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// turns queues a request for each key, in order, while another of first's
// key holds the turn and stays in flight, then lets the turn go and
// returns the order in which they were given it.
// It returns the counters too: groups met, and requests sent warm.
func turns(t *testing.T, first string, keys []string) (got []string, groups, warm float64) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		o := newPrefixOrder()
		ctx := context.Background()
		if err := o.wait(ctx, first); err != nil {
			t.Fatal(err)
		}
		o.sending(first) // stays in flight throughout
		var mu sync.Mutex
		for i, k := range keys {
			go func() {
				if err := o.wait(ctx, k); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got = append(got, fmt.Sprintf("%s%d", k, i))
				mu.Unlock()
				o.sending(k)
				o.pass()
				o.sent(k)
			}()
			synctest.Wait() // queued in this order
		}
		o.pass()
		synctest.Wait()
		groups, warm = testutil.ToFloat64(o.groups), testutil.ToFloat64(o.warm)
	})
	return got, groups, warm
}

func TestPrefixOrderPrefersWarm(t *testing.T) {
	got, groups, warm := turns(t, "a", []string{"b", "a", "b", "a", "", "a"})
	// a's are warm (one in flight); once they are gone b, the oldest,
	// is sent and warm in turn: the other b follows it, then the rest.
	want := []string{"a1", "a3", "a5", "b0", "b2", "4"}
	if !slices.Equal(got, want) {
		t.Errorf("turns %v, want %v", got, want)
	}
	// Groups a and b (no key is no group); warm: a1, a3, a5 and b2.
	if groups != 2 || warm != 4 {
		t.Errorf("counted %v groups and %v warm requests, want 2 and 4", groups, warm)
	}
}

func TestPrefixOrderFairness(t *testing.T) {
	keys := []string{"b"}
	for range prefixPassMax + 8 {
		keys = append(keys, "a")
	}
	got, _, _ := turns(t, "a", keys)
	if i := slices.Index(got, "b0"); i != prefixPassMax {
		t.Errorf("b went %d-th after %d a's came after it, want after %d (the pass bound): %v", i, len(keys)-1, prefixPassMax, got)
	}
}

func TestPrefixOrderGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newPrefixOrder()
		if err := o.wait(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- o.wait(ctx, "b") }()
		synctest.Wait()
		cancel()
		if err := <-done; err == nil {
			t.Fatal("a wait whose context ended returned no error")
		}
		o.pass()
		// The one that gave up left no turn behind: the next one gets it.
		if err := o.wait(t.Context(), "c"); err != nil {
			t.Fatal(err)
		}
	})
}

// Of two warm groups, the one with more in flight goes first: the server
// is likelier to keep its blocks.
func TestPrefixOrderPrefersTheWarmest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := newPrefixOrder()
		ctx := context.Background()
		if err := o.wait(ctx, "b"); err != nil {
			t.Fatal(err)
		}
		o.sending("a")
		o.sending("b")
		o.sending("b")
		var got []string
		for _, k := range []string{"a", "b"} {
			go func() {
				if o.wait(ctx, k) == nil {
					got = append(got, k)
					o.pass()
				}
			}()
			synctest.Wait()
		}
		o.pass()
		synctest.Wait()
		if !slices.Equal(got, []string{"b", "a"}) {
			t.Errorf("turns %v, want b (2 in flight) before a (1)", got)
		}
	})
}
