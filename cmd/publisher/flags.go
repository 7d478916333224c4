package main

import (
	"flag"
	"io"
	"strings"
	"time"

	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/batches"
)

// options are what the flags set.
type options struct {
	queueURL, bucket     string
	addr, metricsAddr    string
	apiKeys, apiKeysFile string
	apiKeysSecret        string
	maxMessage, maxItem  bytesize.Size
	maxBody, maxInFlight bytesize.Size
	maxResultsInFlight   bytesize.Size
	maxPage              bytesize.Size
	maxClientBody        bytesize.Size
	maxClientResults     bytesize.Size
	minBodyRate          bytesize.Size
	maxFile, maxFileLine bytesize.Size
	memoryLimit          bytesize.Size
	trustedProxies       string
	models               string
	servedEndpoints      string
	shutdownGrace        time.Duration
	sweepInterval        time.Duration
	logFormat, logLevel  string
	cfg                  publisher.Config
}

// Default rate limits: the binary's own, where the library's are none. One
// request may carry 10,000 items, so a client that needs more than 50 a
// second is a loop gone wrong or an attack; 50 a second still lets one
// client follow ten jobs at five status polls a second each (what
// bin/loadgen does) while it submits more. The burst of 100 takes a batch of
// submissions at once. The global limit, over all clients of the process, is
// twenty clients at that rate: a bound on what clients with many addresses
// (or keys) can send together, which a client keyed by its address cannot
// get around by minting addresses. It is not a measured capacity: what a
// process can take depends on its size, so set it from what one task takes.
// Under Lambda an instance takes one request at a time, and the API Gateway
// stage's throttling is the global limit (infra/publisher.tf).
const (
	defaultRateLimit       = 50
	defaultRateBurst       = 100
	defaultGlobalRateLimit = 20 * defaultRateLimit
	defaultGlobalRateBurst = 20 * defaultRateBurst
)

