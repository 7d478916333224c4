package publisher

import (
	"log/slog"
	"math"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/config"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/batches"
	"github.com/vramq/vramq/publisher/jobs"
)

// Jobs is the configuration of the job routes (publisher/jobs), embedded
// in Config.
type Jobs = jobs.Config

// Batches is the configuration of the batch routes (publisher/batches),
// embedded in Config.
type Batches = batches.Config

// API is the configuration of the publisher's HTTP edge (publisher/api),
// embedded in Config.
type API = api.Config

// Config is everything a Publisher needs. A zero field takes its value from
// DefaultConfig (the comments below say where a default is worked out
// instead); Validate says what is wrong with the rest.
type Config struct {
	Queue jobs.Queue // the work queue (required)

	// Payloads is the payload bucket: claim-checked items, job manifests,
	// idempotency records, and the results GET /v1/jobs/{id} reads. Nil means
	// no bucket: items too large for a message are refused (413), job status
	// is not served (501) and idempotency records live in this process only.
	Payloads *payload.Store

	// Jobs are the bounds of a job, its messages, the results read back and
	// the sends (publisher/jobs): embedded, so cfg.MaxItems is cfg.Jobs.MaxItems.
	Jobs

	// Batches are the batch routes' own settings (publisher/batches):
	// embedded, so cfg.BatchWebhookURL is cfg.Batches.BatchWebhookURL.
	Batches

	// API is what every route passes through (publisher/api): API keys,
	// rate limits, the bodies in flight and their pace, IdempotencyStale,
	// Logger and Registerer. Embedded, so cfg.RateLimit is cfg.API.RateLimit.
	// New sets its UploadHeld and Idem, which are worked out, not settings.
	API

	// MaxFileBytes, MaxFileLines and MaxFileLineBytes bound a file uploaded
	// to POST /v1/files: its bytes, its lines (JSONL: a last line without
	// its newline counts), and the bytes of each line, its newline not
	// counted. The defaults are OpenAI's Batch API limits (200 MB, taken
	// as 200 MiB so that every file OpenAI takes is taken here; 50,000
	// lines) and, where OpenAI states none, a line of 10 MiB. An upload
	// is streamed to the bucket and checked as it streams (publisher/files/files.go): one
	// over a limit is refused as soon as it goes over, and leaves nothing
	// stored. MaxFileBytes is at most payload.MaxUploadBytes. An upload is
	// charged to the bodies in flight for what it holds in memory, up to
	// payload.UploadPartBytes or MaxFileBytes, whichever is smaller: a
	// MaxBodyBytesPerClient below that refuses larger files 429. Uploads
	// together hold at most half MaxBodyBytesInFlight, and one client's
	// half of that, each at least that much (bodyBudget, publisher/api/inflight.go).
	MaxFileBytes     int64
	MaxFileLines     int
	MaxFileLineBytes int64
	// MaxFiles bounds the files one owner (the tenant of an API key; without
	// keys, a caller identity, or all callers without one together) holds:
	// an upload while it holds that many is refused 403 too_many_files
	// before its body is read. Its batches' output and error files count,
	// but are always written. Files count until deleted or expired; one
	// that expired is counted until a listing reads it (and deletes it) or
	// 30 days after it was made. Uploads at once may go past it by as many
	// as are at once. It also bounds what a listing lists: twice this many
	// keys, S3 listing 1,000 a call.
	MaxFiles int
	// FileUploadTimeout bounds the time a POST /v1/files may take, its body
	// included: the server's read and write deadlines are moved to it for
	// that request, since a file may be far larger than any other body
	// (-min-body-rate still applies to it).
	FileUploadTimeout time.Duration
	// PublicURL is the origin (scheme, host, port) clients reach the API at
	// through an edge that also serves the payload bucket's file keys
	// (/files/...) from the bucket, Host set to the bucket's and the query
	// kept (infra/edge.tf, CloudFront). Under Lambda a file too large for
	// the response is answered 307 to PublicURL plus the path and query of
	// its presigned S3 URL, so the redirect stays on the clients' base
	// URL's origin, which is all the OpenAI SDK for Go follows. Empty (the
	// default): to the presigned URL itself, on S3's origin. Nothing else
	// reads it.
	PublicURL string

	// IdempotencyTTL and IdempotencyEntries bound the in-memory idempotency
	// records used when there is no bucket.
	IdempotencyTTL     time.Duration
	IdempotencyEntries int
}

