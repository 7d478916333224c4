package fakeoai

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Config says what the server serves and how it behaves. The zero value
// serves "fake-model" with no auth, no rate limits, vLLM's default capacity
// and a KV pool large enough never to preempt. Every duration is server time
// (see Speed).
type Config struct {
	// Models are the model ids served on every route; a request for another
	// is answered 404 model_not_found. Default {"fake-model"}.
	Models []string
	// APIKey, when set, must come as "Authorization: Bearer APIKey" on /v1/
	// (401 invalid_api_key otherwise), as vLLM's --api-key asks.
	APIKey string
	// Seed seeds the generator that draws faults.
	Seed uint64

	// Speed is how many server seconds pass in one real second: 60 runs a
	// server minute in a real second. 0 means 1.
	Speed float64
	// TokenLatency is one scheduler step: every running sequence generates
	// one token per step (a prefill is one step too). 0 makes generation
	// instant; the scheduler and its KV pool still run.
	TokenLatency time.Duration

	// MaxModelLen bounds prompt + max_tokens of a sequence (and an embedding
	// input): past it the answer is ContextLengthStatus. Default 8192.
	MaxModelLen int
	// ContextLengthStatus is 422, TGI's validation answer (the default), or
	// 400, OpenAI's and vLLM's (code context_length_exceeded).
	ContextLengthStatus int
	// OutputTokens gives the natural length of a choice; nil means
	// DefaultOutputTokens.
	OutputTokens func(prompt string, choice int) int

	// EmbedDim is the embedding dimension when a request names none.
	// Default 16.
	EmbedDim int
	// PayloadLimit bounds a request body in bytes: past it the answer is
	// TEI's 413 (axum's body limit; TEI's default is 2,000,000). 0 = none.
	PayloadLimit int64
	// MaxClientBatch bounds the inputs of one embeddings request (TEI's
	// max_client_batch_size, 32 by default there): past it, 413. 0 = none.
	MaxClientBatch int

	// Limits are the OpenAI rate limits; zero values enforce nothing.
	Limits RateLimits

	// MaxNumSeqs is vLLM's max_num_seqs: sequences running at once; the
	// others wait. Default 256.
	MaxNumSeqs int
	// MaxQueuedRequests is vLLM's --max-num-queued-reqs: sequences waiting
	// or running; a request that would pass it is answered 503 with no
	// retry hint. 0 = unbounded, vLLM's default.
	MaxQueuedRequests int
	// MaxConcurrentRequests is TGI's and TEI's max_concurrent_requests:
	// requests in flight; past it, 429 "Model is overloaded". 0 = off.
	// Like MaxQueuedRequests it is checked after the rate limits, so a
	// request it refuses was charged: configure the front door (Limits) or
	// a server's own limits, as a test needs, to keep the ledger plain.
	MaxConcurrentRequests int
	// BlockSize is the tokens of one KV block. Default 16, vLLM's.
	BlockSize int
	// NumGPUBlocks is the KV pool. Default ceil(MaxModelLen/BlockSize) ×
	// MaxNumSeqs, which never preempts. It must hold one sequence of
	// MaxModelLen, as vLLM refuses to start otherwise.
	NumGPUBlocks int
	// PrefixCaching is vLLM's --enable-prefix-caching: a prompt's leading
	// blocks already cached are not computed again (prefixcache.go).
	PrefixCaching bool
	// MaxNumBatchedTokens is vLLM's max_num_batched_tokens with chunked
	// prefill: the tokens one step computes, a generated token counting
	// one and a prompt its uncached tokens, so a long prompt takes steps
	// of its own. 0 computes any prompt in one step.
	MaxNumBatchedTokens int
	// PriorityScheduling is vLLM's --scheduling-policy priority: the
	// waiting queue is ordered by each request's "priority" (lower first,
	// then by arrival); a running sequence is never preempted for a
	// waiting one, as vLLM's V1 engine does not.
	PriorityScheduling bool
	// StepTokenCost is what each token a step computes adds to its
	// TokenLatency: the more a step holds, the longer it takes.
	StepTokenCost time.Duration
	// NoMetrics serves no vLLM metrics (GET /metrics is 404), as a server
	// whose fullness nothing tells: TGI's and TEI's metrics have none of
	// vLLM's names, and Ollama and OpenAI serve none.
	NoMetrics bool

	// Faults are injected from the start; SetFaults replaces them.
	Faults []Fault
}

