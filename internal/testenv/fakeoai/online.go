package fakeoai

import (
	"errors"
	"math"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// OnlineLoad is traffic the server serves besides the requests that come
// to it over HTTP: a product's online requests on the model server a batch
// consumer shares. It runs in a closed loop, as users who send again as soon
// as they are answered: the online requests in flight are kept at a target
// that moves between Low and High of MaxNumSeqs and back, linearly, once a
// Period (a triangle wave), each asking Prompt tokens and generating Output.
//
// What it models: an online request waits for a slot (max_num_seqs) and for
// its prompt's turn in the step's token budget (MaxNumBatchedTokens), behind
// what the batch consumer sent before it unless the server orders its queue
// by priority (PriorityScheduling); its time to first token is that wait
// plus the steps of its prefill, each lasting TokenLatency and StepTokenCost
// for every token the step computes. What it cannot show: a real engine's
// step time is not linear in its tokens, attention over long contexts
// costs more than short ones, and real users do not come back at once.
type OnlineLoad struct {
	Low, High      float64       // fractions of MaxNumSeqs, 0 to 1
	Period         time.Duration // server time, one cycle
	Prompt, Output int           // tokens of each request
}

func (l OnlineLoad) validate() error {
	if !(l.Low >= 0 && l.Low <= l.High && l.High <= 1) || l.Period <= 0 || l.Prompt < 1 || l.Output < 1 {
		return errors.New("fakeoai: online load: want 0 ≤ low ≤ high ≤ 1, a positive period, prompt and output")
	}
	return nil
}

// online is the load's state. s.mu guards it.
type online struct {
	load     OnlineLoad
	start    time.Time
	inFlight int
}

// target is the online requests to keep in flight at server time t.
func (o *online) target(t time.Time, seqs int) int {
	phase := math.Mod(t.Sub(o.start).Seconds()/o.load.Period.Seconds(), 1)
	tri := 1 - math.Abs(2*phase-1) // 0 → 1 → 0 over the period
	return int(math.Round((o.load.Low + (o.load.High-o.load.Low)*tri) * float64(seqs)))
}

// StartOnline starts l, in place of any load before it.
func (s *Server) StartOnline(l OnlineLoad) error {
	if err := l.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.online = &online{load: l, start: s.clock.now()}
	s.topUpOnline(s.online.start)
	return nil
}

// topUpOnline sends online requests until the target is in flight. s.mu
// is held.
func (s *Server) topUpOnline(now time.Time) {
	o := s.online
	if o == nil {
		return
	}
	for n := o.target(now, s.cfg.MaxNumSeqs); o.inFlight < n; o.inFlight++ {
		g := &group{online: o}
		g.jobs = []*job{{group: g, prompt: o.load.Prompt, natural: o.load.Output, length: o.load.Output, arrived: now}}
		g.left = 1
		g.done = make(chan struct{})
		s.queue(g.jobs[0])
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// queue puts j in the waiting queue: at the tail, or, with
// PriorityScheduling, behind every sequence of its priority or a more
// urgent one (lower values first, as vLLM orders them). s.mu is held.
func (s *Server) queue(j *job) {
	if !s.cfg.PriorityScheduling {
		s.waiting = append(s.waiting, j)
		return
	}
	i := len(s.waiting)
	for i > 0 && s.waiting[i-1].group.priority > j.group.priority {
		i--
	}
	s.waiting = slices.Insert(s.waiting, i, j)
}

// account, at the end of a step that lasts d, records the first token of
// the sequences that generated theirs in it, and the slots the online load
// left idle and those the others used. s.mu is held.
func (s *Server) account(now time.Time, d time.Duration) {
	end := now.Add(d)
	online := 0
	for _, j := range s.running {
		if j.group.online != nil {
			online++
		}
		if j.generated > 0 && !j.answered && j.length > 0 {
			j.answered = true
			ttft := end.Sub(j.arrived)
			s.ttft.Observe(ttft.Seconds())
			if j.group.online != nil {
				s.stats.OnlineTTFTs = append(s.stats.OnlineTTFTs, ttft)
			}
		}
	}
	if s.online != nil {
		idle := s.cfg.MaxNumSeqs - s.online.target(now, s.cfg.MaxNumSeqs)
		s.stats.IdleSlotSeconds += float64(idle) * d.Seconds()
		s.stats.OtherSlotSeconds += float64(len(s.running)-online) * d.Seconds()
	}
}

// onlineDone counts a request of load o answered. s.mu is held.
func (s *Server) onlineDone(o *online) {
	o.inFlight--
	s.stats.OnlineRequests++
}

// ttftBuckets are vLLM's for vllm:time_to_first_token_seconds.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
	2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

func newTTFT(model string) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:        "vllm:time_to_first_token_seconds",
		Help:        "Histogram of time to first token in seconds.",
		Buckets:     ttftBuckets,
		ConstLabels: prometheus.Labels{"model_name": model, "engine": "0"},
	})
}
