package modelserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

// One congested interval halves the bound, and the concurrency bound holds
// the batch to it at once; clean intervals in which the batch used it all
// add Increase back, up to MaxConcurrency; one in which it did not, none.
func TestOnlineGivesWayAndTakesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conc := newConcurrency(32, quiet())
		o := newOnline(Online{Interval: time.Second, Increase: 4}, 32, conc)
		steps := []struct {
			name string
			sig  signals
			busy int // the batch's requests in flight during the interval
			want int
		}{
			{"clean, at the most already", signals{metrics: true}, 32, 32},
			{"online requests wait", signals{metrics: true, waiting: 3}, 32, 16},
			{"still waiting", signals{metrics: true, waiting: 1}, 16, 8},
			{"clean, bound used", signals{metrics: true}, 8, 12},
			{"clean, bound not used", signals{metrics: true}, 5, 12},
			{"clean, bound used", signals{metrics: true}, 12, 16},
		}
		for _, s := range steps {
			for range s.busy {
				o.sending()
			}
			for range s.busy {
				o.took(time.Millisecond)
			}
			if got := o.step(s.sig); got != s.want {
				t.Fatalf("%s: bound %d, want %d", s.name, got, s.want)
			}
		}
		// The concurrency bound holds the batch to 16: a 17th waits.
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		for range 16 {
			if _, err := conc.acquire(ctx); err != nil {
				t.Fatal(err)
			}
			o.sending()
		}
		got := make(chan error, 1)
		go func() { _, err := conc.acquire(ctx); got <- err }()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("a 17th request went out past the bound of 16")
		default:
		}
		o.step(signals{metrics: true}) // the batch used it all: 20
		synctest.Wait()
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("the raised bound let no waiting request out")
		}
	})
}

// The slack gate: once the server has shown it runs 64 (others waited
// then), an interval that ran past 64 less the headroom gives the excess
// back, and an increase stops at it.
func TestOnlineKeepsHeadroom(t *testing.T) {
	o := newOnline(Online{Interval: time.Second, Increase: 8, Headroom: 4}, 64, newConcurrency(64, quiet()))
	interval := func(busy int, sig signals) int {
		for range busy {
			o.sending()
		}
		for range busy {
			o.took(time.Millisecond)
		}
		sig.metrics = true
		return o.step(sig)
	}
	steps := []struct {
		name string
		busy int
		sig  signals
		want int
	}{
		{"online requests wait; capacity unknown", 64, signals{waiting: 1, running: 64}, 32},
		{"64 running while others waited: 4 into the headroom", 32, signals{running: 64, full: 64}, 28},
		{"50 running: room for 10, Increase 8", 28, signals{running: 50}, 36},
		{"57 running: room for 3", 36, signals{running: 57}, 39},
		{"62 running: 2 into the headroom", 39, signals{running: 62}, 37},
	}
	for _, s := range steps {
		if got := interval(s.busy, s.sig); got != s.want {
			t.Fatalf("%s: bound %d, want %d", s.name, got, s.want)
		}
	}
}

// Each signal, past its target, is congestion; under it, none.
func TestOnlineSignals(t *testing.T) {
	cfg := Online{Interval: time.Second, TargetWaiting: 2, TargetTTFT: 500 * time.Millisecond}
	cases := []struct {
		name string
		sig  signals
		gave bool
	}{
		{"waiting at the target", signals{metrics: true, waiting: 2}, false},
		{"waiting past it", signals{metrics: true, waiting: 3}, true},
		{"TTFT at the target", signals{metrics: true, ttftP99: 500 * time.Millisecond}, false},
		{"TTFT past it", signals{metrics: true, ttftP99: 750 * time.Millisecond}, true},
		{"KV cache under 95%", signals{metrics: true, kvUsage: 0.94}, false},
		{"KV cache at 95%", signals{metrics: true, kvUsage: 0.95}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := newOnline(cfg, 16, newConcurrency(16, quiet()))
			if got := o.step(c.sig); (got < 16) != c.gave {
				t.Errorf("bound %d after %+v; want given way: %v", got, c.sig, c.gave)
			}
		})
	}
}

// Without the server's metrics, the latency of the batch's own requests
// rules: a median past 1.5 times the lowest seen is congestion.
func TestOnlineLatencyWithoutMetrics(t *testing.T) {
	o := newOnline(Online{Interval: time.Second}, 16, newConcurrency(16, quiet()))
	interval := func(d time.Duration) int {
		for range 5 {
			o.sending()
			o.took(d)
		}
		return o.step(signals{})
	}
	if got := interval(time.Second); got != 16 {
		t.Fatalf("first interval: bound %d, want 16", got)
	}
	if got := interval(1400 * time.Millisecond); got != 16 {
		t.Fatalf("1.4 times the lowest: bound %d, want 16", got)
	}
	if got := interval(1600 * time.Millisecond); got != 8 {
		t.Fatalf("1.6 times the lowest: bound %d, want 8", got)
	}
}

