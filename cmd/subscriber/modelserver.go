package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/model/modelserver"
)

// modelServerOptions are the -model-server flags: with -model-server set,
// the subscriber sends the items' requests to that server (package
// model/modelserver) instead of running a model of its own.
type modelServerOptions struct {
	url, models                   string
	apiKeyEnv, apiKeyFile         string
	timeout, connect, maxWait     time.Duration
	concurrency, tpm, rpm         int
	retries                       int
	kvCacheTokens, tokensInFlight int64
	// The budget's reserve, cap and batch size in KV tokens (kvFlags).
	kvReserve, kvLimit, maxBatchKV int64
	// deprecated are the flags given that this release accepts and
	// ignores (deprecatedFlags); openModelServer warns of each.
	deprecated                   []string
	tokenizer                    string
	maxOutputTokens, maxN        int
	embedBatch, embedBatchTokens int
	maxServerWait                time.Duration
	allowRemoteURLs              bool
	online                       modelserver.Online
	messages                     string
}

const defaultAPIKeyEnv = "VRAMQ_MODEL_SERVER_API_KEY"

// deprecatedFlags sized the KV cache in bytes, a byte count per token
// given or read from the model's config.json. The cache is counted in
// tokens now (model/modelserver's KV), which need neither; the flags stay
// accepted, with a warning, for one release, so that a deployment that
// sets them still starts.
var deprecatedFlags = []string{"model-server-kv-bytes-per-token", "model-server-config", "model-server-kv-bytes-per-value"}

// With a model server the budget is its KV cache in tokens. The admission
// flags in a GPU's bytes set the same subscriber.Config fields, but a byte
// count read as tokens (-vram-reserve 1GiB a billion tokens) is no one's
// intent, and no bytes per token are known to convert it: each is refused
// there, naming its KV flag (checkModelServer).
const (
	flagKVReserve  = "model-server-kv-reserve-tokens"
	flagKVLimit    = "model-server-kv-limit-tokens"
	flagMaxBatchKV = "model-server-max-batch-kv-tokens"
)

