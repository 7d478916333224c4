package batcher

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// calls records the batches a handler was given, and when.
type calls struct {
	mu      sync.Mutex
	start   time.Time
	batches [][]string
	at      []time.Duration // since start
	hold    chan struct{}   // when set, each call waits for it to be closed
	running atomic.Int32
	most    atomic.Int32 // the most calls running at once
}

func newCalls() *calls { return &calls{start: time.Now()} }

func (c *calls) handle(batch []string) {
	n := c.running.Add(1)
	defer c.running.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	c.mu.Lock()
	c.batches = append(c.batches, batch)
	c.at = append(c.at, time.Since(c.start))
	hold := c.hold
	c.mu.Unlock()
	if hold != nil {
		<-hold
	}
}

func (c *calls) got() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]string(nil), c.batches...)
}

func (c *calls) times() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.at...)
}

func items(prefix string, n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = prefix + strconv.Itoa(i)
	}
	return s
}

func addAll(b *Batcher[string], items []string, size int) {
	for _, it := range items {
		b.Add(it, size)
	}
}

// A batch that fills goes at once, on the goroutine whose item filled it
// under OnCaller; what is left waits its delay.
func TestFullBatchGoesAtOnce(t *testing.T) {
	for _, onCaller := range []bool{true, false} {
		t.Run("OnCaller="+strconv.FormatBool(onCaller), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCalls()
				b := New(Options{MaxItems: 3, MaxDelay: time.Second, OnCaller: onCaller}, c.handle)
				addAll(b, items("a", 4), 1)
				if !onCaller {
					synctest.Wait()
				}
				want := [][]string{{"a0", "a1", "a2"}}
				if diff := cmp.Diff(want, c.got()); diff != "" {
					t.Fatalf("batches before the delay (-want +got):\n%s", diff)
				}
				time.Sleep(time.Second)
				synctest.Wait()
				want = append(want, []string{"a3"})
				if diff := cmp.Diff(want, c.got()); diff != "" {
					t.Errorf("batches after the delay (-want +got):\n%s", diff)
				}
				if at := c.times(); at[0] != 0 || at[1] != time.Second {
					t.Errorf("batches went at %v, want [0 1s]", at)
				}
			})
		})
	}
}

func TestBatchBoundedByBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCalls()
		b := New(Options{MaxItems: 10, MaxBytes: 1000, MaxDelay: time.Second, OnCaller: true}, c.handle)
		addAll(b, items("a", 7), 300) // 900 bytes a batch: the fourth item would pass 1000
		want := [][]string{{"a0", "a1", "a2"}, {"a3", "a4", "a5"}}
		if diff := cmp.Diff(want, c.got()); diff != "" {
			t.Fatalf("batches (-want +got):\n%s", diff)
		}
		b.Add("big", 1500) // over MaxBytes: after a6, alone
		b.Add("b0", 1000)  // exactly MaxBytes: full alone
		want = append(want, []string{"a6"}, []string{"big"}, []string{"b0"})
		if diff := cmp.Diff(want, c.got()); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
	})
}

// The delay runs from a batch's first item, not its last, and a timer armed
// for a batch that filled before it fired does not cut the next one short.
func TestDelayStartsWithEachBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCalls()
		b := New(Options{MaxItems: 10, MaxDelay: 100 * time.Millisecond}, c.handle)
		addAll(b, items("a", 3), 1) // its delay: until 100ms
		time.Sleep(90 * time.Millisecond)
		addAll(b, items("b", 7), 1) // full at 90ms
		time.Sleep(5 * time.Millisecond)
		b.Add("c", 1) // a batch of its own: until 195ms
		time.Sleep(50 * time.Millisecond)
		b.Add("d", 1) // joins c's
		time.Sleep(time.Second)
		synctest.Wait()
		want := [][]string{append(items("a", 3), items("b", 7)...), {"c", "d"}}
		if diff := cmp.Diff(want, c.got()); diff != "" {
			t.Fatalf("batches (-want +got):\n%s", diff)
		}
		if at := c.times(); at[1] != 195*time.Millisecond {
			t.Errorf("the second batch went at %v, want 195ms (95ms + the delay)", at[1])
		}
	})
}

