package fakeoai

import (
	"maps"
	"slices"
	"time"
)

// Stats is a snapshot of what the server did, for assertions.
type Stats struct {
	// Requests are the POSTs to the model routes that reached the server.
	Requests int64
	// ByStatus counts the answers by HTTP status; 0 counts connections
	// dropped by a fault.
	ByStatus map[int]int64
	// RateLimited counts 429 rate_limit_exceeded answers, TooLarge those of
	// requests no bucket could ever admit, QuotaRejected the 429
	// insufficient_quota ones, Overloaded TGI's 429s, QueueFull vLLM's 503s,
	// ContextLength the answers to prompt + max_tokens past MaxModelLen.
	RateLimited, TooLarge, QuotaRejected, Overloaded, QueueFull, ContextLength int64
	// Faults counts the faults injected, by kind.
	Faults map[FaultKind]int64

	// Admitted are the requests the rate limiter let through, and
	// AdmittedTokens their estimated cost at arrival (prompt + max_tokens ×
	// n, best_of for n under LimitAzure), which LimitFixedWindow records
	// but does not charge: it counts usage.
	Admitted, AdmittedTokens int64
	// PromptTokens and CompletionTokens are the usage of the answers
	// generated (a FaultDropAfter's included).
	PromptTokens, CompletionTokens int64

	// Preemptions counts sequences preempted for want of KV blocks.
	Preemptions int64
	// PrefixQueryTokens are the prompt tokens of generations scheduled,
	// PrefixHitTokens those of them the prefix cache held (vLLM's
	// prefix_cache_queries and prefix_cache_hits, in tokens).
	PrefixQueryTokens, PrefixHitTokens int64

	// OnlineTTFTs are the times to first token of OnlineLoad's requests,
	// server time, in the order they came; OnlineRequests those answered.
	OnlineTTFTs    []time.Duration
	OnlineRequests int64
	// IdleSlotSeconds integrates the slots (MaxNumSeqs) OnlineLoad's
	// target leaves idle over server time, OtherSlotSeconds the sequences
	// of the requests sent over HTTP running meanwhile: their ratio is the
	// share of what online left idle that the others used.
	IdleSlotSeconds, OtherSlotSeconds float64
	// Running and Waiting are sequences now; KVBlocksUsed the blocks they
	// hold of NumGPUBlocks; MaxRunning and MaxKVBlocksUsed the high-water
	// marks.
	Running, Waiting, KVBlocksUsed, NumGPUBlocks int
	MaxRunning, MaxKVBlocksUsed                  int

	// Minutes is the ledger, one entry per server minute since New, the
	// last one still running.
	Minutes []Minute
	// Seconds is the same ledger's tokens by server second, for the most
	// any 60 s held (a limit over a minute says nothing of the minutes
	// that straddle two of the ledger's).
	Seconds []Second
}

// Second is one server second of the ledger's tokens.
type Second struct {
	// Tokens is what the rate limiter admitted (Minute.Tokens), Used the
	// usage of the answers generated (PromptTokens + CompletionTokens),
	// what a fixed window counts.
	Tokens, Used int64
}

// Minute is one server minute of the ledger.
type Minute struct {
	Start time.Time // server time
	// Requests and Tokens are what the rate limiter admitted and their
	// estimated cost (as AdmittedTokens), the figures OpenAI's limits are
	// about; a fixed window's are about PromptTokens + CompletionTokens.
	Requests, Tokens int64
	// PromptTokens and CompletionTokens are the usage of the answers
	// generated in this minute.
	PromptTokens, CompletionTokens int64
	// RateLimited counts the 429 rate_limit_exceeded answers, Answers every
	// answer (and dropped connection) of the model routes.
	RateLimited, Answers int64
	// KVUsage is the time-weighted mean of the fraction of KV blocks in
	// use over the minute (over its elapsed part for the last one).
	KVUsage float64
}

// minuteAcc is a Minute as it is being counted.
type minuteAcc struct {
	Minute
	kvBlockNanos float64
}

// minute returns the ledger entry of server time t, adding entries up to
// it. s.mu is held.
func (s *Server) minute(t time.Time) *minuteAcc {
	i := int(t.Sub(s.clock.start) / time.Minute)
	for len(s.minutes) <= i {
		s.minutes = append(s.minutes, &minuteAcc{Minute: Minute{Start: s.clock.start.Add(time.Duration(len(s.minutes)) * time.Minute)}})
	}
	return s.minutes[max(i, 0)]
}

// second returns the ledger's entry of server time t. s.mu is held.
func (s *Server) second(t time.Time) *Second {
	i := max(0, int(t.Sub(s.clock.start)/time.Second))
	for len(s.seconds) <= i {
		s.seconds = append(s.seconds, Second{})
	}
	return &s.seconds[i]
}

// Stats returns a snapshot of the counters and the ledger.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.now()
	s.kvIntegrate(now)
	s.minute(now)
	st := s.stats
	st.ByStatus = maps.Clone(s.stats.ByStatus)
	st.Faults = maps.Clone(s.stats.Faults)
	st.OnlineTTFTs = slices.Clone(s.stats.OnlineTTFTs)
	st.Running, st.Waiting, st.KVBlocksUsed, st.NumGPUBlocks = len(s.running), len(s.waiting), s.used, s.cfg.NumGPUBlocks
	st.Seconds = slices.Clone(s.seconds)
	st.Minutes = make([]Minute, len(s.minutes))
	for i, m := range s.minutes {
		st.Minutes[i] = m.Minute
		span := time.Minute
		if end := m.Start.Add(time.Minute); end.After(now) {
			span = now.Sub(m.Start)
		}
		if span > 0 {
			st.Minutes[i].KVUsage = m.kvBlockNanos / (float64(span) * float64(s.cfg.NumGPUBlocks))
		}
	}
	return st
}
