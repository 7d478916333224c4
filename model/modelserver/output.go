package modelserver

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
)

// What a generation holds of a vLLM server's KV cache. vLLM allocates a
// sequence's blocks as it goes: its prompt at the first step, then a block
// whenever its output crosses a block boundary, all freed when it ends. A
// sequence generating L tokens at one a step holds, at an instant of its
// life taken at random, its prompt and g ~ uniform(0, L) tokens of output.
// Longer sequences are in flight longer, so over the sequences in flight
// at any moment (Little's law) g has the mean E[L²] / 2E[L] and the second
// moment E[L³] / 3E[L], from the lengths of past answers (usage), and the
// last block's unused part adds half a block on average.
//
// A request is charged its prompt and that mean per sequence, plus its
// share of the headroom the pool needs for the spread: N requests alike in
// flight hold N means with a standard deviation of √N σ, so kvSpread
// standard deviations of headroom is kvSpread × σ × √(m / C) for each,
// where m is the request's mean charge and C the pool (N = C / m at full),
// times √(1 + N/n) for the error of a mean learned from n answers, which
// the N requests share (kvTokens).
// Charges that add up to the pool then put what the requests hold, on
// average, kvSpread standard deviations below the pool's end, whatever the
// spread of lengths: the pool is filled the more the narrower the lengths
// and the more requests it holds. Reserving prompt + max_tokens (what TGI reserves up
// front, and what a request could at most take) for requests that end well
// short of it leaves most of the pool idle (bench/modelserver.md, section
// 2); a high quantile of L charges each request its peak, which the
// requests in flight never reach together.
//
// The first answers of a run are its shortest: the long ones sent with
// them are still generating. Lengths are therefore learned by cohort: an
// answer counts once every request of its kind sent before it has been
// answered too (or failed), so that what is learned is the lengths of all
// the requests sent over a time, long ones included. Short of outputSamples
// such answers of a kind there is nothing to go on, and a request is
// charged its prompt + max_tokens × sequences. The charge is never above prompt +
// max_tokens (min(L, max_tokens) is what a request so capped generates) and
// never below the prompt. It is an average, not a bound: what keeps it
// honest when the lengths change, or the pool is shared, is the server's
// live usage and preemptions, which admission follows too (KV).
const (
	outputWindow  = 512 // the last answers' lengths kept, per kind
	outputSamples = 8   // answers seen before the lengths are trusted
	outputPending = 4 * outputWindow
	kvSpread      = 3.5 // standard deviations of headroom
)

// outputs learns the lengths of generated answers per kind of request.
type outputs struct {
	mu    sync.Mutex
	kinds map[string]*lengths
}

// lengths is a kind's answers: the requests in flight by their number, in
// the order sent; the answers not yet counted, waiting for an earlier
// request; and a ring of the output tokens of one sequence of the answers
// counted.
type lengths struct {
	sent     int64
	oldest   int64 // the oldest request in flight; sent + 1 when none
	inflight map[int64]bool
	pending  map[int64]int64
	l        []int64
	next     int
}

func newOutputs() *outputs { return &outputs{kinds: map[string]*lengths{}} }

func (o *outputs) kind(kind string) *lengths {
	k := o.kinds[kind]
	if k == nil {
		k = &lengths{inflight: map[int64]bool{}, pending: map[int64]int64{}}
		o.kinds[kind] = k
	}
	return k
}

// start numbers a request of kind being sent; done ends it.
func (o *outputs) start(kind string) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := o.kind(kind)
	k.sent++
	if len(k.inflight) == 0 {
		k.oldest = k.sent
	}
	k.inflight[k.sent] = true
	return k.sent
}

// done ends request seq of kind: answered with usage.completion_tokens of
// completion over seqs sequences (n choices, several prompts), or, with
// seqs 0, not answered (its length is not known, and no reason to wait).
// The answers pending are counted when the oldest request in flight ends,
// or, should it stay in flight while outputPending answers wait for it,
// without it.
func (o *outputs) done(kind string, seq, completion, seqs int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := o.kind(kind)
	delete(k.inflight, seq)
	if seqs > 0 && completion >= 0 {
		k.pending[seq] = (completion + seqs - 1) / seqs
	}
	if seq != k.oldest && len(k.pending) <= outputPending {
		return
	}
	if len(k.pending) > outputPending {
		delete(k.inflight, k.oldest)
	}
	k.oldest = k.sent + 1
	for s := range k.inflight {
		k.oldest = min(k.oldest, s)
	}
	for s, l := range k.pending {
		if s < k.oldest {
			k.add(l)
			delete(k.pending, s)
		}
	}
}

