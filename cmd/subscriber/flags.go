package main

import (
	"flag"
	"io"
	"time"

	"github.com/vramq/vramq/gpu/calibrate"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/subscriber"
)

// options are what the flags set.
type options struct {
	queueURL, resultsURL, dlqURL string
	payloadBucket                string
	eventsTopicARN               string // -events-topic-arn: completion events' SNS topic; empty: none
	device                       string
	vram, reserve, limit         bytesize.Size
	maxBatchBytes                bytesize.Size
	modelSeed                    uint64
	weights                      string
	model                        string // a BERT-family model directory; empty: the reference model
	precision, attention         string // -gpu-precision, -gpu-attention (precision.go)
	metricsAddr                  string
	logFormat, logLevel          string
	admission                    string // -admission, read into cfg.Admission
	taskProtection               string // -task-protection: auto, on or off
	tenants                      string // -tenants, comma-separated, read into cfg.Tenants
	// protectionURI is the ECS agent's URI when task scale-in protection
	// is on; empty when off.
	protectionURI string
	cfg           subscriber.Config
	// calibrate runs the sweep instead of subscribing; costModel is the
	// file it writes, or the one a subscriber loads (calibrate.go).
	calibrate                       bool
	calibrateItems, calibratePoints int
	costModel                       string
	// ms are the -model-server flags (modelserver.go).
	ms modelServerOptions
}

// The defaults of the flags that set no subscriber.Config field; those that
// do take subscriber.DefaultConfig's.
const (
	defaultSimVRAM     = 16 << 30
	defaultMetricsAddr = ":9090"
)

