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
}

// enqueue puts g's sequences at the tail of the queue. s.mu is held.
func (s *Server) enqueue(g *group) {
	g.left = len(g.jobs)
	g.done = make(chan struct{})
	s.waiting = append(s.waiting, g.jobs...)
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
		if len(s.running) == 0 && len(s.waiting) == 0 {
			s.mu.Unlock()
			select {
			case <-s.wake:
				continue
			case <-s.quit:
				return
			}
		}
		s.step()
		latency := s.cfg.TokenLatency
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
func (s *Server) step() {
	now := s.clock.now()
	preempted := false
	for i := 0; i < len(s.running); i++ {
		j := s.running[i]
		if j.done() {
			continue
		}
		need := blocksFor(j.prompt+j.generated+1, s.cfg.BlockSize) - j.blocks
		for need > s.free() {
			victim := s.running[len(s.running)-1]
			s.running = s.running[:len(s.running)-1]
			s.setUsed(now, s.used-victim.blocks)
			victim.blocks = 0
			victim.group.preemptions++
			s.stats.Preemptions++
			s.waiting = slices.Insert(s.waiting, 0, victim)
			preempted = true
			if victim == j {
				break
			}
		}
		if i >= len(s.running) { // j itself was preempted
			break
		}
		s.setUsed(now, s.used+need)
		j.blocks += need
		j.generated++
	}
	for !preempted && len(s.waiting) > 0 && len(s.running) < s.cfg.MaxNumSeqs {
		j := s.waiting[0]
		need := 0
		if j.length > 0 {
			need = blocksFor(j.prompt+j.generated+1, s.cfg.BlockSize)
		}
		if need > s.free() {
			break
		}
		s.waiting = s.waiting[1:]
		s.running = append(s.running, j)
		s.setUsed(now, s.used+need)
		j.blocks = need
		if j.length > 0 {
			j.generated++
		}
	}
	for _, j := range s.running {
		j.stepped = true
	}
	s.stats.MaxRunning = max(s.stats.MaxRunning, len(s.running))
}

// finish retires the sequences the last step completed. s.mu is held.
func (s *Server) finish() {
	now := s.clock.now()
	s.running = slices.DeleteFunc(s.running, func(j *job) bool {
		if !j.done() {
			return false
		}
		s.setUsed(now, s.used-j.blocks)
		j.blocks = 0
		if j.group.left--; j.group.left == 0 {
			close(j.group.done)
		}
		return true
	})
}

// dropAborted takes out the sequences of requests whose client went away.
// s.mu is held.
func (s *Server) dropAborted() {
	now := s.clock.now()
	gone := func(j *job) bool {
		if !j.group.aborted {
			return false
		}
		s.setUsed(now, s.used-j.blocks)
		j.blocks = 0
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
