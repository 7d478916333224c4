// Package fakeoai is a test double of an OpenAI-compatible model server: the
// OpenAI API's rate limits in front, a vLLM-style scheduler with a paged KV
// cache behind, and the error answers of OpenAI, vLLM, TGI and TEI, with
// faults to inject. Tests and benchmarks of the subscriber's model-server
// backend run against it; it never ships.
//
// # What it serves
//
// POST /v1/chat/completions, POST /v1/completions and POST /v1/embeddings
// answer in OpenAI's wire format (ids, object, created, model, choices with
// message or text and finish_reason, usage with prompt_tokens,
// completion_tokens and total_tokens; embeddings as object "list" with
// data[].embedding and index, float or base64), GET /v1/models lists the
// configured models, GET /metrics exposes vLLM's scheduler and cache metrics.
// Sources, read through the search tool:
//   - OpenAI API reference, chat completions, completions, embeddings and
//     models: https://developers.openai.com/api/reference/go/resources/embeddings
//     and the openai-go v3.98.0 types (chatcompletion.go, completion.go,
//     embedding.go), which the tests decode our answers with.
//   - OpenAI rate limits guide, "Rate limits in headers":
//     https://platform.openai.com/docs/guides/rate-limits (x-ratelimit-limit-,
//     remaining- and reset-{requests,tokens}; resets as durations such as
//     "1s", "6m0s"); "unsuccessful requests contribute to your per-minute
//     limit" (same guide, and the cookbook's How_to_handle_rate_limits).
//     Observed headers (https://community.openai.com/t/541210) show a reset of
//     exactly used × window / limit, that is, a bucket refilled continuously,
//     which is what this double runs.
//   - OpenAI error codes: https://platform.openai.com/docs/guides/error-codes
//     (401 invalid_api_key, 404 model_not_found, 429 rate_limit_exceeded with
//     type "requests" or "tokens", 429 insufficient_quota).
//   - The openai-go SDK (internal/requestconfig/requestconfig.go): retries
//     408/409/429/5xx, reading retry-after-ms, then Retry-After.
//   - vLLM: docs/usage/metrics.md (https://docs.vllm.ai/en/stable/usage/metrics/)
//     for vllm:num_requests_running, vllm:num_requests_waiting,
//     vllm:kv_cache_usage_perc, vllm:num_preemptions_total,
//     vllm:cache_config_info; docs/configuration/optimization.md
//     (https://docs.vllm.ai/en/stable/configuration/optimization/) for
//     preemption by recomputation when KV blocks run out; the V1 scheduler
//     (vllm/v1/core/sched/scheduler.py) for its order: running requests first,
//     the last scheduled one preempted and put back at the head of the
//     waiting queue, no new request scheduled in a step that preempted;
//     --max-num-queued-reqs (waiting plus running, n counted as n) answered
//     with 503 and no retry hint.
//   - TGI: router/src/infer/mod.rs and router/src/server.rs
//     (huggingface/text-generation-inference): 429 {"error":"Model is
//     overloaded","error_type":"overloaded"} past max_concurrent_requests,
//     422 "Input validation error: `inputs` tokens + `max_new_tokens` must
//     be <= N. ..." with error_type "validation", 424 for errors during
//     generation (error_type "generation").
//   - TEI: router/src/http/server.rs (huggingface/text-embeddings-inference):
//     DefaultBodyLimit::max(payload_limit), so a body past it is axum's plain
//     413; "batch size N > maximum allowed batch size M" as a 413 validation
//     error; 429 "Model is overloaded".
//
// # Tokens and outputs
//
// CountTokens counts one token per whitespace-separated word. A chat prompt
// costs what OpenAI's cookbook (How_to_count_tokens_with_tiktoken) counts: 3
// per message, plus its role, content and name (name + 1), plus 3 priming the
// reply (ChatPromptTokens). A completion choice's natural length is
// DefaultOutputTokens(prompt, choice) (or Config.OutputTokens): a
// "[[len=N]]" anywhere in the prompt makes it N, otherwise a hash of the
// prompt and the choice puts it between 8 and 64; the answer has
// min(max_tokens, natural) tokens, finish_reason "length" when cut, "stop"
// otherwise. Without max_tokens (or max_completion_tokens) a chat answer may
// use the rest of the context, a completion 16 tokens (OpenAI's and vLLM's
// default). An embedding is Embed(text, dim): a unit vector drawn from a hash
// of the text.
//
// # Time
//
// The server keeps its own clock, Speed times as fast as the real one (or as
// synctest's). Every duration in Config and Fault is server time: rate
// windows and their refill, the per-token latency of generation, slow bodies,
// the per-minute ledger. Durations the server sends (x-ratelimit-reset-*,
// Retry-After, retry-after-ms) are converted to real time, so a client that
// waits what it is told waits the right time; limits stay per server minute,
// so at Speed S a client that paces itself from its own configured rate must
// configure S × the limit per real minute.
//
// # What it cannot show
//
//   - Real tokenizers: counts are words, so a client's byte-based bound is
//     looser here than on a BPE vocabulary, and exact counts here say nothing
//     of a real tokenizer's.
//   - OpenAI's unpublished limiter: limits are one continuously refilled
//     bucket per kind for the whole server (OpenAI keeps them per model and
//     may enforce them over sub-minute windows: RateLimits.Burst approximates
//     that); the cost charged is prompt + max_tokens × n, never refunded; no
//     daily limits, no *_usage_based headers.
//   - vLLM's real scheduler: prefill is one step whatever the prompt's length,
//     there is no chunked prefill, prefix caching, max_num_batched_tokens or
//     swap; each choice of n and each embedding input is its own sequence;
//     embeddings take one step and a sequence slot but no KV blocks.
//   - Exact bodies of every server: vLLM's 503, Dynamo's 529 and the injected
//     5xx answers are OpenAI-shaped with messages of our own; only the TGI and
//     TEI bodies named above follow their source.
//   - Streaming (stream: true is refused with a 400), tools, logprobs,
//     the Responses and Batch APIs.
//
// # A broken or hostile server
//
// What no server it follows does, a test may still ask for, to show the
// client survives it: FaultHeader sets headers over an answer (a Retry-After
// of years, an x-ratelimit-limit-tokens of 1 on a request it admitted),
// Fault.ErrType and ErrCode an error object's fields (megabytes of them),
// SetKVUsage a non-finite vllm:kv_cache_usage_perc. Its request decoding is
// encoding/json's, which matches keys without regard to case, as Ollama's
// gin binding does: "MAX_TOKENS" reaches it as max_tokens.
package fakeoai