func addModelServerFlags(fs *flag.FlagSet, o *modelServerOptions) {
	fs.StringVar(&o.url, "model-server", "",
		"root URL of an OpenAI-compatible model server (vLLM, TGI, TEI, Ollama, https://api.openai.com): items carry request bodies\n"+
			"for /v1/chat/completions, /v1/completions or /v1/embeddings, and results the server's answers (docs/api.md);\n"+
			"admission counts tokens in the server's KV cache (from its vLLM metrics) or -model-server-tokens-in-flight;\n"+
			"-vram-reserve, -vram-limit and -max-batch-bytes (a GPU's bytes) are then refused: their -model-server-kv-reserve-tokens,\n"+
			"-model-server-kv-limit-tokens and -model-server-max-batch-kv-tokens count tokens;\n"+
			"empty: the in-process model")
	fs.StringVar(&o.models, "model-server-models", "",
		"comma-separated model names a request may name (required with -model-server; checked against GET /v1/models at start)")
	fs.StringVar(&o.apiKeyEnv, "model-server-api-key-env", defaultAPIKeyEnv,
		"environment variable that holds the server's API key, sent as a bearer token and never logged (unset or empty: no key)")
	fs.StringVar(&o.apiKeyFile, "model-server-api-key-file", "",
		"file that holds the API key instead (a mounted secret)")
	fs.DurationVar(&o.timeout, "model-server-timeout", modelserver.DefaultRequestTimeout,
		"longest one request may take, its answer's body read included")
	fs.DurationVar(&o.connect, "model-server-connect-timeout", modelserver.DefaultConnectTimeout, "longest a connection may take to open")
	fs.IntVar(&o.retries, "model-server-retries", modelserver.DefaultMaxRetries,
		"times a request is sent again after a transient failure (5xx, 424, a dropped connection, a timeout) before its batch is\n"+
			"released; one that timed out on every try fails its item instead, request_timeout")
	fs.DurationVar(&o.maxWait, "model-server-max-wait", modelserver.DefaultMaxWait,
		"longest a batch waits for the server (a rate limit's refill, an overload) before it is handed back; below -inference-timeout")
	fs.DurationVar(&o.maxServerWait, "model-server-max-server-wait", modelserver.DefaultMaxServerWait,
		"ceiling on any wait the server asks for (Retry-After, retry-after-ms, x-ratelimit-reset-*): a longer one is cut to it,\n"+
			"counted in vramq_subscriber_model_server_waits_capped_total and logged")
	fs.BoolVar(&o.allowRemoteURLs, "model-server-allow-remote-urls", false,
		"let chat content parts name remote URLs (image_url, audio_url, video_url), which a multimodal server fetches;\n"+
			"off, only data: URLs pass and an item naming another is refused (invalid_input) without a request (docs/security.md)")
	fs.StringVar(&o.messages, "model-server-messages", modelserver.MessagesChat,
		"how an Anthropic Messages request (a Message Batch's) reaches the server: chat translates it to /v1/chat/completions\n"+
			"and back (every server; fields it cannot carry are refused, docs/api.md); native sends it to the server's /v1/messages\n"+
			"(vLLM, SGLang, llama.cpp)")
	fs.IntVar(&o.concurrency, "model-server-concurrency", 0,
		"most requests in flight (vLLM max_num_seqs, TGI/TEI max_concurrent_requests); halved on an overload answer, grown back after clean runs;\n"+
			"0: one per KV block when the server's KV cache is followed (its vLLM metrics), which then bounds admission; else 16")
	fs.IntVar(&o.tpm, "model-server-tpm", 0,
		"tokens per minute this subscriber may use (prompt + max_tokens × n, reconciled with usage); 0: none of its own;\n"+
			"the server's x-ratelimit headers are followed either way")
	fs.IntVar(&o.rpm, "model-server-rpm", 0, "requests per minute this subscriber may send; 0: none of its own")
	for _, name := range deprecatedFlags {
		fs.String(name, "", "deprecated and ignored, with a warning at start: the KV cache is counted in tokens, which need no bytes per token; removed in the next release")
	}
	fs.Int64Var(&o.kvCacheTokens, "model-server-kv-cache-tokens", 0,
		"the server's KV capacity in tokens (blocks × block size), for a server without vllm:cache_config_info")
	fs.Int64Var(&o.tokensInFlight, "model-server-tokens-in-flight", modelserver.DefaultTokensInFlight,
		"most tokens (prompt + max output) admitted at once when the KV capacity is not known")
	fs.Int64Var(&o.kvReserve, flagKVReserve, 0,
		"KV tokens of the server's cache kept free of work, in -vram-reserve's place; 0: 1 token, in effect none")
	fs.Int64Var(&o.kvLimit, flagKVLimit, 0,
		"cap on the budget in KV tokens below what the server's cache offers, in -vram-limit's place; 0: no cap")
	fs.Int64Var(&o.maxBatchKV, flagMaxBatchKV, 0,
		"most estimated KV tokens per batch under -admission=vram, in -max-batch-bytes's place; 0: a quarter of the budget")
	fs.StringVar(&o.tokenizer, "model-server-tokenizer", "",
		"tokenizer.json (or its directory) of a WordPiece (BERT) embedding model: its inputs are counted exactly;\n"+
			"otherwise tokens are bounded from the bytes and tightened by the answers' usage")
	fs.IntVar(&o.maxOutputTokens, "model-server-max-output-tokens", modelserver.DefaultMaxOutputTokens,
		"ceiling of max_tokens: a body without one is sent with it (16 for /v1/completions, its default); one above it is refused")
	fs.IntVar(&o.maxN, "model-server-max-n", modelserver.DefaultMaxN, "most choices (n) a request may ask")
	fs.IntVar(&o.embedBatch, "model-server-embed-batch", modelserver.DefaultEmbedBatch,
		"most inputs of one embeddings request (TEI's max_client_batch_size); halved after a 413")
	fs.IntVar(&o.embedBatchTokens, "model-server-embed-batch-tokens", modelserver.DefaultEmbedBatchTokens,
		"most estimated tokens of one embeddings request (TEI's max_batch_tokens)")
	fs.DurationVar(&o.online.Interval, "model-server-online-interval", 0,
		"online-first mode: the server also serves traffic vramq does not send, and every interval the batch's requests in flight\n"+
			"are halved when the server shows online requests waiting (or the TTFT or KV targets passed) and grown when not (docs/models.md); 0: off")
	fs.IntVar(&o.online.TargetWaiting, "model-server-online-waiting", 0,
		"online-first mode: requests that may wait in the server's queue at every reading of an interval before the batch gives way")
	fs.DurationVar(&o.online.TargetTTFT, "model-server-online-ttft", 0,
		"online-first mode: time-to-first-token p99 over an interval (vLLM's histogram) past which the batch gives way; 0: not followed")
	fs.IntVar(&o.online.Headroom, "model-server-online-headroom", 0,
		"online-first mode: the server's sequences kept free for online traffic to grow into; 0: 1/32 of -model-server-concurrency")
	fs.IntVar(&o.online.Priority, "model-server-online-priority", 0,
		"online-first mode: the vLLM priority every generation is sent with, replacing the body's own (lower goes first;\n"+
			"the server needs --scheduling-policy priority); 0: none sent")
}