// A request's answers are learned twice: among all of its kind, and among
// those of its prompt-length cohort (cohort), whose lengths are the ones
// charged once outputSamples of them are in, since how long a model answers
// often follows how long it was asked (a summary of a long document, a
// short reply to a short turn); the kind's serve a cohort not seen yet.
type outputSeq struct {
	kind, cohort string
	k, c         int64
}

// begin numbers a request of kind in cohort being sent; end ends it, as
// done.
func (o *outputs) begin(kind, cohort string) outputSeq {
	return outputSeq{kind: kind, cohort: cohort, k: o.start(kind), c: o.start(cohort)}
}

func (o *outputs) end(s outputSeq, completion, seqs int64) {
	o.done(s.kind, s.k, completion, seqs)
	o.done(s.cohort, s.c, completion, seqs)
}

// cohort is r's kind and its prompt length's power of two: prompts within
// a factor of two of each other share their answers' lengths. The length
// is the prompt's estimate unscaled (its exact tokens and its bound from
// bytes), which, unlike the learned count, a prompt keeps from its send to
// its answer.
func cohort(r *request) string {
	return fmt.Sprintf("%s prompt~2^%d", r.kind(), bits.Len64(uint64(max(0, r.prompt.exact+r.prompt.bound))))
}

func (k *lengths) add(l int64) {
	if len(k.l) < outputWindow {
		k.l = append(k.l, l)
		return
	}
	k.l[k.next] = l
	k.next = (k.next + 1) % outputWindow
}

// held is the output tokens one sequence of kind holds while in flight,
// its answer capped at maxOut tokens: their mean and variance over the n
// answers seen. ok is false short of outputSamples answers.
func (o *outputs) held(kind string, maxOut int64) (mean, variance float64, n int, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := o.kinds[kind]
	if k == nil || len(k.l) < outputSamples || maxOut <= 0 {
		return 0, 0, 0, false
	}
	n = len(k.l)
	var s1, s2, s3 float64
	for _, l := range k.l {
		c := float64(min(l, maxOut))
		s1 += c
		s2 += c * c
		s3 += c * c * c
	}
	if s1 == 0 {
		return 0, 0, n, true // answers of no output: the prompt is all they hold
	}
	mean = s2 / (2 * s1)
	return mean, max(0, s3/(3*s1)-mean*mean), n, true
}

// kvTokens is the KV charge of r in tokens: its prompt and, once the
// server's cache is followed and answers of r's kind have been seen, its
// sequences' mean output held, half a block each, and its share of the
// headroom; otherwise, and never more than, prompt + max_tokens ×
// sequences.
func (m *Model) kvTokens(r *request) int64 {
	worst := m.counter.tokens(r.kind(), r.prompt) + r.maxOut*r.choices
	if r.ep == embeddings || !m.dev.live {
		return worst
	}
	h, v, n, ok := m.outputs.held(cohort(r), r.maxOut)
	if !ok {
		h, v, n, ok = m.outputs.held(r.kind(), r.maxOut)
	}
	if !ok {
		return worst
	}
	prompt := m.counter.likely(r.kind(), r.prompt)
	seqs := float64(r.choices)
	mean := float64(prompt) + seqs*(h+float64(m.dev.blockSize())/2)
	pool := float64(m.dev.capacity)
	// The N = pool / mean requests in flight also share one error: the
	// mean learned from n answers is off by σ/√n for all of them at once,
	// N σ/√n together, against √N σ for their own spread: the headroom is
	// the two's, √(1 + N/n) times the spread's.
	shared := math.Sqrt(1 + pool/mean/float64(n))
	charge := mean + kvSpread*math.Sqrt(seqs*v*mean/pool)*shared
	return min(worst, int64(math.Ceil(charge)))
}
