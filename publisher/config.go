package publisher

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/payload"
)

// SQS's bounds on a message: 1 MiB since August 2025 (billed per 64 KiB); a
// queue's MaximumMessageSize may be set anywhere from 1 KiB up to it.
const (
	SQSMaxMessageBytes = 1 << 20
	SQSMinMessageBytes = 1 << 10
)

// Config is everything a Publisher needs. Zero fields take the defaults
// documented on each; Validate says what is wrong with the rest.
type Config struct {
	Queue Queue // the work queue (required)

	// Payloads is the payload bucket: claim-checked items, job manifests,
	// idempotency records, and the results GET /v1/jobs/{id} reads. Nil means
	// no bucket: items too large for a message are refused (413), job status
	// is not served (501) and idempotency records live in this process only.
	Payloads *payload.Store

	// MaxMessageBytes is the largest work message, attributes included:
	// the queue's MaximumMessageSize (see QueueLimits). Default 256 KiB,
	// which every SQS queue accepts; at most 1 MiB.
	MaxMessageBytes int
	// MaxBodyBytes bounds a request body, enforced before it is read;
	// default 32 MiB. The whole body is held in memory while it is handled.
	MaxBodyBytes int64
	// MaxItems bounds the items of one job; default 10,000.
	MaxItems int
	// MaxItemBytes is the largest item (its JSON in the message) carried
	// inline; a larger one goes to S3, or is refused without Payloads.
	// Default and maximum: what fits in a message alone. Lower it to keep
	// messages small and send large items through S3.
	MaxItemBytes int
	// ChunkItems is the default most items per chunk; default 32.
	ChunkItems int
	// MaxChunkItems caps the per-request option chunk_items; default 1,000.
	MaxChunkItems int

	// APIKeys, when any, are the bearer tokens accepted on /v1/jobs routes
	// (Authorization: Bearer <key>). /healthz and /metrics stay open.
	APIKeys []string

	// SendAttempts bounds the sends of one entry SQS lists in Failed, the
	// first included; default 5. SendBackoff is the wait before the first
	// retry, doubled each time up to 2 s, jittered; default 100ms.
	SendAttempts int
	SendBackoff  time.Duration
	// SendConcurrency is the SendMessageBatch calls in flight for one job;
	// default 4 (1 on a FIFO queue, to keep a job's chunks in order).
	SendConcurrency int

	// IdempotencyTTL and IdempotencyEntries bound the in-memory idempotency
	// records used when there is no bucket; defaults 24h and 100,000.
	IdempotencyTTL     time.Duration
	IdempotencyEntries int
	// IdempotencyStale is how long a record of a request still sending
	// blocks a retry with the same key (409); after it the retry takes the
	// job over and sends it again. Default 2m.
	IdempotencyStale time.Duration

	Logger *slog.Logger // default slog.Default(); request logs carry no payloads
	// Registerer gets the metrics; default a private registry. When it is
	// also a prometheus.Gatherer (a *prometheus.Registry is), Handler serves
	// it at /metrics.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() {
	defInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	defDur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	defInt(&c.MaxMessageBytes, 256<<10)
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	defInt(&c.MaxItems, 10_000)
	defInt(&c.MaxItemBytes, maxInlineItem(c.MaxMessageBytes))
	defInt(&c.ChunkItems, 32)
	defInt(&c.MaxChunkItems, 1_000)
	defInt(&c.SendAttempts, 5)
	defDur(&c.SendBackoff, 100*time.Millisecond)
	defInt(&c.SendConcurrency, 4)
	defDur(&c.IdempotencyTTL, 24*time.Hour)
	defInt(&c.IdempotencyEntries, 100_000)
	defDur(&c.IdempotencyStale, 2*time.Minute)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

// Validate reports every problem with c (after defaults), joined.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Queue == nil {
		bad("no work queue")
	}
	if c.MaxMessageBytes < SQSMinMessageBytes || c.MaxMessageBytes > SQSMaxMessageBytes {
		bad("max message bytes %d: want %d to %d", c.MaxMessageBytes, SQSMinMessageBytes, SQSMaxMessageBytes)
	} else if inline := maxInlineItem(c.MaxMessageBytes); c.MaxItemBytes < 1 || c.MaxItemBytes > inline {
		bad("max item bytes %d: want 1 to %d (what fits in a message of %d bytes)", c.MaxItemBytes, inline, c.MaxMessageBytes)
	}
	if c.MaxBodyBytes < 1 {
		bad("max body bytes %d: want at least 1", c.MaxBodyBytes)
	}
	if c.MaxItems < 1 {
		bad("max items %d: want at least 1", c.MaxItems)
	}
	if c.ChunkItems < 1 || c.MaxChunkItems < c.ChunkItems {
		bad("chunk items %d and max chunk items %d: want 1 <= chunk items <= max chunk items", c.ChunkItems, c.MaxChunkItems)
	}
	for i, k := range c.APIKeys {
		if k == "" {
			bad("API key %d is empty", i)
		}
	}
	if c.SendAttempts < 1 || c.SendBackoff < 0 || c.SendConcurrency < 1 {
		bad("send attempts %d, backoff %v, concurrency %d: want at least 1, 0 and 1", c.SendAttempts, c.SendBackoff, c.SendConcurrency)
	}
	if c.IdempotencyTTL < 0 || c.IdempotencyEntries < 1 || c.IdempotencyStale < 0 {
		bad("idempotency TTL %v, entries %d, stale %v: want non-negative durations and at least 1 entry", c.IdempotencyTTL, c.IdempotencyEntries, c.IdempotencyStale)
	}
	return errors.Join(errs...)
}
