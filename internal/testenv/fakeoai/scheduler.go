package fakeoai

import (
	"slices"
	"time"
)

// The scheduler is vLLM V1's, reduced to what a client can see: sequences
// wait in a FIFO queue; each step, the running ones (oldest first) each
// generate a token, taking a KV block whenever they cross a block boundary;
// when the pool has no free block, the last scheduled sequence is preempted
// (its blocks freed, its tokens kept to be recomputed) and put back at the
// head of the queue, and no waiting sequence is scheduled that step;
// otherwise waiting sequences are scheduled from the head while a slot
// (max_num_seqs) and the blocks for their prompt and tokens so far are free.
// A scheduled sequence's first step is its prefill, which yields a token.

// job is one sequence: one choice of one prompt, or one embedding input.
type job struct {
	group     *group
	prompt    int // tokens
	natural   int // tokens it would generate with no max_tokens
	length    int // tokens to generate; 0 for an embedding
	generated int
	blocks    int
	stepped   bool // ran at least one step (an embedding is done then)

	hashes  []uint64 // of its prompt's full blocks, with prefix caching
	shared  int      // leading blocks of blocks held in the prefix cache
	prefill int      // prompt tokens still to compute before it generates

	arrived  time.Time // server time it was queued
	answered bool      // its first token is out (online.go's account)
}

// finishReason is "length" when max_tokens cut the choice short.
func (j *job) finishReason() string {
	if j.length < j.natural {
		return "length"
	}
	return "stop"
}

func (j *job) done() bool {
	if j.length == 0 {
		return j.stepped
	}
	return j.generated >= j.length
}

// group is the sequences of one request, answered when all are done.
type group struct {
	jobs        []*job
	left        int
	preemptions int
	aborted     bool
	done        chan struct{}
	online      *online // the OnlineLoad it is of, answered to no one; nil: a client's
	priority    int     // the request's, with PriorityScheduling
}

// enqueue puts g's sequences at the tail of the queue. s.mu is held.
func (s *Server) enqueue(g *group) {
	g.left = len(g.jobs)
	g.done = make(chan struct{})
	for _, j := range g.jobs {
		s.queue(j)
	}
	s.inflight++
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// schedule runs the step loop until Close.
func (s *Server) schedule() {
	defer close(s.loopDone)
	for {
		s.mu.Lock()
		s.dropAborted()
		now := s.clock.now()
		s.topUpOnline(now)
		if len(s.running) == 0 && len(s.waiting) == 0 {
			s.mu.Unlock()
			select {
			case <-s.wake:
				continue
			case <-s.quit:
				return
			}
		}
		tokens := s.step()
		latency := s.cfg.TokenLatency + time.Duration(tokens)*s.cfg.StepTokenCost
		s.account(now, latency)
		s.mu.Unlock()

		if !s.clock.sleep(latency, s.quit) {
			return
		}

		s.mu.Lock()
		s.finish()
		s.mu.Unlock()
	}
}

// step allocates and generates one step's tokens. s.mu is held.
//
// A step computes at most Config.MaxNumBatchedTokens tokens, as vLLM's
// chunked prefill does: a token for each running sequence that generates,
// then the prompts of those still in prefill, oldest first, then new ones.
// It returns the tokens it computed.
func (s *Server) step() int {
	budget := s.cfg.MaxNumBatchedTokens
	if budget == 0 {
		budget = int(^uint(0) >> 1)
	}
	start := budget
	preempted := false
	for i := 0; i < len(s.running); i++ {
		j := s.running[i]
		if j.done() || j.prefill > 0 {
			continue
		}
		need := blocksFor(j.prompt+j.generated+1, s.cfg.BlockSize) - j.blocks
		for need > s.free() {
			victim := s.running[len(s.running)-1]
			s.running = s.running[:len(s.running)-1]
			s.release(victim)
			victim.group.preemptions++
			s.stats.Preemptions++
			s.waiting = slices.Insert(s.waiting, 0, victim) // first again, whatever its priority
			preempted = true
			if victim == j {
				break
			}
		}
		if i >= len(s.running) { // j itself was preempted
			break
		}
		s.grow(need)
		j.blocks += need
		j.generated++
		budget--
	}
	for _, j := range s.running {
		if j.prefill > 0 && budget > 0 {
			budget -= s.prefill(j, budget)
		}
	}
	for !preempted && budget > 0 && len(s.waiting) > 0 && len(s.running) < s.cfg.MaxNumSeqs {
		j := s.waiting[0]
		need := 0
		if j.length > 0 {
			need = blocksFor(j.prompt+j.generated+1, s.cfg.BlockSize)
		}
		hit, idle := s.hits(j)
		hit = min(hit, need)
		if need-hit+min(idle, hit) > s.free() {
			break
		}
		s.waiting = s.waiting[1:]
		s.running = append(s.running, j)
		s.attach(j, need)
		budget -= s.prefill(j, budget)
	}
	for _, j := range s.running {
		if j.prefill == 0 {
			j.stepped = true
		}
	}
	s.stats.MaxRunning = max(s.stats.MaxRunning, len(s.running))
	return start - budget
}

// prefill computes up to budget tokens of j's prompt and returns how many;
// the step that ends it yields j's first token, whose block attach took.
// s.mu is held.
func (s *Server) prefill(j *job, budget int) int {
	n := min(j.prefill, budget)
	if j.prefill -= n; j.prefill == 0 && j.length > 0 {
		j.generated++
	}
	return n
}

// grow takes n fresh blocks, evicting idle cached ones when no block that
// never held anything is left. s.mu is held.
func (s *Server) grow(n int) {
	for clean := s.cfg.NumGPUBlocks - s.used - s.idle.Len(); clean < n; clean++ {
		e := s.idle.Front()
		s.idle.Remove(e)
		delete(s.cache, e.Value.(uint64))
	}
	s.setUsed(s.clock.now(), s.used+n)
}

// finish retires the sequences the last step completed. s.mu is held.
func (s *Server) finish() {
	s.running = slices.DeleteFunc(s.running, func(j *job) bool {
		if !j.done() {
			return false
		}
		s.release(j)
		if j.group.left--; j.group.left == 0 {
			close(j.group.done)
			if j.group.online != nil {
				s.onlineDone(j.group.online)
			}
		}
		return true
	})
}

// dropAborted takes out the sequences of requests whose client went away.
// s.mu is held.
func (s *Server) dropAborted() {
	gone := func(j *job) bool {
		if !j.group.aborted {
			return false
		}
		s.release(j)
		return true
	}
	s.running = slices.DeleteFunc(s.running, gone)
	s.waiting = slices.DeleteFunc(s.waiting, gone)
}

func (s *Server) free() int { return s.cfg.NumGPUBlocks - s.used }

// setUsed changes the blocks in use, adding the time the old count was held
// to the ledger's KV integral. s.mu is held.
func (s *Server) setUsed(now time.Time, used int) {
	s.kvIntegrate(now)
	s.used = used
	s.stats.MaxKVBlocksUsed = max(s.stats.MaxKVBlocksUsed, used)
}

// kvIntegrate adds used × the server time since the last call to the
// minutes it spans. s.mu is held.
func (s *Server) kvIntegrate(now time.Time) {
	for s.kvLast.Before(now) {
		m := s.minute(s.kvLast)
		end := m.Start.Add(time.Minute)
		if end.After(now) {
			end = now
		}
		m.kvBlockNanos += float64(s.used) * float64(end.Sub(s.kvLast))
		s.kvLast = end
	}
}