// DefaultConfig is the configuration a zero Config takes, field by field:
// every fixed default lives here, and cmd/publisher's flags start from it.
// docs/configuration.md lists the values, with the flags that set them.
// The fields whose default is worked out from others (MaxBodyBytesInFlight,
// MaxBodyBytesPerClient, MaxResultBytesPerClient, MaxItemBytes, RateBurst,
// GlobalRateBurst) are 0 here, as are those with none: no queue, bucket, API
// keys, rate limits or trusted proxies.
func DefaultConfig() Config {
	return Config{
		Jobs: jobs.DefaultConfig(),
		API: api.Config{
			MaxBodyBytes:       32 << 20,
			MaxBodiesPerClient: 16,
			MinBodyRate:        16 << 10,
			BodyGrace:          10 * time.Second,
			IPv6ClientPrefix:   56,
			RateLimitClients:   10_000,
			IdempotencyStale:   2 * time.Minute,
		},
		IdempotencyTTL:     24 * time.Hour,
		IdempotencyEntries: 100_000,
		MaxFileBytes:       200 << 20,
		MaxFileLines:       50_000,
		MaxFileLineBytes:   10 << 20,
		MaxFiles:           10_000,
		FileUploadTimeout:  30 * time.Minute,
	}
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	c.Jobs.SetDefaults()
	config.OrDefault(&c.MaxBodyBytes, d.MaxBodyBytes)
	config.OrDefault(&c.MaxBodyBytesInFlight, 2*c.MaxBodyBytes)
	config.OrDefault(&c.MaxBodyBytesPerClient, max(c.MaxBodyBytes, c.MaxBodyBytesInFlight/2))
	config.OrDefault(&c.MaxBodiesPerClient, d.MaxBodiesPerClient)
	config.OrDefault(&c.MinBodyRate, d.MinBodyRate)
	config.OrDefault(&c.BodyGrace, d.BodyGrace)
	config.OrDefault(&c.IPv6ClientPrefix, d.IPv6ClientPrefix)
	if c.RateLimit > 0 && c.RateBurst == 0 {
		c.RateBurst = api.DefaultBurst(c.RateLimit)
	}
	if c.GlobalRateLimit > 0 && c.GlobalRateBurst == 0 {
		c.GlobalRateBurst = api.DefaultBurst(c.GlobalRateLimit)
	}
	config.OrDefault(&c.RateLimitClients, d.RateLimitClients)
	config.OrDefault(&c.IdempotencyTTL, d.IdempotencyTTL)
	config.OrDefault(&c.IdempotencyEntries, d.IdempotencyEntries)
	config.OrDefault(&c.IdempotencyStale, d.IdempotencyStale)
	config.OrDefault(&c.MaxFileBytes, d.MaxFileBytes)
	config.OrDefault(&c.MaxFileLines, d.MaxFileLines)
	config.OrDefault(&c.MaxFileLineBytes, d.MaxFileLineBytes)
	config.OrDefault(&c.MaxFiles, d.MaxFiles)
	config.OrDefault(&c.FileUploadTimeout, d.FileUploadTimeout)
	config.OrDefault(&c.Logger, slog.Default())
	config.OrDefault(&c.Registerer, prometheus.Registerer(prometheus.NewRegistry()))
}

// uploadHeld is the most an upload holds in memory of its file, which is
// what its body is charged up to.
func (c *Config) uploadHeld() int64 { return min(payload.UploadPartBytes, c.MaxFileBytes) }

// FieldError is one problem Validate found, with the name of the Config
// field it is about (e.g. "MaxItems"), so that a command can name its own flag for it.
type FieldError = config.FieldError

