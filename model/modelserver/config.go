package modelserver

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/job"
)

// Config says which server to call and within what limits. Only BaseURL and
// Models are required; every other zero value takes the default named on
// its field.
type Config struct {
	// BaseURL is the server's root, e.g. "http://localhost:8000" or
	// "https://api.openai.com"; a trailing "/v1" is accepted. It comes from
	// configuration only, never from a message.
	BaseURL string
	// Models are the model names a request may name; a body naming another
	// is refused as the item's own error without reaching the server.
	Models []string
	// APIKey is sent as "Authorization: Bearer APIKey" when set. It is
	// never logged: Config's LogValue leaves it out. Set it from an
	// environment variable, or give APIKeyFile.
	APIKey string
	// APIKeyFile is a file that holds the key (a mounted secret); read at
	// Open, trimmed of spaces. Give APIKey or APIKeyFile, not both.
	APIKeyFile string

	// ConnectTimeout bounds dialing and the TLS handshake. Default 10s.
	ConnectTimeout time.Duration
	// RequestTimeout bounds one request, body read included: a generation
	// of many tokens takes a while. Default 2m.
	RequestTimeout time.Duration
	// MaxRetries is how many times a request that failed transiently (5xx,
	// 424, a dropped connection, a timeout) is sent again within Run
	// before Run gives up with a plain error. Default 3; negative: none.
	MaxRetries int
	// MaxServerWait caps every wait a server asks for: Retry-After (in
	// seconds or as an HTTP date), retry-after-ms, x-ratelimit-reset-*,
	// and the waits computed from its rate-limit headers. A wait past it
	// is taken as MaxServerWait, counted
	// (vramq_subscriber_model_server_waits_capped_total) and logged: a broken or
	// hostile server's "Retry-After: 999999999" must not stop the
	// subscriber for decades. Default 1h.
	MaxServerWait time.Duration
	// MaxWait is the longest Run waits for the server in all: for a rate
	// limit to refill, for an overloaded server to take requests again.
	// When the server names a later time, Run returns at once with a
	// fault.ErrBackoff error carrying it. Keep it below the subscriber's
	// inference timeout. Default 1m.
	MaxWait time.Duration

	// MaxConcurrency is the most requests in flight at once (vLLM's
	// max_num_seqs, TGI's and TEI's max_concurrent_requests, Ollama's
	// OLLAMA_NUM_PARALLEL). It is halved on an overload answer and grown
	// back after clean runs. Default: when the server's KV cache is
	// followed (its vLLM metrics), one request per KV block, the most
	// the cache can hold at once, so that the cache bounds admission;
	// else 16 (DefaultMaxConcurrency).
	MaxConcurrency int
	// TPM and RPM are tokens and requests per minute this subscriber may
	// use; 0: no limit of its own. The server's x-ratelimit headers are
	// followed either way. They also bound what the subscriber admits, in
	// rate tokens of their own (Model.Offers), to what they pass in
	// MaxWait/2: without them a subscriber in front of a rate limit admits
	// a queue's worth, and its batches back off (bench/modelserver.md,
	// "Through the subscriber").
	TPM, RPM int

	// KVCacheTokens is the server's KV capacity in tokens (blocks × block
	// size), for a server that does not export vllm:cache_config_info.
	KVCacheTokens int64
	// TokensInFlight is the KV pool admission works against when the KV
	// cache's size is not known: the most tokens (prompt + max output) of requests admitted at
	// once. Default 1,048,576.
	TokensInFlight int64

	// Tokenizer is the path of a tokenizer.json (or its directory) whose
	// algorithm this project runs (BERT's WordPiece, as embedding models
	// behind TEI use): embedding inputs are then counted exactly. Another
	// kind is logged and ignored: counts are bounded from the bytes.
	Tokenizer string
	// MaxOutputTokens is the ceiling of a request's max_tokens: a body
	// without one is sent with it, and one above it is refused. Default
	// 16384, the publisher's -max-output-tokens default.
	MaxOutputTokens int
	// MaxN bounds a body's n and best_of. Default 8, the publisher's
	// -max-n default.
	MaxN int
	// AllowRemoteURLs lets a chat body's content parts name URLs other
	// than data: ones (image_url and its kin), which a multimodal server
	// fetches. Off, such an item is refused (invalid_input) without a
	// request: a message must not choose what the server fetches.
	AllowRemoteURLs bool
	// Messages is how an Anthropic Messages request (job.EndpointMessages)
	// reaches the server: MessagesChat (the default) translates it to
	// /v1/chat/completions and back, which every server here serves;
	// MessagesNative sends it to the server's own /v1/messages (vLLM,
	// SGLang, llama.cpp), which carries every field (messages.go).
	Messages string
	// ResultBytes bounds the answers one Run keeps, in all, with those its
	// caller holds already for the same results (gpu.WithKept): an answer that
	// would take them past it fails its item (too_large) instead, so that
	// a run's result stays within what a subscriber stores
	// (job.MaxResultBytes). Default job.MaxResultBytes less a sixteenth,
	// for the result's ids and errors.
	ResultBytes int64
	// EmbedBatch is the most inputs of one embeddings request (TEI's
	// max_client_batch_size). Default 32.
	EmbedBatch int
	// EmbedBatchTokens is the most estimated tokens of one embeddings
	// request (TEI's max_batch_tokens). Default 16384.
	EmbedBatchTokens int

	// MetricsMaxAge is how long a reading of /metrics serves MemInfo.
	// Default 1s.
	MetricsMaxAge time.Duration
	// HTTPClient replaces the client Open builds; tests pass a test
	// server's. Its own timeouts and retries are its caller's business.
	HTTPClient *http.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the backend's metrics.
	Registerer prometheus.Registerer

	// Online, with an Interval, is online-first mode (online.go).
	Online Online
}

