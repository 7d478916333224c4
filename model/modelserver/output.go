package modelserver

import (
	"math"
	"sync"
)

// What a generation holds of a vLLM server's KV cache. vLLM allocates a
// sequence's blocks as it goes: its prompt at the first step, then a block
// whenever its output crosses a block boundary, all freed when it ends. A
// sequence generating L tokens at one a step therefore holds, averaged
// over its life, its prompt and L/2 of output. Over the sequences in
// flight at any moment, longer ones are there longer, so the KV they hold
// in all is, on average (Little's law), as many times prompt plus
// E[L²] / 2E[L] as there are sequences, plus half a block each for the
// last block's unused part. Charging each request that much, rather than
// prompt + max_tokens (what TGI reserves up front, and what a request
// could at most take), makes the charges of the requests in flight add up
// to what the server actually holds for them, which is what lets admission
// fill the pool: reserving max_tokens for requests that end well short of
// it leaves most of the pool idle (bench/modelserver.md, section 2). A
// high quantile of L does not do it either: it charges each request its
// peak, which the requests in flight never reach together.
//
// Short of outputSamples answers of a kind, there is nothing to go on, and
// a request is charged its max_tokens. The learned charge is never above
// max_tokens (min(L, max_tokens) is what a request so capped generates),
// and it is the average in flight, not a bound: what keeps the sum of the
// charges honest when the pool is shared, or the lengths change, is the
// server's live usage (Device), which admission follows too.
const (
	outputWindow  = 512 // the last answers' lengths kept, per kind
	outputSamples = 8   // answers seen before the lengths are trusted
)

// outputs learns the lengths of generated answers per kind of request.
type outputs struct {
	mu    sync.Mutex
	kinds map[string]*lengths
}

// lengths is a ring of the output tokens of one sequence of past answers.
type lengths struct {
	l    []int64
	next int
}

func newOutputs() *outputs { return &outputs{kinds: map[string]*lengths{}} }

// observe learns from an answer of kind whose usage.completion_tokens was
// completion over seqs sequences (n choices, several prompts).
func (o *outputs) observe(kind string, completion, seqs int64) {
	if completion <= 0 || seqs <= 0 {
		return
	}
	per := (completion + seqs - 1) / seqs
	o.mu.Lock()
	defer o.mu.Unlock()
	k := o.kinds[kind]
	if k == nil {
		k = &lengths{}
		o.kinds[kind] = k
	}
	if len(k.l) < outputWindow {
		k.l = append(k.l, per)
		return
	}
	k.l[k.next] = per
	k.next = (k.next + 1) % outputWindow
}

// held is the output tokens one sequence of kind holds on average while in
// flight, its answer capped at maxOut tokens: Σ min(L, maxOut)² / 2 Σ
// min(L, maxOut) over the answers seen. ok is false short of
// outputSamples answers.
func (o *outputs) held(kind string, maxOut int64) (tokens float64, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := o.kinds[kind]
	if k == nil || len(k.l) < outputSamples || maxOut <= 0 {
		return 0, false
	}
	var sum, sq float64
	for _, l := range k.l {
		c := float64(min(l, maxOut))
		sum += c
		sq += c * c
	}
	return sq / (2 * sum), true
}

// kvTokens is the KV charge of r in tokens: its prompt, plus for each
// sequence what it holds on average of output and half a block, once the
// server's cache is followed and answers of r's kind have been seen;
// otherwise, and never more than, prompt + max_tokens × sequences.
func (m *Model) kvTokens(r *request) int64 {
	prompt := m.counter.tokens(r.kind(), r.prompt)
	worst := prompt + r.maxOut*r.choices
	if r.ep == embeddings || !m.dev.live {
		return worst
	}
	h, ok := m.outputs.held(r.kind(), r.maxOut)
	if !ok {
		return worst
	}
	perSeq := min(float64(r.maxOut), h+float64(m.dev.blockSize())/2)
	return min(worst, prompt+int64(math.Ceil(perSeq*float64(r.choices))))
}