// newFlagSet defines the publisher's flags on o, each defaulting to what
// publisher.DefaultConfig holds for the field it sets (but for the rate
// limits above), so that a default is written once; docs/configuration.md
// is generated from this set. Under Lambda the same flags are read from the
// function's environment.
func newFlagSet(o *options, stderr io.Writer) *flag.FlagSet {
	d := publisher.DefaultConfig()
	c := &o.cfg
	o.maxBody, o.maxInFlight, o.maxItem = bytesize.Size(d.MaxBodyBytes), bytesize.Size(d.MaxBodyBytesInFlight), bytesize.Size(d.MaxItemBytes)
	o.maxResultsInFlight, o.maxPage = bytesize.Size(d.MaxResultBytesInFlight), bytesize.Size(d.MaxPageBytes)
	o.maxClientBody, o.minBodyRate = bytesize.Size(d.MaxBodyBytesPerClient), bytesize.Size(d.MinBodyRate)
	o.maxClientResults = bytesize.Size(d.MaxResultBytesPerClient)
	o.maxFile, o.maxFileLine = bytesize.Size(d.MaxFileBytes), bytesize.Size(d.MaxFileLineBytes)
	fs := flag.NewFlagSet("publisher", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.queueURL, "queue-url", "", "URL of the work queue, whose MaximumMessageSize is read at start (required)")
	fs.StringVar(&o.bucket, "payload-bucket", "",
		"S3 bucket for large items, job manifests, idempotency records and results; without it large items are refused (413),\n"+
			"GET /v1/jobs/{id} answers 501 and idempotency records live in this process only")
	fs.StringVar(&o.addr, "addr", ":8080", "HTTP listen address (not used under Lambda)")
	fs.StringVar(&o.apiKeys, "api-keys", "",
		"comma-separated bearer API keys accepted on /v1/jobs, each key or name:key to name its tenant (docs/api.md, Tenants)\n"+
			"(unset: no auth; a value naming no key is refused)")
	fs.StringVar(&o.apiKeysFile, "api-keys-file", "",
		"file of bearer API keys, one per line (# comments), key or name:key as in -api-keys, added to -api-keys;\n"+
			"a file naming no key is refused")
	fs.StringVar(&o.apiKeysSecret, "api-keys-secret", "",
		"ID or ARN of a Secrets Manager secret holding bearer API keys (comma- or line-separated, key or name:key),\n"+
			"read once at start "+
			"(a Lambda function's cold start) and added to -api-keys; the role needs secretsmanager:GetSecretValue on it")
	fs.Var(&o.maxMessage, "max-message-bytes", "largest work message (0: the queue's MaximumMessageSize; lower only)")
	fs.Var(&o.maxBody, "max-body-bytes",
		"largest request body, held in memory while handled (API Gateway and Lambda stop at 10 MB and 6 MB anyway)")
	fs.Var(&o.maxInFlight, "max-inflight-body-bytes",
		"most bytes of request bodies held at once, over all requests; a POST over it is answered 503 overloaded with\n"+
			"Retry-After, at once (0: twice -max-body-bytes). The heap peaks at 5 to 6 times this (BenchmarkConcurrentMaxBodies):\n"+
			"keep that under the task's memory")
	fs.Var(&o.maxResultsInFlight, "max-inflight-result-bytes",
		"most bytes of stored results GET /v1/jobs/{id} holds at once, over all requests, each charged before it is read;\n"+
			"a GET whose first result is over it is answered 503 overloaded with Retry-After, a later one ends the page\n"+
			"(at least 64MiB, the largest result a subscriber stores)")
	fs.Var(&o.maxClientResults, "max-client-result-bytes",
		"most bytes of stored results one client (its API key, else its address) holds at once in its GETs; a GET whose first\n"+
			"result is over it is answered 429 too_many_results with Retry-After, a later one ends the page\n"+
			"(0: half -max-inflight-result-bytes, at least 64MiB)")
	fs.Var(&o.maxPage, "max-page-bytes",
		"a page of results in GET /v1/jobs/{id} ends before the result that would take its stored size over this\n"+
			"(it always holds one); as page_size does by chunks. The default keeps a page within Lambda's 6 MB response")
	fs.Var(&o.maxClientBody, "max-client-body-bytes",
		"most bytes of request bodies one client (its API key, else its address) holds at once; a POST over it is answered\n"+
			"429 too_many_bodies with Retry-After, at once (0: half -max-inflight-body-bytes, at least -max-body-bytes)")
	fs.IntVar(&c.MaxBodiesPerClient, "max-client-bodies", d.MaxBodiesPerClient,
		"most POSTs of one client whose bodies are in flight (being read or handled) at once; one more is answered\n"+
			"429 too_many_bodies with Retry-After before its body is read")
	fs.Var(&o.minBodyRate, "min-body-rate",
		"bytes a second a request body must come at, on average from its start, once -body-grace is over; a slower one\n"+
			"is cut off, 408 body_too_slow, and gives back what it held")
	fs.DurationVar(&c.BodyGrace, "body-grace", d.BodyGrace,
		"how long a request body may take to start, and pause at most, before -min-body-rate applies")
	fs.Var(&o.memoryLimit, "memory-limit",
		"the Go runtime's soft memory limit (0: GOMEMLIMIT if set, else 90% of the Lambda function's memory or of the\n"+
			"container's cgroup limit, else none)")
	fs.IntVar(&c.MaxItems, "max-items", d.MaxItems, "most items in one job")
	fs.Var(&o.maxItem, "max-item-bytes", "largest item (its JSON) carried inline; larger ones go to S3 (0: what fits in a message)")
	fs.IntVar(&c.ChunkItems, "chunk-items", d.ChunkItems, "most items per chunk, unless the request's options.chunk_items says otherwise")
	fs.IntVar(&c.MaxChunkItems, "max-chunk-items", d.MaxChunkItems, "largest options.chunk_items a request may ask for")
	fs.StringVar(&o.models, "models", "",
		"comma-separated models the body of a request for a model server may name (its \"model\", compared exactly);\n"+
			"another is refused 422 model_not_allowed (empty: any model; the subscriber's own list still applies)")
	fs.StringVar(&o.servedEndpoints, "served-endpoints", strings.Join(d.ServedEndpoints, ","),
		"comma-separated endpoints of OpenAI's that the subscribers' model servers serve: a job or batch for another is\n"+
			"refused (add /v1/responses for vLLM, /v1/moderations where the servers serve it; /v1/messages is always taken)")
	fs.IntVar(&c.MaxN, "max-n", d.MaxN,
		"largest n (and best_of) in a request for a model server: the completions one item may ask for; 1 to 128")
	fs.IntVar(&c.MaxOutputTokens, "max-output-tokens", d.MaxOutputTokens,
		"largest max_tokens and max_completion_tokens in a request for a model server (a request without them is sent\n"+
			"with the subscriber's ceiling)")
	fs.BoolVar(&c.AllowRemoteURLs, "allow-remote-urls", d.AllowRemoteURLs,
		"let a chat request's content parts name remote URLs (image_url, audio_url, video_url), which a multimodal server\n"+
			"fetches; off, only data: URLs pass and another is refused 422 invalid_body (docs/security.md)")
	fs.StringVar(&c.BatchWebhookURL, "batch-webhook-url", "",
		"where OpenAI's batch webhook events (batch.completed, batch.failed, batch.expired, batch.cancelled) are POSTed\n"+
			"when a batch ends, tried 10 times with backoff over up to about half an hour (docs/api.md); empty: none sent")
	fs.StringVar(&c.BatchWebhookSecret, "batch-webhook-secret", "",
		"the secret -batch-webhook-url's events are signed with (Standard Webhooks, as OpenAI signs them): whsec_ and base64")
	fs.Var(&o.maxFile, "max-file-bytes",
		"largest file POST /v1/files takes (OpenAI's Batch API limit), streamed to the bucket and never held whole;\n"+
			"a larger one is refused as it goes over, 413 file_too_large, and nothing is kept")
	fs.IntVar(&c.MaxFileLines, "max-file-lines", d.MaxFileLines,
		"most lines (JSONL requests) in a file POST /v1/files takes (OpenAI's Batch API limit); more: 400 too_many_lines")
	fs.Var(&o.maxFileLine, "max-file-line-bytes",
		"largest line of a file POST /v1/files takes, its newline not counted; larger: 400 line_too_large")
	fs.IntVar(&c.MaxFiles, "max-files", d.MaxFiles,
		"most files one owner holds (a key's tenant; without keys, a caller identity from API Gateway), its batches'\n"+
			"output files counted; an upload past it: 403 too_many_files")
	fs.DurationVar(&c.FileUploadTimeout, "file-upload-timeout", d.FileUploadTimeout,
		"longest a POST /v1/files may take to send its file, in place of the server's 1-minute read timeout\n"+
			"(-min-body-rate applies too; 200 MiB in 30 minutes is 114 KiB a second)")
	fs.StringVar(&c.PublicURL, "public-url", d.PublicURL,
		"the origin (https://host) clients reach the API at through an edge that also serves the payload bucket's\n"+
			"/files/ keys from the bucket (infra/edge.tf, CloudFront); under Lambda a file too large for the response is\n"+
			"redirected there, the presigned S3 URL's path and query on the API's own origin, which the OpenAI SDK for Go\n"+
			"follows (empty: redirected to S3's own host)")
	fs.IntVar(&c.SendAttempts, "send-attempts", d.SendAttempts,
		"sends of one SendMessageBatch entry that SQS lists as failed, the first included")
	fs.Float64Var(&c.RateLimit, "rate-limit", defaultRateLimit,
		"requests per second one client may send to /v1/jobs routes (its API key when auth is on, else its address,\n"+
			"IPv6 by its -ipv6-client-prefix); 0: no limit")
	fs.IntVar(&c.RateBurst, "rate-burst", defaultRateBurst, "requests one client may send at once after a quiet spell")
	fs.Float64Var(&c.GlobalRateLimit, "global-rate-limit", defaultGlobalRateLimit,
		"requests per second this process takes from all clients together, twenty clients at the default -rate-limit\n"+
			"(not a measured capacity: set it from what one task takes); 0: no limit\n"+
			"(under Lambda, API Gateway's stage throttle is the global limit)")
	fs.IntVar(&c.GlobalRateBurst, "global-rate-burst", defaultGlobalRateBurst,
		"requests at once over all clients (0: twice -global-rate-limit)")
	fs.IntVar(&c.IPv6ClientPrefix, "ipv6-client-prefix", d.IPv6ClientPrefix,
		"prefix length by which an IPv6 address is one client, for rate limits and shares of the bodies in flight:\n"+
			"56 is what ISPs delegate to one site (RIPE-690) and AWS to one VPC, and a site holds 256 /64s; 48 where\n"+
			"clients hold /48s, 64 where many share a /56 (mobile carriers give each device a /64); 32 to 128")
	fs.IntVar(&c.RateLimitClients, "rate-limit-clients", d.RateLimitClients,
		"most clients whose rate limits are kept in memory, least recently seen dropped first\n"+
			"(a flood of addresses cannot grow memory)")
	fs.StringVar(&o.trustedProxies, "trusted-proxies", "",
		"comma-separated addresses or CIDR blocks of the load balancers whose X-Forwarded-For names the client, read from the\n"+
			"right up to the first untrusted address: only theirs (e.g. the ALB's subnets), never a block clients connect from;\n"+
			"/0 is refused; empty: the connection's address is the client")
	fs.StringVar(&o.metricsAddr, "metrics-addr", ":9090",
		"listen address of /metrics (Prometheus), apart from the API's so the load balancer does not forward it;\n"+
			"empty: not served (never served under Lambda)")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", 25*time.Second,
		"how long in-flight requests may finish after SIGTERM or SIGINT; then connections are closed and the exit is 0")
	fs.DurationVar(&o.sweepInterval, "batch-sweep-interval", batches.DefaultSweepInterval,
		"how often the batch sweeper expires batches at their window and finalizes those whose job has settled, read\n"+
			"or not (a read that finds one settled has it finalized at once); it also validates new batches, at once when\n"+
			"this process created them; 0: no sweeper in this process (its batches wait for another's). Under\n"+
			"Lambda an EventBridge schedule invokes the sweep instead, every minute (infra/publisher.tf)")
	fs.StringVar(&o.logFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return fs
}

