// Package fakeoai is a test double of an OpenAI-compatible model server: a
// provider's rate limiter in front (OpenAI's, Anthropic's, Azure OpenAI's or
// a gateway's window, RateLimits.Kind), a vLLM-style scheduler with a paged KV
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
//     vllm:cache_config_info, vllm:prefix_cache_queries and
//     vllm:prefix_cache_hits (counters, in tokens); prefixcache.go cites
//     the prefix cache's design; docs/configuration/optimization.md
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
// # Rate limiters
//
// RateLimits.Kind picks the limiter; each follows what its provider
// documents, read through the search tool:
//   - LimitBucket, OpenAI's: the rate limits guide above. The reset headers
//     are durations until the limit is whole again, and an observed reset of
//     used × window / limit shows a continuous refill.
//   - LimitAnthropic: Anthropic's rate limits page
//     (https://docs.anthropic.com/en/api/rate-limits), read as quoted by
//     third parties (https://restack.io/p/anthropic-answer-rate-limiting-rule-cat-ai
//     and others; the page itself was not in the search corpus): "the token
//     bucket algorithm", capacity continuously replenished up to the limit;
//     anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}, the
//     reset an RFC 3339 time at which the limit is whole again; retry-after
//     in seconds on a 429. The body,
//     {"type":"error","error":{"type":"rate_limit_error","message":...}}, is
//     Anthropic's error shape with a message of our own.
//   - LimitSlidingWindow: a strict sliding 60 s window, as Redis sorted-set
//     limiters in gateways keep it (requests that fall out of the last 60 s
//     free their charge, no sooner). OpenAI's headers: the reset is until the
//     newest charge leaves the window, retry-after(-ms) until enough old ones
//     have.
//   - LimitFixedWindow, LiteLLM's proxy limiter
//     (litellm/proxy/hooks/parallel_request_limiter.py, and
//     https://docs.litellm.ai/docs/proxy/response_headers): a counter per
//     calendar minute; a request passes while the minute's count is below the
//     limit (current_tpm >= tpm_limit refuses), requests counted at arrival,
//     tokens added from the answer's usage, so a minute can end past its
//     limit; a 429 carries retry-after, the seconds (with fractions) to the
//     next minute, and the message "LiteLLM Rate Limit Handler for rate
//     limit type = key. Crossed TPM, RPM Limit. current rpm: ..." in
//     LiteLLM's {"error":{message,type,param,code:"429"}}. Its docs list
//     x-ratelimit-{limit,remaining,reset}-{requests,tokens} "in the OpenAI
//     format"; the reset sent is the time to the next minute.
//   - LimitAzure, Azure OpenAI's quota page
//     (https://learn.microsoft.com/en-us/azure/ai-services/openai/how-to/quota,
//     quoted in Microsoft's Q&A answers 1336515, 1689036 and 1851574): the
//     tokens charged are "the maximum tokens estimated to be processed",
//     from the prompt, max_tokens and best_of, when the request is received,
//     against "a running token count ... which resets every minute";
//     requests are evaluated "over a small period of time, typically 1 or 10
//     seconds", so at 600 RPM and 1 s the 11th request in a second is
//     refused (RateLimits.Window). A 429 carries retry-after-ms and
//     Retry-After and {"error":{"code":"429","message":"Requests to the
//     ChatCompletions_Create Operation under Azure OpenAI API version ...
//     have exceeded token rate limit of your current OpenAI S0 pricing
//     tier. Please retry after N seconds. ..."}}; the headers are
//     x-ratelimit-remaining-{requests,tokens}: tokens of the minute, requests
//     of the short window (Microsoft Q&A 2156987: at 300 RPM the headers
//     start at 50 requests, 10 seconds' worth, and 50,000 tokens, the TPM;
//     https://clemenssiebler.com/posts/understanding-azure-openai-x-ratelimit-remaining-tokens-x-ratelimit-remaining-requests-headers/:
//     at 120 RPM, 19 requests remain after one). A client sees no limit and
//     no window length, and may see requests left and still be refused.
//
// What the kinds cannot show: Anthropic's separate input and output token
// limits (ITPM, OTPM; one TPM here, charged prompt + max_tokens, and its
// OpenAI-compatible route's exact answers); Azure's x-ratelimit-limit-*
// (Azure documents none; some report a per-second figure, not sent here),
// its undocumented sub-second enforcement and its dynamic quota; LiteLLM's
// v3 limiter (a window starting at a key's first request), its
// max_parallel_requests and its per-key, per-user and per-team limits;
// the Redis round trips and replicas of a real gateway, whose counts lag.
// Every limit is one per server, not per model or key.
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
// windows and their refill (a fixed window's minute is a minute of this
// clock, aligned to its zero), the per-token latency of generation, slow bodies,
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
//   - OpenAI's unpublished limiter: LimitBucket is one continuously refilled
//     bucket per limit for the whole server (OpenAI keeps them per model and
//     may enforce them over sub-minute windows: RateLimits.Burst approximates
//     that); the cost charged is prompt + max_tokens × n, never refunded; no
//     daily limits, no *_usage_based headers. The other kinds' limits are
//     under "Rate limiters".
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