// newFlagSet defines the subscriber's flags on o, each defaulting to what
// subscriber.DefaultConfig holds for the field it sets, so that a default is
// written once; docs/configuration.md is generated from this set.
func newFlagSet(o *options, stderr io.Writer) *flag.FlagSet {
	d := subscriber.DefaultConfig()
	c := &o.cfg
	o.vram, o.reserve = defaultSimVRAM, bytesize.Size(d.VRAMReserve)
	o.limit, o.maxBatchBytes = bytesize.Size(d.VRAMLimit), bytesize.Size(d.MaxBatchBytes)
	fs := flag.NewFlagSet("subscriber", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.queueURL, "queue-url", "", "URL of the work queue (required)")
	fs.StringVar(&o.resultsURL, "results-queue-url", "", "URL of the results queue (required)")
	fs.StringVar(&o.dlqURL, "dlq-url", "", "URL of the dead-letter queue, for poison messages with a reason (required)")
	fs.StringVar(&o.payloadBucket, "payload-bucket", "",
		"S3 bucket of claim-checked items, stored results (results/) and failed markers (failed/);\n"+
			"empty: none, and items that reference an object (a ref) are dead-lettered")
	fs.StringVar(&o.eventsTopicARN, "events-topic-arn", "",
		"ARN of an SNS topic that gets one completion event per job when its last chunk settles\n"+
			"(docs/events.md); needs -payload-bucket. Empty: no events")
	fs.StringVar(&o.device, "device", "auto", deviceHelp)
	fs.Var(&o.vram, "vram", "memory of the simulated device, e.g. 16GiB")
	fs.Var(&o.reserve, "vram-reserve", "device memory kept free of work (with -model-server: -model-server-kv-reserve-tokens)")
	fs.Var(&o.limit, "vram-limit", "cap on the VRAM budget below what the device offers (0: no cap; with -model-server: -model-server-kv-limit-tokens)")
	fs.DurationVar(&c.BudgetRefresh, "budget-refresh", d.BudgetRefresh,
		"how often the device's memory is read again; under -admission=vram the budget follows it, so another process on the GPU\n"+
			"shrinks it; at least 100ms (negative: never, keep the budget read at start)")
	fs.StringVar(&o.model, "model", "",
		"directory of a BERT-family sentence encoder as Hugging Face ships it (config.json, model.safetensors,\n"+
			"tokenizer.json or vocab.txt, the sentence-transformers files); it runs on the CPU with its memory accounted on\n"+
			"-device=sim; results carry bert:<directory name>; a directory the loader refuses stops the start with an error\n"+
			"naming the file and field; an item with binary data is answered with an invalid_input error, the chunk's\n"+
			"other items run (a chunk whose every item is refused is dead-lettered as invalid input);\n"+
			"empty: the reference embedding model")
	fs.StringVar(&o.precision, "gpu-precision", "float32",
		"number format of -model's matrix products on a GPU (the CUDA build, -device=cuda:N or auto): float32 (outputs as\n"+
			"the CPU's), float16 or bfloat16 (tensor cores, float32 accumulation; bfloat16 needs compute capability 8.0),\n"+
			"or weights (the checkpoint's dtype: one all float16 or all bfloat16 runs so, others float32)")
	fs.StringVar(&o.attention, "gpu-attention", "gemm",
		"how -model computes attention on a GPU (the CUDA build): gemm (two batched GEMMs around a softmax) or fused\n"+
			"(one kernel, memory linear in the sequence length)")
	fs.Uint64Var(&o.modelSeed, "model-seed", refembed.DefaultConfig().Seed,
		"seed of the reference model's generated weights (without -weights)")
	fs.StringVar(&o.weights, "weights", "",
		"safetensors file of the reference model's weights (make weights writes one; empty: generated from -model-seed)")
	fs.BoolVar(&o.calibrate, "calibrate", false,
		"measure the model's working memory on -device with a sweep of batches (with -model: padded shapes up to\n"+
			"its max_seq_length, fitted with a length² term for attention), print the fitted cost model,\n"+
			"write it to -cost-model if set, and exit (touches no queue; nothing else may use the device meanwhile)")
	fs.IntVar(&o.calibrateItems, "calibrate-items", 0,
		"most items in one batch of the -calibrate sweep (0: -max-batch × 32, the publisher's default -chunk-items)")
	fs.IntVar(&o.calibratePoints, "calibrate-points", calibrate.DefaultSweep(1).Points,
		"batches the -calibrate sweep measures at its largest item count (fewer at smaller ones):\n"+
			"more take longer and leave a smaller margin")
	fs.StringVar(&o.costModel, "cost-model", "",
		"cost model file from -calibrate: estimate each message's working memory with it, refused if fitted for another model\n"+
			"or device (with -calibrate: where to write it; empty: the model's own estimate)")
	addModelServerFlags(fs, &o.ms)
	fs.StringVar(&o.admission, "admission", string(d.Admission),
		"admission strategy: vram (by estimated memory), count (fixed N at once), none (all received; for comparison)")
	fs.IntVar(&c.Count, "count", d.Count, "messages at once under -admission=count")
	fs.IntVar(&c.Prefetch, "prefetch", d.Prefetch, "most messages received but not yet started; fewer while they start slowly: "+
		"as many as start within half of -admit-timeout at their recent rate (at least 1), so that what this subscriber "+
		"cannot start soon stays on the queue for another")
	fs.IntVar(&c.MaxInflight, "max-inflight", d.MaxInflight, "most messages held in all, waiting and running")
	fs.IntVar(&c.MaxBatch, "max-batch", d.MaxBatch, "most messages per device batch")
	fs.DurationVar(&c.MaxBatchDelay, "max-batch-delay", d.MaxBatchDelay,
		"how long a batch waits for more messages after its first; a batch goes at once when admission is full\n"+
			"(nothing more could join it)")
	fs.Var(&o.maxBatchBytes, "max-batch-bytes",
		"most estimated working memory per batch under -admission=vram (0: a quarter of the budget, so one batch can start,\n"+
			"paying its fixed launch time, while others work); larger batches make fewer SQS requests per message\n"+
			"(with -model-server: -model-server-max-batch-kv-tokens)")
	fs.DurationVar(&c.WaitTime, "wait-time", d.WaitTime, "long-poll wait; whole seconds, 1s to 20s (0: the default)")
	fs.DurationVar(&c.Visibility, "visibility-timeout", d.Visibility,
		"visibility timeout on receive and each extension; heartbeats every third of it; whole seconds, 3s to 12h")
	fs.DurationVar(&c.MaxHold, "max-hold", d.MaxHold,
		"longest a message is held before its lease is let go; from -visibility-timeout to 12h")
	fs.DurationVar(&c.AdmitTimeout, "admit-timeout", d.AdmitTimeout,
		"a message not admitted this long after receipt is handed back as a fresh copy (backpressure; no cost to its receive count); below -max-hold")
	fs.DurationVar(&c.OperatorProbe, "operator-probe", d.OperatorProbe,
		"while the model needs an operator (spent quota, refused key), one message runs as a probe this often; work resumes when one gets through; 1s to 12h")
	fs.DurationVar(&c.InferenceTimeout, "inference-timeout", d.InferenceTimeout, "longest one batch may run; below -max-hold")
	fs.DurationVar(&c.RetryDelay, "retry-delay", d.RetryDelay,
		"visibility of a message released after a transient failure, doubled per receive up to 15m")
	fs.DurationVar(&c.CancelCheckTTL, "cancel-check-ttl", d.CancelCheckTTL,
		"how long whether a job is cancelled is cached before its cancel record is read again; 100ms to 10m")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", d.ShutdownGrace, "how long running batches may finish after SIGTERM")
	fs.IntVar(&c.MaxMessageBytes, "max-message-bytes", d.MaxMessageBytes, "largest result message; 1 KiB to 1 MiB")
	fs.Float64Var(&c.EstimateCorrectionMax, "estimate-correction-max", d.EstimateCorrectionMax,
		"cap on the factor -admission=vram multiplies the model's estimates by after out-of-memory errors, raised 1.25× per\n"+
			"error and back towards 1 after clean batches; never makes a message too large to run; 1 to 4 (1: off)")
	fs.StringVar(&c.StateFile, "state-file", d.StateFile, "file that keeps the learned batch limit across restarts")
	fs.IntVar(&c.BatchLimitProbeAfter, "batch-limit-probe-after", d.BatchLimitProbeAfter,
		"full batches in a row, none out of memory, before a batch limit lowered by an OOM is probed one step higher\n"+
			"(+1 or +25%, up to -max-batch); doubles after each probe that runs out of memory, up to 64 times;\n"+
			"a budget increase probes at the next full batch; negative: the limit never grows back")
	fs.StringVar(&o.taskProtection, "task-protection", "auto",
		"ECS task scale-in protection while messages are held, through the agent at $ECS_AGENT_URI:\n"+
			"auto (on where ECS_AGENT_URI is set, as in every ECS task), on, off;\n"+
			"on after the first message is received, renewed while any is held, off 30 s after the last is settled and at shutdown;\n"+
			"failures are logged and counted (vramq_subscriber_task_protection_errors_total), never block work;\n"+
			"the task role needs ecs:UpdateTaskProtection and ecs:GetTaskProtection")
	fs.DurationVar(&c.TaskProtectionExpiry, "task-protection-expiry", d.TaskProtectionExpiry,
		"how long one protection lasts unless renewed (renewed at half of it while messages are held); 1m to 48h")
	fs.DurationVar(&c.TaskProtectionMaxHold, "task-protection-max-hold", d.TaskProtectionMaxHold,
		"the longest protection stays on without a 2-minute break, so that a deployment waiting for this task can replace it;\n"+
			"1m to 48h")
	fs.StringVar(&o.tenants, "tenants", "",
		"comma-separated tenant names that get a series of their own in vramq_subscriber_tenant_results_sent_total,\n"+
			"as the publisher names them (an API key's name, or key-… for an unnamed key); results of any other\n"+
			"vramq-tenant attribute, which whoever sends to the work queue writes, count as \"other tenants\"")
	fs.StringVar(&o.metricsAddr, "metrics-addr", defaultMetricsAddr,
		"address for /metrics, /livez (liveness) and /healthz (readiness: also fails while the model needs an operator)\n"+
			"(empty: off; subscriber healthcheck asks /livez)")
	fs.StringVar(&o.logFormat, "log-format", "json", "log format: json or text (log/slog)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return fs
}

// healthcheckOptions are what the flags of `subscriber healthcheck` set.
type healthcheckOptions struct {
	metricsAddr string
	timeout     time.Duration
}

// newHealthcheckFlagSet defines the flags of `subscriber healthcheck` on o.
func newHealthcheckFlagSet(o *healthcheckOptions, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("subscriber healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.metricsAddr, "metrics-addr", defaultMetricsAddr, "address the subscriber serves /livez on")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second,
		"how long the whole check may take (keep it under the container health check's own timeout)")
	return fs
}

// configFlags maps subscriber.Config fields to the flags that set them.
var configFlags = map[string]string{
	"Admission": "admission", "Count": "count", "VRAMReserve": "vram-reserve", "VRAMLimit": "vram-limit",
	"BudgetRefresh": "budget-refresh", "Prefetch": "prefetch", "MaxInflight": "max-inflight", "MaxBatch": "max-batch",
	"MaxBatchDelay": "max-batch-delay", "MaxBatchBytes": "max-batch-bytes", "WaitTime": "wait-time",
	"Visibility": "visibility-timeout", "MaxHold": "max-hold", "AdmitTimeout": "admit-timeout",
	"InferenceTimeout": "inference-timeout", "RetryDelay": "retry-delay", "ShutdownGrace": "shutdown-grace",
	"CancelCheckTTL": "cancel-check-ttl", "OperatorProbe": "operator-probe",
	"MaxMessageBytes": "max-message-bytes", "StateFile": "state-file", "BatchLimitProbeAfter": "batch-limit-probe-after",
	"EstimateCorrectionMax": "estimate-correction-max",
	"TaskProtectionExpiry":  "task-protection-expiry", "TaskProtectionMaxHold": "task-protection-max-hold",
	"Tenants": "tenants",
}
