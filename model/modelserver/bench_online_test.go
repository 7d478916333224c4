package modelserver

// The online-first figures of issue 36, against internal/testenv/fakeoai
// with an online load it generates itself, over TCP, its clock running
// onlineBenchSpeed times as fast as the real one. Not a pass/fail test: it
// prints what it measured, and bench/modelserver.md records the figures and
// the command. It runs only when VRAMQ_BENCH_ONLINE is set.

import (
	"context"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

const (
	onlineBenchSpeed   = 5
	onlineBenchSeqs    = 64              // the server's max_num_seqs
	onlineBenchPeriod  = time.Minute     // server time: 20% → 90% → 20%
	onlineBenchRun     = 2 * time.Minute // server time
	onlineBenchStep    = 20 * time.Millisecond
	onlineBenchPerTok  = 10 * time.Microsecond
	onlineBenchWorkers = 16 // the batch's messages in flight, 8 items each
)

type onlineConsumer struct {
	name   string
	server func(*fakeoai.Config)
	model  func(*Config)
	none   bool // no batch at all
}

type onlineResult struct {
	p99, p50    time.Duration
	online      int64
	batchItems  int64
	idleUse     float64
	statuses    map[int]int64
	preemptions int64
}

func runOnline(t *testing.T, c onlineConsumer) onlineResult {
	fc := fakeoai.Config{Speed: onlineBenchSpeed, TokenLatency: onlineBenchStep, StepTokenCost: onlineBenchPerTok,
		MaxNumSeqs: onlineBenchSeqs, PriorityScheduling: true, MaxNumBatchedTokens: 2048}
	if c.server != nil {
		c.server(&fc)
	}
	s := fakeoai.New(fc)
	defer s.Close()
	if err := s.StartOnline(fakeoai.OnlineLoad{Low: 0.2, High: 0.9, Period: onlineBenchPeriod, Prompt: 128, Output: 64}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(float64(onlineBenchRun)/onlineBenchSpeed))
	defer cancel()
	var items atomic.Int64
	if !c.none {
		cfg := Config{BaseURL: s.URL(), Models: []string{"fake-model"}, Logger: quiet(), MaxConcurrency: onlineBenchSeqs,
			MaxWait: time.Hour}
		if c.model != nil {
			c.model(&cfg)
		}
		m, err := Open(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		w := newWorkload(7, 128, [2]int{10, 30}, [2]int{16, 96})
		var wg sync.WaitGroup
		for range onlineBenchWorkers {
			wg.Go(func() {
				for ctx.Err() == nil {
					batch := make([]job.Item, 8)
					for i := range batch {
						batch[i], _ = w.next()
					}
					outs, err := m.Run(ctx, "", batch)
					if err != nil {
						continue
					}
					for _, o := range outs {
						if o.Error == nil {
							items.Add(1)
						}
					}
				}
			})
		}
		defer wg.Wait()
	}
	<-ctx.Done()
	st := s.Stats()
	ttfts := slices.Clone(st.OnlineTTFTs)
	slices.Sort(ttfts)
	r := onlineResult{online: st.OnlineRequests, batchItems: items.Load(), statuses: st.ByStatus, preemptions: st.Preemptions}
	if n := len(ttfts); n > 0 {
		r.p99, r.p50 = ttfts[n*99/100], ttfts[n/2]
	}
	if st.IdleSlotSeconds > 0 {
		r.idleUse = st.OtherSlotSeconds / st.IdleSlotSeconds
	}
	return r
}

func TestBenchOnline(t *testing.T) {
	if os.Getenv("VRAMQ_BENCH_ONLINE") == "" {
		t.Skip("set VRAMQ_BENCH_ONLINE=1 to run the online-first benchmark")
	}
	interval := time.Second / onlineBenchSpeed // one server second
	consumers := []onlineConsumer{
		{name: "online alone (no batch)", none: true},
		{name: "online-first (this mode)", model: func(c *Config) {
			c.Online = Online{Interval: interval, Priority: 10} // headroom 2, increase 8: the defaults at 64
		}},
		{name: "fixed concurrency 64", model: nil},
		{name: "backs off on 429/5xx only", server: func(fc *fakeoai.Config) {
			fc.MaxQueuedRequests = onlineBenchSeqs + onlineBenchSeqs/4
		}},
	}
	var base onlineResult
	for i, c := range consumers {
		r := runOnline(t, c)
		if i == 0 {
			base = r
		}
		t.Logf("%-28s online TTFT p50 %6v p99 %6v (%+5.1f%% of alone)  online answered %5d  batch items %5d  batch use of idle slots %5.1f%%  503s %d  preemptions %d",
			c.name, r.p50.Round(time.Millisecond/10), r.p99.Round(time.Millisecond/10), 100*(float64(r.p99)/float64(base.p99)-1), r.online, r.batchItems, 100*r.idleUse,
			r.statuses[503], r.preemptions)
	}
}