// Validate reports every problem with c (after defaults), joined; each is a
// *FieldError.
func (c *Config) Validate() error {
	var problems config.Problems
	bad := problems.Add
	if c.Queue == nil {
		bad("Queue", "no work queue")
	}
	c.Batches.Validate(&problems)
	c.Jobs.Validate(&problems)
	if c.MaxBodyBytes < 1 {
		bad("MaxBodyBytes", "max body bytes %d: want at least 1", c.MaxBodyBytes)
	} else if c.MaxBodyBytesInFlight < c.MaxBodyBytes {
		bad("MaxBodyBytesInFlight",
			"max body bytes in flight %d: want at least max body bytes (%d), or a body at that limit is never taken",
			c.MaxBodyBytesInFlight, c.MaxBodyBytes)
	} else if c.MaxBodyBytesPerClient < c.MaxBodyBytes || c.MaxBodyBytesPerClient > c.MaxBodyBytesInFlight {
		bad("MaxBodyBytesPerClient",
			"max body bytes per client %d: want at least max body bytes (%d), or a body at that limit is never taken, "+
				"and at most max body bytes in flight (%d)", c.MaxBodyBytesPerClient, c.MaxBodyBytes, c.MaxBodyBytesInFlight)
	}
	config.AtLeast(&problems, "MaxBodiesPerClient", "max bodies per client", c.MaxBodiesPerClient, 1)
	if c.MinBodyRate < 1 {
		bad("MinBodyRate", "min body rate %d: want at least 1 byte a second", c.MinBodyRate)
	}
	if c.BodyGrace <= 0 {
		bad("BodyGrace", "body grace %v: want more than 0", c.BodyGrace)
	}
	if c.IPv6ClientPrefix < 32 || c.IPv6ClientPrefix > 128 {
		bad("IPv6ClientPrefix", "IPv6 client prefix /%d: want 32 to 128 (a shorter prefix is a whole ISP's)", c.IPv6ClientPrefix)
	}
	for i, k := range c.APIKeys {
		if name, key := api.SplitKey(k); key == "" {
			bad("APIKeys", "API key %d (tenant %q) is empty", i, name)
		}
	}
	rates := []struct {
		field, burstField, name string
		rate                    float64
		burst                   int
	}{
		{"RateLimit", "RateBurst", "rate limit", c.RateLimit, c.RateBurst},
		{"GlobalRateLimit", "GlobalRateBurst", "global rate limit", c.GlobalRateLimit, c.GlobalRateBurst},
	}
	for _, r := range rates {
		switch {
		case r.rate < 0 || math.IsNaN(r.rate) || math.IsInf(r.rate, 0):
			bad(r.field, "%s %v: want requests per second, a finite number at least 0 (0: none)", r.name, r.rate)
		case r.rate > 0 && r.burst < 1:
			bad(r.burstField, "%s burst %d: want at least 1", r.name, r.burst)
		}
	}
	config.AtLeast(&problems, "RateLimitClients", "rate limit clients", c.RateLimitClients, 1)
	for _, p := range c.TrustedProxies {
		switch {
		case !p.IsValid():
			bad("TrustedProxies", "trusted proxy %v is not a valid prefix", p)
		case p.Bits() == 0:
			// Every client would be a proxy, free to name any address.
			bad("TrustedProxies", "trusted proxy %v is every address: list the load balancers' own addresses", p)
		}
	}
	config.AtLeast(&problems, "IdempotencyTTL", "idempotency TTL", c.IdempotencyTTL, 0)
	config.AtLeast(&problems, "IdempotencyEntries", "idempotency entries", c.IdempotencyEntries, 1)
	config.AtLeast(&problems, "IdempotencyStale", "idempotency stale", c.IdempotencyStale, 0)
	if c.MaxFileBytes < 1 || c.MaxFileBytes > payload.MaxUploadBytes {
		bad("MaxFileBytes", "max file bytes %d: want 1 to %d (S3's 10,000 parts of the %d bytes an upload holds at once)",
			c.MaxFileBytes, int64(payload.MaxUploadBytes), payload.UploadPartBytes)
	}
	config.AtLeast(&problems, "MaxFileLines", "max file lines", c.MaxFileLines, 1)
	config.AtLeast(&problems, "MaxFileLineBytes", "max file line bytes", c.MaxFileLineBytes, 1)
	config.AtLeast(&problems, "MaxFiles", "max files", c.MaxFiles, 1)
	if c.PublicURL != "" {
		u, err := url.Parse(c.PublicURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			bad("PublicURL", "public URL %q: want an origin, http(s)://host[:port], without a path, query or fragment "+
				"(the edge serves the bucket's keys at its root)", c.PublicURL)
		}
	}
	if c.FileUploadTimeout <= 0 {
		bad("FileUploadTimeout", "file upload timeout %v: want more than 0", c.FileUploadTimeout)
	}
	return problems.Err()
}