// A configured priority replaces the body's own: a client cannot send its
// batch ahead of the product's traffic.
func TestOnlineMarksPriority(t *testing.T) {
	o := newOnline(Online{Interval: time.Second, Priority: 10}, 16, newConcurrency(16, quiet()))
	var got struct {
		Priority int    `json:"priority"`
		Model    string `json:"model"`
	}
	if err := json.Unmarshal(o.mark([]byte(`{"model":"m","priority":-100}`)), &got); err != nil {
		t.Fatal(err)
	}
	if got.Priority != 10 || got.Model != "m" {
		t.Errorf("marked body: %+v, want priority 10 and the model kept", got)
	}
	var off *online
	if b := off.mark([]byte(`{"model":"m"}`)); string(b) != `{"model":"m"}` {
		t.Errorf("mode off: body %s changed", b)
	}
	// A client's own priority never reaches the server: on a
	// priority-scheduled vLLM it would let its items jump the queue.
	if b := off.mark([]byte(`{"model":"m","priority":-100}`)); string(b) != `{"model":"m"}` {
		t.Errorf("mode off: a client's priority passed: %s", b)
	}
	if b := off.mark([]byte(`{"model":"m","messages":[{"role":"user","content":"\"priority\""}]}`)); !strings.Contains(string(b), `\"priority\"`) {
		t.Errorf("mode off: a body that names priority in a string changed: %s", b)
	}
}

func TestP99(t *testing.T) {
	at := func(counts ...float64) []histBucket {
		les := []float64{0.1, 0.5, 1, math.Inf(1)}
		out := make([]histBucket, len(les))
		for i := range les {
			out[i] = histBucket{le: les[i], count: counts[i]}
		}
		return out
	}
	prev := at(100, 100, 100, 100)
	cases := []struct {
		now  []histBucket
		want time.Duration
	}{
		{at(100, 100, 100, 100), 0},                      // nothing new
		{at(200, 200, 200, 200), 100 * time.Millisecond}, // all fast
		{at(198, 200, 200, 200), 500 * time.Millisecond}, // 2% slower
		{at(200, 200, 200, 202), 2 * time.Second},        // 2 of 102 past the last bound
		{at(1000, 1000, 1000, 1000)[:3], 0},              // other buckets
		{at(198, 198, 200, 200), 1 * time.Second},        // 2% past 0.5
	}
	for i, c := range cases {
		if got := p99(prev, c.now); got != c.want {
			t.Errorf("case %d: p99 %v, want %v", i, got, c.want)
		}
	}
}

// Against the fake, the bound follows its metrics: with every slot held by
// online traffic, the batch's requests wait, and the bound falls each
// interval; once the online load is light, it comes back.
func TestOnlineFollowsTheServer(t *testing.T) {
	fc := fakeoai.Config{MaxNumSeqs: 8, TokenLatency: 100 * time.Millisecond}
	cfg := Config{MaxConcurrency: 8, Online: Online{Interval: time.Second, Increase: 2}}
	inBubble(t, fc, cfg, func(t *testing.T, s *fakeoai.Server, m *Model) {
		if err := s.StartOnline(fakeoai.OnlineLoad{Low: 1, High: 1, Period: time.Hour, Prompt: 8, Output: 50}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		for range 3 { // 12 requests at once: more than the bound lets out
			go func() {
				items := make([]job.Item, 4)
				for i := range items {
					items[i] = chatItem(fmt.Sprint("b", i), "[[len=5]] q", 8)
				}
				for ctx.Err() == nil {
					_, _ = m.Run(ctx, "", items)
				}
			}()
		}
		time.Sleep(3500 * time.Millisecond)
		if got := m.online.current(); got > 2 {
			t.Fatalf("bound %d after three intervals of requests waiting, want at most 2", got)
		}
		if err := s.StartOnline(fakeoai.OnlineLoad{Low: 0, High: 0, Period: time.Hour, Prompt: 8, Output: 50}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		// The server ran 8 while others waited: its capacity, less the
		// headroom of 8/16 → 1.
		if got := m.online.current(); got != 7 {
			t.Errorf("bound %d once online traffic ended, want 7", got)
		}
		cancel()
	})
}

// recordingTransport keeps the bodies of the generation requests it passes
// on.
type recordingTransport struct {
	next   http.RoundTripper
	mu     sync.Mutex
	bodies []string
}

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == "/v1/chat/completions" {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.bodies = append(r.bodies, string(b))
		r.mu.Unlock()
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	return r.next.RoundTrip(req)
}

// In online-first mode with a priority, what reaches the server carries
// it, whatever the item's body said.
func TestOnlinePriorityReachesTheServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{PriorityScheduling: true})
		defer s.Close()
		rec := &recordingTransport{next: s.Client().Transport}
		m, err := Open(t.Context(), Config{BaseURL: s.URL(), HTTPClient: httpClient(rec), Models: []string{"fake-model"},
			Logger: quiet(), Online: Online{Interval: time.Second, Priority: 10}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		items := []job.Item{chatItem("a", "hi", 4),
			{ID: "b", Body: json.RawMessage(`{"model":"fake-model","messages":[{"role":"user","content":"x"}],"max_tokens":4,"priority":-5}`)}}
		outs, err := m.Run(t.Context(), "", items)
		if err != nil {
			t.Fatal(err)
		}
		wantOK(t, outs)
		if len(rec.bodies) != 2 {
			t.Fatalf("%d requests sent, want 2", len(rec.bodies))
		}
		for _, b := range rec.bodies {
			var v struct{ Priority *int }
			if json.Unmarshal([]byte(b), &v) != nil || v.Priority == nil || *v.Priority != 10 {
				t.Errorf("sent %s, want priority 10", b)
			}
		}
	})
}
