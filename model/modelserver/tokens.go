package modelserver

import (
	"math"
	"sync"

	"github.com/vramq/vramq/model/wordpiece"
)

// Token counts. Admission, the rate limits and the KV budget all need a
// request's prompt tokens before it is sent, and only a tokenizer the
// project runs counts them exactly: BERT's WordPiece (model/bert), which
// the embedding models behind TEI use. Everything else is bounded from the
// bytes. The bound assumes a byte-level tokenizer (GPT-2's and tiktoken's
// BPE, Llama 3's, SentencePiece with byte fallback): every token of a text
// covers at least one byte of its UTF-8, so a text has at most as many
// tokens as bytes. What a chat template adds around the messages is
// covered by counting the messages' JSON (role, braces, quotes) rather
// than their text, plus templateTokens for a preamble. Images and audio
// in a message are not bounded: their tokens depend on the model.
//
// A bound four times the truth (English BPE runs about four bytes a token)
// would cut the rate and the KV budget to a quarter, so the bound is
// tightened by what the server's answers say: usage.prompt_tokens over the
// bound is a ratio, and once ratioSamples answers are in, estimates are the
// bound times the highest ratio seen, plus ratioMargin. The ratio never
// goes below the highest seen and never above 1 (the bound itself), as the
// subscriber's estimate correction never lowers an estimate below what a
// batch showed it needs.
const (
	templateTokens = 64   // a chat template's preamble and the assistant's priming
	sequenceTokens = 4    // BOS/EOS, [CLS]/[SEP] around a prompt or an input
	ratioSamples   = 8    // answers seen before the ratio is trusted
	ratioMargin    = 1.25 // over the highest ratio seen
)

// estimate is a prompt's tokens: exact ones (token arrays, WordPiece
// counts) and a bound from bytes, which the learned ratio scales.
type estimate struct {
	exact int64
	bound int64
}

func (e estimate) add(o estimate) estimate { return estimate{e.exact + o.exact, e.bound + o.bound} }

// counter turns estimates into tokens, and learns the ratio of each kind
// of request (an endpoint and a model, since each has its tokenizer).
type counter struct {
	wp *wordpiece.Tokenizer // nil: embedding inputs are bounded too

	mu     sync.Mutex
	ratios map[string]*ratio
}

type ratio struct {
	highest float64 // the highest usage / bound seen
	samples int
	value   float64 // what estimates use: 1 until ratioSamples are in
}

func newCounter(wp *wordpiece.Tokenizer) *counter {
	return &counter{wp: wp, ratios: map[string]*ratio{}}
}

// tokens is e in tokens for requests of kind.
func (c *counter) tokens(kind string, e estimate) int64 {
	if e.bound == 0 {
		return e.exact
	}
	c.mu.Lock()
	v := 1.0
	if r := c.ratios[kind]; r != nil {
		v = r.value
	}
	c.mu.Unlock()
	return e.exact + int64(math.Ceil(float64(e.bound)*v))
}

// likely is e in tokens for requests of kind, scaled by the highest ratio
// seen without the margin: what the prompts seen so far would have been
// charged at most, a closer count than tokens' bound for what a prompt
// holds of a KV cache, which the cache's live usage checks (KV).
func (c *counter) likely(kind string, e estimate) int64 {
	if e.bound == 0 {
		return e.exact
	}
	c.mu.Lock()
	v := 1.0
	if r := c.ratios[kind]; r != nil && r.samples >= ratioSamples {
		v = r.highest
	}
	c.mu.Unlock()
	return e.exact + int64(math.Ceil(float64(e.bound)*min(1, v)))
}

// observe learns from an answer's usage.prompt_tokens for a request of
// kind estimated at e.
func (c *counter) observe(kind string, e estimate, promptTokens int64) {
	if e.bound <= 0 || promptTokens <= 0 {
		return
	}
	seen := float64(promptTokens-e.exact) / float64(e.bound)
	if seen <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.ratios[kind]
	if r == nil {
		r = &ratio{value: 1}
		c.ratios[kind] = r
	}
	r.samples++
	r.highest = math.Max(r.highest, seen)
	if r.samples >= ratioSamples {
		r.value = math.Min(1, r.highest*ratioMargin)
	}
}

// textEstimate is one text's tokens: WordPiece's exact count (which
// includes [CLS] and [SEP]) when there is one, else its bytes.
func (c *counter) textEstimate(s string, exactOK bool) estimate {
	if exactOK && c.wp != nil {
		return estimate{exact: int64(len(c.wp.Encode(s, 0)))}
	}
	return estimate{bound: int64(len(s)) + sequenceTokens}
}
