package jobs

import (
	"slices"
	"strings"
	"time"

	"github.com/vramq/vramq/internal/config"
	"github.com/vramq/vramq/job"
)

// maxN is the largest n OpenAI takes in a chat or completions request
// (CreateChatCompletionRequest, CreateCompletionRequest), and so the largest
// MaxN.
const maxN = 128

// Config is what the job routes and the chunks they send need: the bounds
// of a job, of its messages, of the results read back, and of the sends.
// publisher.Config embeds it, so a field here is a field there, set by the
// same flag. A zero field takes its value from DefaultConfig (the comments
// say where a default is worked out instead); Validate says what is wrong
// with the rest.
type Config struct {
	// MaxMessageBytes is the largest work message, attributes included:
	// the queue's MaximumMessageSize (see QueueLimits); 1 KiB to 1 MiB. The
	// default is what every SQS queue accepts.
	MaxMessageBytes int
	// MaxResultBytesInFlight bounds the bytes of stored results that GET
	// /v1/jobs/{id} holds at once, over all requests, by the results'
	// stored size: a result is charged before any of it is read and until
	// its part of the answer is written (resultpage.go). A request whose
	// first result finds the budget spent is answered 503 overloaded with
	// Retry-After; one that has answered some results ends its page there.
	// The heap the reads take is a small multiple of this: eight GETs
	// against a 4 MiB budget peaked at 12 to 13 MiB (BenchmarkJobPageHeap).
	// At least job.MaxResultBytes, the largest result a subscriber stores,
	// or such a result could never be served.
	MaxResultBytesInFlight int64
	// MaxResultBytesPerClient bounds the bytes of stored results one client
	// (its API key, else its address, as for bodies) holds at once: a GET
	// whose first result would take its client over it is answered 429
	// too_many_results with Retry-After, one that has answered some results
	// ends its page there, so that one client's unread GETs cannot hold the
	// whole budget. Zero is half MaxResultBytesInFlight; at least
	// job.MaxResultBytes and at most MaxResultBytesInFlight.
	MaxResultBytesPerClient int64
	// MaxPageBytes cuts a page of results by size as page_size cuts it by
	// chunks: a page ends before the result that would take its results'
	// stored size over this, but always holds one. The default keeps a page
	// within Lambda's 6 MB response.
	MaxPageBytes int64
	// MaxItems bounds the items of one job.
	MaxItems int
	// MaxItemBytes is the largest item (its JSON in the message) carried
	// inline; a larger one goes to S3, or is refused without Payloads.
	// Zero and the maximum: what fits in a message alone. Lower it to keep
	// messages small and send large items through S3.
	MaxItemBytes int
	// ChunkItems is the most items per chunk when a request does not say.
	ChunkItems int
	// MaxChunkItems caps the per-request option chunk_items.
	MaxChunkItems int

	// Models, when any, are the only models the body of a request for a
	// model server may name (its "model", compared exactly); a job with
	// another is refused 422 model_not_allowed. Empty: any model, and the
	// subscriber's own list is the only check.
	Models []string
	// MaxN bounds n (and best_of) in a request for a model server: the
	// completions one item may ask for, each up to its max tokens. 1 to
	// 128, OpenAI's own bound.
	MaxN int
	// MaxOutputTokens bounds max_tokens and max_completion_tokens in a
	// request for a model server. A request that leaves them out is sent
	// with the subscriber's ceiling instead (docs/api.md).
	MaxOutputTokens int
	// AllowRemoteURLs lets a chat request's content parts name URLs other
	// than data: ones (image_url and its kin), which a multimodal server
	// fetches; off, such a request is refused 422 invalid_body. The
	// subscriber has its own switch (-model-server-allow-remote-urls), and
	// refuses them too unless it is on (docs/security.md).
	AllowRemoteURLs bool
	// ServedEndpoints are the endpoints of OpenAI's (job.BatchEndpoints)
	// that the subscribers' model servers serve: a job or batch for
	// another is refused (a batch at validation, each line named).
	// Default DefaultServedEndpoints; add /v1/responses where the servers
	// are vLLM's, /v1/moderations where they serve it. Anthropic's
	// /v1/messages is always taken: a subscriber translates it where its
	// server has no such route.
	ServedEndpoints []string

	// SendAttempts bounds the sends of one entry SQS lists in Failed, the
	// first included. SendBackoff is the wait before the first retry,
	// doubled each time up to 2 s, jittered.
	SendAttempts int
	SendBackoff  time.Duration
	// SendConcurrency is the SendMessageBatch calls in flight for one job
	// (1 on a FIFO queue, whatever it says, to keep a job's chunks in order).
	SendConcurrency int
}

// DefaultConfig is the configuration a zero Config takes, field by field.
// The fields whose default is worked out from others (MaxResultBytesPerClient,
// MaxItemBytes) are 0 here.
func DefaultConfig() Config {
	return Config{
		MaxMessageBytes:        256 << 10,
		MaxResultBytesInFlight: 2 * job.MaxResultBytes,
		MaxPageBytes:           4 << 20,
		MaxItems:               10_000,
		ChunkItems:             32,
		MaxChunkItems:          1_000,
		MaxN:                   8,
		MaxOutputTokens:        16_384,
		ServedEndpoints:        slices.Clone(DefaultServedEndpoints),
		SendAttempts:           5,
		SendBackoff:            100 * time.Millisecond,
		SendConcurrency:        4,
	}
}

