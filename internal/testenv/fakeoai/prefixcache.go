package fakeoai

import (
	"container/list"
	"hash/fnv"
	"strings"
)

// The prefix cache is vLLM's automatic prefix caching
// (docs/design/prefix_caching.md, https://docs.vllm.ai/en/stable/design/prefix_caching/),
// reduced to what a client can see: each full block of a prompt is known by
// a hash of its tokens and of every block before it, so a block is reused
// only behind the same prefix; a new sequence takes the leading blocks the
// cache holds (shared, counted once in the pool) and computes only the rest
// of its prompt; a block no sequence holds stays cached, free to be
// evicted, the least recently freed first, when a new block is needed and
// no block that never held anything is left.
//
// What it cannot show: its tokens are the prompt's words (CountTokens), not
// those a chat template renders, so a chat's role and priming tokens are in
// no block; the hashes cover a prompt's words in blocks of BlockSize, up to
// the whole blocks its prompt tokens fill.

// cachedBlock is one block of the cache: held by refs running sequences, or
// idle (refs 0) in the eviction list.
type cachedBlock struct {
	refs int
	idle *list.Element
}

// blockHashes are the chained hashes of the full blocks of text's words,
// at most prompt / size of them. nil when caching is off.
func (s *Server) blockHashes(text string, prompt int) []uint64 {
	if !s.cfg.PrefixCaching {
		return nil
	}
	size := s.cfg.BlockSize
	w := strings.Fields(text)
	n := min(len(w), prompt) / size
	hs := make([]uint64, n)
	var prev uint64
	for b := range n {
		h := fnv.New64a()
		var seed [8]byte
		for i := range seed {
			seed[i] = byte(prev >> (8 * i))
		}
		h.Write(seed[:])
		for _, t := range w[b*size : (b+1)*size] {
			h.Write([]byte(t))
			h.Write([]byte{' '})
		}
		prev = h.Sum64()
		hs[b] = prev
	}
	return hs
}

// hits is how many of j's leading blocks the cache holds, and how many of
// those are idle (taking them takes blocks from the free ones). s.mu is held.
func (s *Server) hits(j *job) (hit, idle int) {
	for _, h := range j.hashes {
		b, ok := s.cache[h]
		if !ok {
			break
		}
		hit++
		if b.refs == 0 {
			idle++
		}
	}
	return hit, idle
}

// attach gives j, being scheduled, its blocks: the hit leading ones from
// the cache, need in all, the fresh ones evicting idle cached blocks when no
// other is free, its full prompt blocks cached for those that follow; and
// what of its prompt is left to compute. The caller checked that need less
// the hits already in use fits the free blocks. s.mu is held.
func (s *Server) attach(j *job, need int) {
	hit, _ := s.hits(j)
	hit = min(hit, need)
	taken := 0
	for _, h := range j.hashes[:hit] {
		b := s.cache[h]
		if b.refs == 0 {
			s.idle.Remove(b.idle)
			b.idle = nil
			taken++
		}
		b.refs++
	}
	s.setUsed(s.clock.now(), s.used+taken)
	cached := hit
	for _, h := range j.hashes[hit:min(len(j.hashes), need)] {
		if b, ok := s.cache[h]; ok {
			if b.refs > 0 {
				break // a hash collision: the rest stays j's own
			}
			// Cached behind a prefix evicted since: the copy j computes
			// stands for it, and its block is free again.
			s.idle.Remove(b.idle)
		}
		s.cache[h] = &cachedBlock{refs: 1}
		cached++
	}
	s.grow(need - hit)
	j.blocks, j.shared = need, cached
	if j.length > 0 {
		s.stats.PrefixQueryTokens += int64(j.prompt)
		s.stats.PrefixHitTokens += int64(hit * s.cfg.BlockSize)
	}
	j.prefill = max(1, j.prompt-hit*s.cfg.BlockSize)
}

// release frees j's blocks: its own ones, and its hold on the cached ones,
// which stay cached, idle, when no one else holds them. s.mu is held.
func (s *Server) release(j *job) {
	used := s.used - (j.blocks - j.shared)
	// The last block freed is the first evicted, as vLLM frees a
	// sequence's blocks tail first: its leading blocks, which others
	// are likelier to share, stay longest.
	for i := j.shared - 1; i >= 0; i-- {
		b := s.cache[j.hashes[i]]
		if b.refs--; b.refs == 0 {
			b.idle = s.idle.PushBack(j.hashes[i])
			used--
		}
	}
	s.setUsed(s.clock.now(), used)
	j.blocks, j.shared = 0, 0
}