// Defaults.
const (
	DefaultConnectTimeout   = 10 * time.Second
	DefaultRequestTimeout   = 2 * time.Minute
	DefaultMaxRetries       = 3
	DefaultMaxWait          = time.Minute
	DefaultMaxConcurrency   = 16
	DefaultTokensInFlight   = 1 << 20
	DefaultMaxOutputTokens  = 16384
	DefaultMaxN             = 8
	DefaultEmbedBatch       = 32
	DefaultEmbedBatchTokens = 16384
	DefaultMetricsMaxAge    = time.Second
	DefaultMaxServerWait    = time.Hour
	DefaultResultBytes      = job.MaxResultBytes - job.MaxResultBytes/16
)

// defaultConcurrency is MaxConcurrency when none is given. A server whose
// KV cache is followed bounds admission by that cache (KV), and a
// fixed 16 would hold a pool of long contexts and short answers to a
// fraction of it (0.551 of the pool in bench/modelserver.md's KV run
// through the subscriber): the bound is then one request per block, the
// most sequences the cache can hold at once, which the cache reaches
// first. Elsewhere nothing else bounds the requests, and 16 does.
func defaultConcurrency(kvFollowed bool, blocks int64) int {
	if kvFollowed && blocks > 0 {
		return int(min(blocks, math.MaxInt32))
	}
	return DefaultMaxConcurrency
}