// RateLimits are the requests and tokens per minute, counted as Kind says.
// A request takes one request and, at arrival, prompt + max_tokens × n
// tokens (prompt tokens for embeddings; Azure counts best_of for n; the
// fixed window counts usage when answered instead).
type RateLimits struct {
	// Kind is the limiter: LimitBucket (OpenAI's, the default),
	// LimitAnthropic, LimitSlidingWindow, LimitFixedWindow (LiteLLM's) or
	// LimitAzure.
	Kind     LimitKind
	RPM, TPM int // 0 = no limit, and no headers for it
	// Burst sets the buckets' capacity to limit × Burst / 1m, for limits
	// enforced over shorter periods than a minute. 0 = one minute. Bucket
	// kinds only.
	Burst time.Duration
	// Window is LimitAzure's short window for requests, each admitting
	// RPM × Window / 1m (at least 1): 1 s or 10 s by Azure's docs. It must
	// divide a minute. 0 = 1 s.
	Window time.Duration
	// FreeRejections stops a 429 from taking a request from the RPM limit,
	// which it does by default: "unsuccessful requests contribute to your
	// per-minute limit".
	FreeRejections bool
}

func (r RateLimits) window() time.Duration {
	if r.Window == 0 {
		return time.Second
	}
	return r.Window
}

// validate reports what is wrong with r.
func (r RateLimits) validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("fakeoai: rate limits: "+format, a...)) }
	if !r.Kind.valid() {
		bad("kind %q: want bucket, anthropic, sliding-window, fixed-window or azure", r.Kind)
	}
	if r.RPM < 0 || r.TPM < 0 {
		bad("RPM %d, TPM %d: want 0 or more", r.RPM, r.TPM)
	}
	if r.Burst < 0 {
		bad("burst %v: want 0 or more", r.Burst)
	}
	if r.Burst != 0 && r.Kind != "" && r.Kind != LimitBucket && r.Kind != LimitAnthropic {
		bad("burst %v: only a bucket has one, not %s", r.Burst, r.Kind)
	}
	if r.Window < 0 || (r.Window > 0 && time.Minute%r.Window != 0) {
		bad("window %v: want a divisor of a minute", r.Window)
	}
	if r.Window != 0 && r.Kind != LimitAzure {
		bad("window %v: only azure has one, not %q", r.Window, r.Kind)
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if len(c.Models) == 0 {
		c.Models = []string{"fake-model"}
	}
	if c.Speed == 0 {
		c.Speed = 1
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = 8192
	}
	if c.ContextLengthStatus == 0 {
		c.ContextLengthStatus = http.StatusUnprocessableEntity
	}
	if c.OutputTokens == nil {
		c.OutputTokens = DefaultOutputTokens
	}
	if c.EmbedDim == 0 {
		c.EmbedDim = 16
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = 256
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = blocksFor(c.MaxModelLen, c.BlockSize) * c.MaxNumSeqs
	}
	return c
}

// Validate reports what is wrong with c once its defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("fakeoai: "+format, a...)) }
	if !(c.Speed > 0) {
		bad("speed %v: want positive", c.Speed)
	}
	if c.TokenLatency < 0 || c.StepTokenCost < 0 {
		bad("token latency %v, step token cost %v: want 0 or more", c.TokenLatency, c.StepTokenCost)
	}
	if err := c.Limits.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.ContextLengthStatus != http.StatusUnprocessableEntity && c.ContextLengthStatus != http.StatusBadRequest {
		bad("context length status %d: want 422 or 400", c.ContextLengthStatus)
	}
	for name, v := range map[string]int{"max model len": c.MaxModelLen, "embed dim": c.EmbedDim,
		"max num seqs": c.MaxNumSeqs, "block size": c.BlockSize, "gpu blocks": c.NumGPUBlocks} {
		if v <= 0 {
			bad("%s %d: want positive", name, v)
		}
	}
	for name, v := range map[string]int{"max client batch": c.MaxClientBatch,
		"max queued requests": c.MaxQueuedRequests, "max concurrent requests": c.MaxConcurrentRequests,
		"max num batched tokens": c.MaxNumBatchedTokens} {
		if v < 0 {
			bad("%s %d: want 0 or more", name, v)
		}
	}
	if c.PayloadLimit < 0 {
		bad("payload limit %d: want 0 or more", c.PayloadLimit)
	}
	if c.BlockSize > 0 && c.NumGPUBlocks*c.BlockSize < c.MaxModelLen {
		bad("%d blocks of %d tokens hold less than max model len %d", c.NumGPUBlocks, c.BlockSize, c.MaxModelLen)
	}
	for _, f := range c.Faults {
		if err := f.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func blocksFor(tokens, blockSize int) int { return (tokens + blockSize - 1) / blockSize }