// A batch that filled while the only handler was busy waits for it, and
// the items that came meanwhile go in the following batches, within bounds.
func TestMaxHandlers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCalls()
		c.hold = make(chan struct{})
		b := New(Options{MaxItems: 2, MaxDelay: time.Second, MaxHandlers: 1}, c.handle)
		addAll(b, items("a", 7), 1)
		synctest.Wait()
		if n := len(c.got()); n != 1 || b.Len() != 5 {
			t.Fatalf("%d batches started, %d items pending; want 1 and 5 while the handler is busy", n, b.Len())
		}
		close(c.hold)
		synctest.Wait()
		want := [][]string{{"a0", "a1"}, {"a2", "a3"}, {"a4", "a5"}}
		if diff := cmp.Diff(want, c.got()); diff != "" {
			t.Fatalf("batches (-want +got):\n%s", diff)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := len(c.got()); n != 4 || c.most.Load() != 1 {
			t.Errorf("%d batches, at most %d at once; want 4, one at a time", n, c.most.Load())
		}
	})
}

// Without a bound, batches that are ready together run at once.
func TestHandlersRunAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCalls()
		c.hold = make(chan struct{})
		b := New(Options{MaxItems: 2, MaxDelay: time.Hour}, c.handle)
		addAll(b, items("a", 5), 1)
		b.Flush()
		synctest.Wait()
		if n := c.running.Load(); n != 3 {
			t.Errorf("%d handlers running, want 3", n)
		}
		close(c.hold)
	})
}

func TestFlushSendsWhatIsPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCalls()
		b := New(Options{MaxItems: 10, MaxDelay: time.Hour, OnCaller: true}, c.handle)
		addAll(b, items("a", 2), 1)
		b.Flush()
		if diff := cmp.Diff([][]string{{"a0", "a1"}}, c.got()); diff != "" {
			t.Fatalf("batches (-want +got):\n%s", diff)
		}
		b.Flush() // nothing pending: no empty batch
		b.Add("b", 1)
		time.Sleep(time.Hour - time.Nanosecond)
		synctest.Wait()
		if n := len(c.got()); n != 1 {
			t.Fatalf("%d batches: the flush left the next item less than its delay", n)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if n := len(c.got()); n != 2 {
			t.Errorf("%d batches after the delay, want 2", n)
		}
	})
}

// Shutdown sends what is pending at once and returns once every handler
// has, including one another goroutine runs; later items go at once.
func TestShutdownDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCalls()
		c.hold = make(chan struct{})
		b := New(Options{MaxItems: 3, MaxDelay: time.Hour, OnCaller: true}, c.handle)
		go addAll(b, items("full", 3), 1) // a caller, handling
		synctest.Wait()
		addAll(b, items("late", 2), 1) // waiting for company
		var done atomic.Bool
		go func() {
			if err := b.Shutdown(context.Background()); err != nil {
				t.Error(err)
			}
			done.Store(true)
		}()
		synctest.Wait()
		if done.Load() {
			t.Fatal("Shutdown returned while handlers were running")
		}
		start := time.Now()
		close(c.hold)
		synctest.Wait()
		if !done.Load() || time.Since(start) != 0 {
			t.Fatal("Shutdown did not return once the handlers had")
		}
		if n := len(c.got()); n != 2 {
			t.Fatalf("%d batches, want 2", n)
		}
		b.Add("after", 1)
		if n := len(c.got()); n != 3 {
			t.Errorf("an item added after Shutdown waited")
		}
	})
}

func TestShutdownGivesUpWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCalls()
		c.hold = make(chan struct{})
		defer close(c.hold)
		b := New(Options{}, c.handle)
		b.Add("a", 1)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != context.DeadlineExceeded {
			t.Errorf("Shutdown returned %v with a handler stuck, want the deadline", err)
		}
	})
}

func TestZeroOptionsHandEachItemAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCalls()
		b := New(Options{}, c.handle)
		addAll(b, items("a", 3), 100)
		synctest.Wait()
		if n := len(c.got()); n != 3 {
			t.Errorf("%d batches, want 3", n)
		}
	})
}

func TestSplit(t *testing.T) {
	size := func(s string) int { return len(s) }
	for _, tc := range []struct {
		name  string
		items []string
		o     Options
		want  [][]string
	}{
		{"none", nil, Options{MaxItems: 2}, nil},
		{"count", []string{"a", "b", "c"}, Options{MaxItems: 2}, [][]string{{"a", "b"}, {"c"}}},
		{"bytes", []string{"aa", "bb", "c", "dddd"}, Options{MaxBytes: 5}, [][]string{{"aa", "bb", "c"}, {"dddd"}}},
		{"oversize", []string{"a", "bbbbbb", "c"}, Options{MaxBytes: 5}, [][]string{{"a"}, {"bbbbbb"}, {"c"}}},
		{"both", []string{"a", "b", "ccc", "dd"}, Options{MaxItems: 2, MaxBytes: 4}, [][]string{{"a", "b"}, {"ccc"}, {"dd"}}},
		{"no bounds", []string{"a", "b"}, Options{}, [][]string{{"a", "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Split(tc.items, size, tc.o)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// Items here are words: a word's count is its number of dashes plus one
// (an embeddings item of several inputs), its size its length.
func TestCut(t *testing.T) {
	for _, tc := range []struct {
		name  string
		items string
		b     Bounds
		want  [][]string
	}{
		{"none", "", Bounds{Count: 2}, nil},
		{"count", "a b c", Bounds{Count: 2}, [][]string{{"a", "b"}, {"c"}}},
		{"weighted count", "a-b c d-e-f g", Bounds{Count: 3}, [][]string{{"a-b", "c"}, {"d-e-f"}, {"g"}}},
		{"count past the bound alone", "a b-c-d e", Bounds{Count: 2}, [][]string{{"a"}, {"b-c-d"}, {"e"}}},
		{"size", "aa bb c dddd", Bounds{Size: 5}, [][]string{{"aa", "bb", "c"}, {"dddd"}}},
		{"size exactly at the bound", "aa bbb c", Bounds{Size: 5}, [][]string{{"aa", "bbb"}, {"c"}}},
		{"size past the bound alone", "a bbbbbb c", Bounds{Size: 5}, [][]string{{"a"}, {"bbbbbb"}, {"c"}}},
		{"whichever comes first", "a b ccc dd", Bounds{Count: 2, Size: 4}, [][]string{{"a", "b"}, {"ccc"}, {"dd"}}},
		{"no bounds", "a b-c ddd", Bounds{}, [][]string{{"a", "b-c", "ddd"}}},
		{"negative is none", "a b", Bounds{Count: -1, Size: -1}, [][]string{{"a", "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := strings.Fields(tc.items)
			weighed := 0
			weigh := func(s string) (int, int64) {
				weighed++
				return strings.Count(s, "-") + 1, int64(len(s))
			}
			got := Cut(items, tc.b, weigh)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if weighed != len(items) {
				t.Errorf("weighed %d times for %d items, want once each", weighed, len(items))
			}
			// The groups share items' array, and appending to one does not
			// write over the next.
			if len(got) > 1 {
				_ = append(got[0], "x")
				if got[1][0] == "x" {
					t.Error("appending to a group wrote over the next")
				}
			}
		})
	}
}

func TestTakeReturnsTheGroupsSize(t *testing.T) {
	sizes := []int64{3, 4, 5}
	k, size := Bounds{Size: 8}.Take(len(sizes), func(i int) (int, int64) { return 1, sizes[i] })
	if k != 2 || size != 7 {
		t.Errorf("Take = %d items of %d bytes, want 2 of 7", k, size)
	}
}