func (c *Config) setDefaults() {
	def := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	defInt := func(p *int, d int) {
		if *p == 0 {
			*p = d
		}
	}
	def(&c.ConnectTimeout, DefaultConnectTimeout)
	def(&c.RequestTimeout, DefaultRequestTimeout)
	def(&c.MaxWait, DefaultMaxWait)
	def(&c.MetricsMaxAge, DefaultMetricsMaxAge)
	def(&c.MaxServerWait, DefaultMaxServerWait)
	if c.ResultBytes == 0 {
		c.ResultBytes = DefaultResultBytes
	}
	defInt(&c.MaxRetries, DefaultMaxRetries)
	defInt(&c.MaxOutputTokens, DefaultMaxOutputTokens)
	defInt(&c.MaxN, DefaultMaxN)
	defInt(&c.EmbedBatch, DefaultEmbedBatch)
	defInt(&c.EmbedBatchTokens, DefaultEmbedBatchTokens)
	if c.TokensInFlight == 0 {
		c.TokensInFlight = DefaultTokensInFlight
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Messages == "" {
		c.Messages = MessagesChat
	}
}

// Validate reports every problem with c, its defaults applied, joined.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("modelserver: "+format, a...)) }
	if c.BaseURL == "" {
		bad("no base URL")
	} else if u, err := url.Parse(c.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("base URL %q: want http(s)://host[:port][/path]", redactURL(c.BaseURL))
	} else if u.User != nil {
		bad("base URL %q: credentials in the URL; give the API key instead", redactURL(c.BaseURL))
	} else if u.RawQuery != "" || u.Fragment != "" {
		bad("base URL %q: no query or fragment", redactURL(c.BaseURL))
	}
	if len(c.Models) == 0 {
		bad("no model names: requests may name only configured models")
	}
	for _, m := range c.Models {
		if strings.TrimSpace(m) == "" || m != strings.TrimSpace(m) {
			bad("model name %q: want a non-empty name without surrounding spaces", m)
		}
	}
	if c.APIKey != "" && c.APIKeyFile != "" {
		bad("an API key and an API key file: give one")
	}
	if strings.ContainsAny(c.APIKey, "\r\n") {
		bad("the API key holds a line break")
	}
	for name, d := range map[string]time.Duration{"connect timeout": c.ConnectTimeout, "request timeout": c.RequestTimeout,
		"max wait": c.MaxWait, "metrics max age": c.MetricsMaxAge, "max server wait": c.MaxServerWait} {
		if d < 0 {
			bad("%s %v: want 0 (the default) or more", name, d)
		}
	}
	for name, v := range map[string]int{"max concurrency": c.MaxConcurrency, "max output tokens": c.MaxOutputTokens,
		"max n": c.MaxN, "embed batch": c.EmbedBatch, "embed batch tokens": c.EmbedBatchTokens} {
		if v < 0 {
			bad("%s %d: want 0 (the default) or more", name, v)
		}
	}
	for name, v := range map[string]int{"TPM": c.TPM, "RPM": c.RPM} {
		if v < 0 {
			bad("%s %d: want 0 (none) or more", name, v)
		}
	}
	for name, v := range map[string]int64{"KV cache tokens": c.KVCacheTokens,
		"tokens in flight": c.TokensInFlight, "result bytes": c.ResultBytes} {
		if v < 0 {
			bad("%s %d: want 0 or more", name, v)
		}
	}
	if c.Messages != MessagesChat && c.Messages != MessagesNative {
		bad("messages %q: want %s or %s", c.Messages, MessagesChat, MessagesNative)
	}
	if c.TPM > 0 && int64(c.MaxOutputTokens) > int64(c.TPM) {
		bad("max output tokens %d above the TPM limit %d: such a request could never be sent", c.MaxOutputTokens, c.TPM)
	}
	if err := c.Online.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// LogValue is Config as logs show it: the key never, only whether there is one.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", redactURL(c.BaseURL)),
		slog.Any("models", c.Models),
		slog.Bool("api_key", c.APIKey != "" || c.APIKeyFile != ""),
		slog.Int("max_concurrency", c.MaxConcurrency),
		slog.Int("tpm", c.TPM), slog.Int("rpm", c.RPM),
		slog.Duration("max_wait", c.MaxWait),
		slog.Duration("max_server_wait", c.MaxServerWait),
		slog.Bool("allow_remote_urls", c.AllowRemoteURLs),
	)
}

// redactURL drops a URL's user info, should one carry a secret.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User != nil {
		u.User = url.User("REDACTED")
	}
	return u.String()
}
