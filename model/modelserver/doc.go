// Package modelserver runs vramq's work on a model server a team already
// runs: vLLM, TGI, TEI, Ollama, or OpenAI itself, through the
// OpenAI-compatible routes /v1/chat/completions, /v1/completions and
// /v1/embeddings, /v1/responses and /v1/moderations where the server has
// them, and Anthropic's /v1/messages (sent to the server's own, or
// translated to chat completions and back: messages.go). Open returns a
// Model, a backend.Backend that owns its KV cache (Model.Memory), so that
// the subscriber's admission, batching, halving, leases and item errors
// work on it as on a model in this process, with no device of its own.
//
// Each item carries its request's JSON body (job.Item.Body). Run checks it
// by the rule the publisher applies (job.CheckRequest) and forwards the
// canonical body the rule returns, never the bytes it received: with
// max_tokens (a response's max_output_tokens) set to Config.MaxOutputTokens
// where the body names no ceiling (16 for /v1/completions, that API's
// default). It answers with the
// server's status and body (job.Output.Response), or the item's error.
// Embedding items are sent several to a request.
//
// Three budgets hold together: the rate limits (Config.TPM, RPM, and the
// server's x-ratelimit headers: ratelimit.go), the server's concurrency
// (concurrency.go), and its KV cache, which is the backend's Memory
// (KV) and what Cost is counted in, tokens (kvcache.go). Every answer has one disposition,
// in one table (dispositions.go): wait as the server says, ask for an
// operator (fault.ErrNeedsOperator), the item's own error, retry, halve.
// Waits longer than Config.MaxWait end Run with fault.ErrBackoff; every wait
// comes from one policy (waits.go), which cuts any the server asks for to
// Config.MaxServerWait. What the server sends is untrusted: its strings
// are cut, its non-finite metrics refused, and its answers to one Run
// bounded in all by Config.ResultBytes.
//
// It speaks HTTP itself rather than through openai-go: the SDK retries on
// its own (the subscriber decides here) and cannot parse TGI's and TEI's
// error bodies (internal/testenv/fakeoai's doc names them).
package modelserver