// config is the model server's configuration; the key is read from the
// environment variable the flags name.
func (o *modelServerOptions) config(getenv func(string) string, log *slog.Logger) modelserver.Config {
	models := envflag.List(o.models)
	c := modelserver.Config{
		BaseURL: o.url, Models: models, APIKeyFile: o.apiKeyFile,
		ConnectTimeout: o.connect, RequestTimeout: o.timeout, MaxRetries: o.retries, MaxWait: o.maxWait,
		MaxConcurrency: o.concurrency, TPM: o.tpm, RPM: o.rpm,
		KVCacheTokens: o.kvCacheTokens, TokensInFlight: o.tokensInFlight, Tokenizer: o.tokenizer,
		MaxOutputTokens: o.maxOutputTokens, MaxN: o.maxN, EmbedBatch: o.embedBatch, EmbedBatchTokens: o.embedBatchTokens,
		MaxServerWait: o.maxServerWait, AllowRemoteURLs: o.allowRemoteURLs, Online: o.online, Messages: o.messages,
		Logger: log,
	}
	if o.apiKeyFile == "" && o.apiKeyEnv != "" {
		c.APIKey = getenv(o.apiKeyEnv)
	}
	if o.retries == 0 {
		c.MaxRetries = -1 // the flag's 0 is none; the config's 0 is the default
	}
	return c
}

// checkModelServer refuses the flags that make no sense with -model-server,
// and checks its own before anything starts.
func checkModelServer(o *options, given map[string]bool) error {
	ms := &o.ms
	for _, name := range deprecatedFlags {
		if given[name] {
			ms.deprecated = append(ms.deprecated, name)
		}
	}
	kv := []struct {
		name, bytes string
		v           int64
		field       *int64 // the subscriber.Config field both set
	}{
		{flagKVReserve, "vram-reserve", ms.kvReserve, &o.cfg.VRAMReserve},
		{flagKVLimit, "vram-limit", ms.kvLimit, &o.cfg.VRAMLimit},
		{flagMaxBatchKV, "max-batch-bytes", ms.maxBatchKV, &o.cfg.MaxBatchBytes},
	}
	if ms.url == "" {
		for _, f := range kv {
			if given[f.name] {
				return fmt.Errorf("-%s needs -model-server: without one the budget is the device's memory in bytes (-%s)", f.name, f.bytes)
			}
		}
		return nil
	}
	for _, f := range kv {
		switch {
		case given[f.bytes]:
			return fmt.Errorf("-%s (%s) counts a GPU's bytes; with -model-server the budget is the server's KV cache in tokens: give -%s (%s) instead",
				f.bytes, envflag.Name(f.bytes), f.name, envflag.Name(f.name))
		case f.v < 0:
			return fmt.Errorf("-%s=%d: want 0 or more", f.name, f.v)
		}
		*f.field = f.v
	}
	// -vram sizes the simulated device, which a model server replaces.
	for _, f := range []string{"model", "weights", "calibrate", "cost-model", "device", "vram"} {
		if given[f] && !(f == "device" && o.device == "auto") {
			return fmt.Errorf("-model-server and -%s: the model runs on the server; give one or the other", f)
		}
	}
	if err := ms.config(func(string) string { return "" }, slog.Default()).Validate(); err != nil {
		return fmt.Errorf("-model-server: %v", err)
	}
	if ms.maxWait >= o.cfg.InferenceTimeout {
		return fmt.Errorf("-model-server-max-wait %v: want below -inference-timeout %v, so that a batch waiting for the server is handed back, not timed out",
			ms.maxWait, o.cfg.InferenceTimeout)
	}
	if o.cfg.VRAMReserve == 0 {
		// A GPU's reserve for a framework's allocations means nothing in
		// a KV cache, so none unless given; but 0 is subscriber.Config's
		// default (bytes), so the least above it.
		o.cfg.VRAMReserve = 1
	}
	return nil
}

func openModelServer(ctx context.Context, o *options, getenv func(string) string, log *slog.Logger, reg prometheus.Registerer) (*modelserver.Model, error) {
	for _, name := range o.ms.deprecated {
		log.Warn("a deprecated flag is ignored: the KV cache is counted in tokens, read from the server's vllm:cache_config_info "+
			"or given by -model-server-kv-cache-tokens; the flag goes in the next release", "flag", "-"+name)
	}
	c := o.ms.config(getenv, log)
	c.Registerer = reg
	m, err := modelserver.Open(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("-model-server: %w", err)
	}
	return m, nil
}