// configFlags maps publisher.Config fields to the flags that set them.
var configFlags = map[string]string{
	"MaxMessageBytes": "max-message-bytes", "MaxBodyBytes": "max-body-bytes", "MaxItems": "max-items",
	"MaxBodyBytesInFlight": "max-inflight-body-bytes", "MaxBodyBytesPerClient": "max-client-body-bytes",
	"MaxBodiesPerClient": "max-client-bodies", "MinBodyRate": "min-body-rate", "BodyGrace": "body-grace",
	"IPv6ClientPrefix":       "ipv6-client-prefix",
	"MaxResultBytesInFlight": "max-inflight-result-bytes", "MaxPageBytes": "max-page-bytes",
	"MaxResultBytesPerClient": "max-client-result-bytes",
	"MaxItemBytes":            "max-item-bytes", "ChunkItems": "chunk-items", "MaxChunkItems": "max-chunk-items",
	"APIKeys": "api-keys", "SendAttempts": "send-attempts", "RateLimit": "rate-limit", "RateBurst": "rate-burst",
	"GlobalRateLimit": "global-rate-limit", "GlobalRateBurst": "global-rate-burst",
	"RateLimitClients": "rate-limit-clients", "TrustedProxies": "trusted-proxies",
	"Models": "models", "MaxN": "max-n", "MaxOutputTokens": "max-output-tokens", "AllowRemoteURLs": "allow-remote-urls",
	"ServedEndpoints": "served-endpoints",
	"MaxFileBytes":    "max-file-bytes", "MaxFileLines": "max-file-lines", "MaxFileLineBytes": "max-file-line-bytes",
	"FileUploadTimeout": "file-upload-timeout", "MaxFiles": "max-files", "PublicURL": "public-url",
	"BatchWebhookURL": "batch-webhook-url", "BatchWebhookSecret": "batch-webhook-secret",
}
