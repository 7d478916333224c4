package fakeoai_test

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// The online load keeps its target in flight, and its requests' first
// tokens come a prefill step after they arrive when slots are free; a batch
// request that holds a slot makes the next one wait for it.
func TestOnlineLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{MaxNumSeqs: 4, TokenLatency: time.Second})
		defer s.Close()
		if err := s.StartOnline(fakeoai.OnlineLoad{Low: 0.5, High: 0.5, Period: time.Minute, Prompt: 8, Output: 3}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Second)
		st := s.Stats()
		if st.Running != 2 || st.Waiting != 0 {
			t.Errorf("running %d, waiting %d; want the target, 2, running", st.Running, st.Waiting)
		}
		for i, d := range st.OnlineTTFTs {
			if d != time.Second {
				t.Fatalf("online request %d: first token after %v, want one step (1s)", i, d)
			}
		}
		// Three steps a request: 2 online slots answer 2 every 3 s.
		if st.OnlineRequests < 18 || st.OnlineRequests > 20 {
			t.Errorf("%d online requests answered in 30 s, want 20", st.OnlineRequests)
		}
		if st.IdleSlotSeconds != 60 {
			t.Errorf("idle slot-seconds %v, want 2 slots × 30 s", st.IdleSlotSeconds)
		}
		wait := concurrently(t, s, "/v1/completions",
			`{"model":"fake-model","prompt":"a [[len=20]]","max_tokens":20}`,
			`{"model":"fake-model","prompt":"b [[len=20]]","max_tokens":20}`,
			`{"model":"fake-model","prompt":"c [[len=20]]","max_tokens":20}`)
		time.Sleep(10 * time.Second)
		if slow := s.Stats().OnlineTTFTs; longest(slow) <= time.Second {
			t.Errorf("with every slot taken, online first tokens came within %v", longest(slow))
		}
		wait()
	})
}

func longest(d []time.Duration) time.Duration {
	var m time.Duration
	for _, x := range d {
		m = max(m, x)
	}
	return m
}

// With PriorityScheduling the waiting queue is ordered by priority, lower
// first; without it, by arrival.
func TestPriorityScheduling(t *testing.T) {
	for _, prio := range []bool{false, true} {
		t.Run(fmt.Sprint("priority ", prio), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := fakeoai.NewUnstarted(fakeoai.Config{MaxNumSeqs: 1, TokenLatency: time.Second, PriorityScheduling: prio})
				defer s.Close()
				body := func(name string, p int) string {
					return fmt.Sprintf(`{"model":"fake-model","prompt":"%s [[len=2]]","max_tokens":2,"priority":%d}`, name, p)
				}
				var order []string
				done := make(chan string, 3)
				for _, r := range []struct {
					name string
					p    int
				}{{"first", 0}, {"batch", 10}, {"online", 0}} {
					go func() {
						post(t, s, "/v1/completions", body(r.name, r.p))
						done <- r.name
					}()
					synctest.Wait()
				}
				for range 3 {
					order = append(order, <-done)
				}
				want := "first batch online"
				if prio {
					want = "first online batch"
				}
				if got := strings.Join(order, " "); got != want {
					t.Errorf("answered %s, want %s", got, want)
				}
			})
		})
	}
}