// SetDefaults gives every zero field its default.
func (c *Config) SetDefaults() {
	d := DefaultConfig()
	config.OrDefault(&c.MaxMessageBytes, d.MaxMessageBytes)
	config.OrDefault(&c.MaxResultBytesInFlight, d.MaxResultBytesInFlight)
	config.OrDefault(&c.MaxResultBytesPerClient, max(job.MaxResultBytes, c.MaxResultBytesInFlight/2))
	config.OrDefault(&c.MaxPageBytes, d.MaxPageBytes)
	config.OrDefault(&c.MaxItems, d.MaxItems)
	config.OrDefault(&c.MaxItemBytes, maxInlineItem(c.MaxMessageBytes))
	config.OrDefault(&c.ChunkItems, d.ChunkItems)
	config.OrDefault(&c.MaxChunkItems, d.MaxChunkItems)
	config.OrDefault(&c.MaxN, d.MaxN)
	config.OrDefault(&c.MaxOutputTokens, d.MaxOutputTokens)
	config.OrDefault(&c.SendAttempts, d.SendAttempts)
	config.OrDefault(&c.SendBackoff, d.SendBackoff)
	config.OrDefault(&c.SendConcurrency, d.SendConcurrency)
}

// Validate adds every problem with c (after defaults) to problems, each
// named by its field.
func (c *Config) Validate(problems *config.Problems) {
	bad := problems.Add
	if c.MaxMessageBytes < job.MinMessageBytes || c.MaxMessageBytes > job.MaxMessageBytes {
		bad("MaxMessageBytes", "max message bytes %d: want %d to %d", c.MaxMessageBytes, job.MinMessageBytes, job.MaxMessageBytes)
	} else if inline := maxInlineItem(c.MaxMessageBytes); c.MaxItemBytes < 1 || c.MaxItemBytes > inline {
		bad("MaxItemBytes", "max item bytes %d: want 1 to %d (what fits in a message of %d bytes)",
			c.MaxItemBytes, inline, c.MaxMessageBytes)
	}
	if c.MaxResultBytesInFlight < job.MaxResultBytes {
		bad("MaxResultBytesInFlight",
			"max result bytes in flight %d: want at least %d (job.MaxResultBytes), or a result at that size is never served",
			c.MaxResultBytesInFlight, job.MaxResultBytes)
	} else if c.MaxResultBytesPerClient < job.MaxResultBytes || c.MaxResultBytesPerClient > c.MaxResultBytesInFlight {
		bad("MaxResultBytesPerClient",
			"max result bytes per client %d: want at least %d (job.MaxResultBytes), or a result at that size is never served, "+
				"and at most max result bytes in flight (%d)", c.MaxResultBytesPerClient, job.MaxResultBytes, c.MaxResultBytesInFlight)
	}
	config.AtLeast(problems, "MaxPageBytes", "max page bytes", c.MaxPageBytes, 1)
	config.AtLeast(problems, "MaxItems", "max items", c.MaxItems, 1)
	if c.ChunkItems < 1 {
		bad("ChunkItems", "chunk items %d: want at least 1", c.ChunkItems)
	} else if c.MaxChunkItems < c.ChunkItems {
		bad("MaxChunkItems", "max chunk items %d: want at least chunk items (%d)", c.MaxChunkItems, c.ChunkItems)
	} else if c.MaxChunkItems > job.MaxItems {
		// Subscribers dead-letter a larger message, whoever sent it.
		bad("MaxChunkItems", "max chunk items %d: want at most %d (job.MaxItems)", c.MaxChunkItems, job.MaxItems)
	}
	for i, e := range c.ServedEndpoints {
		if !slices.Contains(job.BatchEndpoints, e) {
			bad("ServedEndpoints", "served endpoint %d (%q) is not one of %s", i, e, strings.Join(job.BatchEndpoints, ", "))
		}
	}
	seenModel := map[string]bool{}
	for i, m := range c.Models {
		switch {
		case m == "" || strings.TrimSpace(m) != m:
			bad("Models", "model %d (%q) is empty or has white space around it", i, m)
		case seenModel[m]:
			bad("Models", "model %q is listed twice", m)
		}
		seenModel[m] = true
	}
	if c.MaxN < 1 || c.MaxN > maxN {
		bad("MaxN", "max n %d: want 1 to %d (OpenAI's bound)", c.MaxN, maxN)
	}
	config.AtLeast(problems, "MaxOutputTokens", "max output tokens", c.MaxOutputTokens, 1)
	config.AtLeast(problems, "SendAttempts", "send attempts", c.SendAttempts, 1)
	config.AtLeast(problems, "SendBackoff", "send backoff", c.SendBackoff, 0)
	config.AtLeast(problems, "SendConcurrency", "send concurrency", c.SendConcurrency, 1)
}
