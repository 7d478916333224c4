package subscriber

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/config"
	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queue"
)

// Config is everything a Subscriber needs. A zero field takes its value from
// DefaultConfig (the comments below say where a default is worked out
// instead); Validate says what is wrong with the rest.
type Config struct {
	Queue   queue.Queue  // the work queue (required)
	Results queue.Sender // where result messages go (required)
	DLQ     queue.Sender // where poison messages go, with a reason attribute (required)

	// Payloads is the payload bucket (S3), or nil for none. With it, items
	// that reference an object there (claim-checked by the publisher) are
	// fetched and verified before they run; every chunk's result is also
	// written to results/{job_id}/{chunk}.json, and a result too large for
	// a message is sent as a reference to that object; every dead-lettered
	// chunk gets a failed/{job_id}/{chunk}.json marker. Without it, a
	// message that references an object is dead-lettered (claim_check) and
	// a result too large for a message too (result_too_large).
	Payloads Payloads

	// Events, when set, receives each job's completion event, once, when
	// its last chunk settles (subscriber/events.go, docs/events.md). It
	// needs Payloads, and Payloads must be a Lister.
	Events EventSink

	// Backend runs the work (required): a model server
	// (model/modelserver), whose KV cache bounds it, or
	// backend.InProcess with a loaded model, its weights already on its
	// device.
	Backend backend.Backend
	// Device is the device whose memory bounds a Backend that owns no
	// Memory (backend.MemoryOwner): an InProcess without its Device. Set
	// it for such a backend only.
	Device gpu.Device

	// Admission is the strategy.
	Admission Strategy
	// Count is the number of messages run at once under AdmitCount.
	Count int
	// VRAMReserve, VRAMLimit and MaxBatchBytes are in the backend's unit
	// (backend.Unit): device bytes for a GPU, KV-cache tokens for a model
	// server (cmd/subscriber's -model-server-kv-* flags set them then).
	//
	// VRAMReserve is device memory kept free of work, for the framework's
	// own allocations and fragmentation.
	VRAMReserve int64
	// VRAMLimit caps the budget below what the device offers; 0 for no cap.
	VRAMLimit int64
	// BudgetRefresh is how often Run reads the device's memory again: under
	// AdmitVRAM the budget becomes free memory plus what the model's batches
	// hold (gpu.WorkingSet), less VRAMReserve, capped by VRAMLimit, so that
	// another process taking memory on the same GPU shrinks it and giving it
	// back grows it. A change is made only when two readings in a row agree
	// on it, within an eighth of the reserve (at least 1 MiB), and differ by
	// more than that from the budget in force. A shrink below what is in
	// flight admits nothing new until in-flight work is under it; a message
	// larger than the budget now but not than the largest the device could
	// give (Subscriber.MaxBudget) waits, and the admit timeout releases it.
	// Under every strategy each reading also sets the device memory gauges.
	// At least 100ms; negative turns the refresh off, leaving the budget New
	// read.
	BudgetRefresh time.Duration

	// Prefetch bounds messages received but not yet started, independently
	// of how many run at once. Fewer wait while they start slowly: as many
	// as start within half of AdmitTimeout at their recent rate, at least
	// one (receiving.prefetchNow).
	Prefetch int
	// MaxInflight bounds messages held in total (waiting and running).
	// Under AdmitNone it is the only bound: 10 makes the classic prefetch-10
	// consumer.
	MaxInflight int
	// MaxBatch is the most messages packed into one device batch.
	MaxBatch int
	// MaxBatchBytes caps a batch's estimated working memory under the vram
	// strategy: a batch goes when it reaches it. Zero is a quarter of the
	// budget as it is then (see BudgetRefresh), so several batches are on
	// the device at once and one can start, paying its fixed launch time,
	// while others work; larger batches make fewer SQS requests per message
	// but leave the device idle during launches. A single message above it
	// still runs, alone.
	MaxBatchBytes int64
	// MaxBatchDelay is how long a batch waits for more messages after its
	// first.
	MaxBatchDelay time.Duration

	// WaitTime is the long-poll wait, whole seconds, at most 20s (the SQS
	// maximum).
	WaitTime time.Duration
	// Visibility is the visibility timeout set on receive and on every
	// extension; heartbeats run every third of it. Whole seconds, 3s to 12h.
	Visibility time.Duration
	// MaxHold is how long a message may be held in all, after which its lease
	// is no longer extended; from Visibility to 12h (the SQS limit).
	MaxHold time.Duration
	// AdmitTimeout is the backpressure bound: a message not admitted this long
	// after receipt is handed back for another consumer (a fresh copy, at no
	// cost to its receive count); below MaxHold.
	AdmitTimeout time.Duration
	// OperatorProbe is how often one message runs as a probe while the model
	// needs an operator (fault.ErrNeedsOperator: a spent quota, a refused
	// key): when it gets through, work resumes. 1s to 12h.
	OperatorProbe time.Duration
	// InferenceTimeout bounds one batch on the device; below MaxHold.
	InferenceTimeout time.Duration
	// RetryDelay is the visibility given to a message released after a
	// transient failure, doubled per receive, capped at 15m.
	RetryDelay time.Duration
	// CancelCheckTTL is how long an answer to "is this job cancelled?" is
	// kept before the job's cancel record is read again (a job found
	// cancelled stays so): the payload bucket is read at most once per job
	// per CancelCheckTTL, and a chunk received up to this long after its
	// job's cancel may still run. 100ms to 10m.
	CancelCheckTTL time.Duration
	// ShutdownGrace is how long running batches may finish after shutdown
	// begins; the rest are released. Keep it under what the platform waits
	// after SIGTERM (ECS: 30s by default).
	ShutdownGrace time.Duration
	// MaxMessageBytes is the largest result message sent, 1 KiB to 1 MiB; the
	// default is what every SQS queue accepts (up to 1 MiB where the queue
	// allows it).
	MaxMessageBytes int
	// MaxResultBytes bounds the encoded result of one message, however
	// many items it holds: a larger one is dead-lettered as
	// result_too_large rather than stored. At most (and by default)
	// job.MaxResultBytes, which the publisher reads no more of.
	MaxResultBytes int

	// TaskProtection, when set, keeps the ECS task protected from scale-in
	// while it holds messages, through the ECS agent; nil for none.
	TaskProtection TaskProtection
	// TaskProtectionExpiry is how long one protection lasts unless renewed;
	// it is renewed at half of it while messages are held, so it runs out on
	// its own within this time if the subscriber dies. 1m to 48h.
	TaskProtectionExpiry time.Duration
	// TaskProtectionMaxHold is the longest protection stays on without a
	// break: after it, protection goes off for two minutes whatever is held,
	// since ECS never stops a protected task, for a deployment either, and a
	// subscriber under steady load would otherwise never be replaced. 1m to
	// 48h.
	TaskProtectionMaxHold time.Duration

	// EstimateCorrectionMax caps the factor vram admission multiplies the
	// model's estimates by after running out of memory (correction.go): 1
	// turns the correction off. 1 to 4; default 2.
	EstimateCorrectionMax float64

	// StateFile, when set, keeps what was learned (the batch size that fits)
	// across restarts.
	StateFile string
	// BatchLimitProbeAfter is how many full batches in a row must run at a
	// batch limit lowered by an OOM before it is probed one step higher
	// (+1 or +25%, up to MaxBatch); the run doubles after each probe that
	// runs out of memory, up to 64 times this. A budget increase probes at
	// the next full batch. Negative: the limit never grows back.
	BatchLimitProbeAfter int

	// Tenants are the tenant names results are counted under in
	// vramq_subscriber_tenant_results_sent_total, as the publisher names
	// them (an API key's name, or tenant.OfKey for an unnamed key). The
	// vramq-tenant attribute is whatever the message's sender wrote, so a
	// name not listed here counts as "other tenants": the labels are this
	// fixed set, not what arrives on the queue. Each must be a valid name
	// (tenant.Valid).
	Tenants []string

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // default: a private registry
}

// DefaultConfig is the configuration a zero Config takes, field by field:
// every default lives here, and cmd/subscriber's flags start from it.
// docs/configuration.md lists the values, with the flags that set them.
// The queues, model, device, logger and registry have none; MaxBatchBytes
// and VRAMLimit are 0 (a quarter of the budget, and no cap).
func DefaultConfig() Config {
	return Config{
		Admission:             AdmitVRAM,
		Count:                 4,
		VRAMReserve:           256 << 20,
		BudgetRefresh:         2 * time.Second,
		Prefetch:              20,
		MaxInflight:           100,
		MaxBatch:              8,
		MaxBatchDelay:         10 * time.Millisecond,
		WaitTime:              job.MaxLongPoll,
		Visibility:            30 * time.Second,
		MaxHold:               15 * time.Minute,
		AdmitTimeout:          time.Minute,
		OperatorProbe:         5 * time.Minute,
		InferenceTimeout:      2 * time.Minute,
		RetryDelay:            5 * time.Second,
		CancelCheckTTL:        5 * time.Second,
		ShutdownGrace:         25 * time.Second,
		MaxMessageBytes:       256 << 10,
		MaxResultBytes:        job.MaxResultBytes,
		TaskProtectionExpiry:  time.Hour,
		TaskProtectionMaxHold: 30 * time.Minute,
		BatchLimitProbeAfter:  32,
		EstimateCorrectionMax: 2,
	}
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	config.OrDefault(&c.Admission, d.Admission)
	config.OrDefault(&c.Count, d.Count)
	config.OrDefault(&c.VRAMReserve, d.VRAMReserve)
	config.OrDefault(&c.BudgetRefresh, d.BudgetRefresh)
	config.OrDefault(&c.Prefetch, d.Prefetch)
	config.OrDefault(&c.MaxInflight, d.MaxInflight)
	config.OrDefault(&c.MaxBatch, d.MaxBatch)
	config.OrDefault(&c.MaxBatchDelay, d.MaxBatchDelay)
	config.OrDefault(&c.WaitTime, d.WaitTime)
	config.OrDefault(&c.Visibility, d.Visibility)
	config.OrDefault(&c.MaxHold, d.MaxHold)
	config.OrDefault(&c.AdmitTimeout, d.AdmitTimeout)
	config.OrDefault(&c.OperatorProbe, d.OperatorProbe)
	config.OrDefault(&c.InferenceTimeout, d.InferenceTimeout)
	config.OrDefault(&c.RetryDelay, d.RetryDelay)
	config.OrDefault(&c.CancelCheckTTL, d.CancelCheckTTL)
	config.OrDefault(&c.ShutdownGrace, d.ShutdownGrace)
	config.OrDefault(&c.MaxMessageBytes, d.MaxMessageBytes)
	config.OrDefault(&c.MaxResultBytes, d.MaxResultBytes)
	config.OrDefault(&c.TaskProtectionExpiry, d.TaskProtectionExpiry)
	config.OrDefault(&c.TaskProtectionMaxHold, d.TaskProtectionMaxHold)
	config.OrDefault(&c.BatchLimitProbeAfter, d.BatchLimitProbeAfter)
	config.OrDefault(&c.EstimateCorrectionMax, d.EstimateCorrectionMax)
	config.OrDefault(&c.Logger, slog.Default())
	config.OrDefault(&c.Registerer, prometheus.Registerer(prometheus.NewRegistry()))
	if typedNil(c.Payloads) {
		c.Payloads = nil
	}
}

// minBudgetRefresh bounds how often the device is asked for its memory: a
// query through NVML takes up to a millisecond, and a change takes two
// readings anyway, so reading more often only costs.
const minBudgetRefresh = 100 * time.Millisecond

// FieldError is one problem Validate found, with the name of the Config
// field it is about (e.g. "MaxHold"), so that a command can name its own flag for it.
type FieldError = config.FieldError

// Validate reports every problem with c (after defaults), joined; each is a
// *FieldError naming the field it is about (for a bound set by another
// field, the one bounded: AdmitTimeout for "below max hold").
func (c *Config) Validate() error {
	var problems config.Problems
	bad := problems.Add
	if c.Queue == nil {
		bad("Queue", "no work queue")
	}
	if c.Results == nil {
		bad("Results", "no results queue")
	}
	if c.DLQ == nil {
		bad("DLQ", "no dead-letter queue: poison messages need somewhere to go")
	}
	if _, ok := c.Payloads.(Lister); c.Events != nil && !ok {
		bad("Events", "completion events need a payload bucket that can list (-payload-bucket)")
	}
	if c.Backend == nil {
		bad("Backend", "no backend")
	}
	if c.Backend != nil {
		// One owner for the memory that bounds the backend.
		switch owned := memoryOf(Config{Backend: c.Backend}) != nil; {
		case owned && c.Device != nil:
			bad("Device", "the backend owns the memory that bounds it (backend.MemoryOwner): leave Device unset")
		case !owned && c.Device == nil:
			bad("Device", "no device")
		}
	}
	if !c.Admission.valid() {
		bad("Admission", "admission %q: want vram, count or none", c.Admission)
	}
	config.AtLeast(&problems, "Count", "count", c.Count, 1)
	if c.VRAMReserve < 0 {
		bad("VRAMReserve", "VRAM reserve %d: must not be negative", c.VRAMReserve)
	}
	if c.VRAMLimit < 0 {
		bad("VRAMLimit", "VRAM limit %d: must not be negative", c.VRAMLimit)
	}
	if c.BudgetRefresh > 0 && c.BudgetRefresh < minBudgetRefresh {
		bad("BudgetRefresh", "budget refresh %v: want at least %v, or negative for none", c.BudgetRefresh, minBudgetRefresh)
	}
	if c.OperatorProbe < time.Second || c.OperatorProbe > job.MaxVisibility {
		bad("OperatorProbe", "operator probe %v: want 1s to 12h", c.OperatorProbe)
	}
	config.AtLeast(&problems, "Prefetch", "prefetch", c.Prefetch, 1)
	config.AtLeast(&problems, "MaxInflight", "max in-flight", c.MaxInflight, 1)
	config.AtLeast(&problems, "MaxBatch", "max batch", c.MaxBatch, 1)
	if !(c.EstimateCorrectionMax >= 1 && c.EstimateCorrectionMax <= 4) { // NaN too
		bad("EstimateCorrectionMax", "estimate correction max %v: want 1 to 4 (1: off)", c.EstimateCorrectionMax)
	}
	if c.MaxBatchBytes < 0 {
		bad("MaxBatchBytes", "max batch bytes %d is negative", c.MaxBatchBytes)
	}
	if c.MaxBatchDelay < 0 {
		bad("MaxBatchDelay", "max batch delay %v is negative", c.MaxBatchDelay)
	}
	if c.WaitTime < 0 || c.WaitTime > job.MaxLongPoll || c.WaitTime%time.Second != 0 {
		bad("WaitTime", "wait time %v: want whole seconds from 0 to 20s", c.WaitTime)
	}
	if c.Visibility < 3*time.Second || c.Visibility > job.MaxVisibility || c.Visibility%time.Second != 0 {
		bad("Visibility", "visibility timeout %v: want whole seconds from 3s to 12h", c.Visibility)
	}
	if c.MaxHold > job.MaxVisibility || c.MaxHold < c.Visibility {
		bad("MaxHold", "max hold %v: want from the visibility timeout (%v) to 12h", c.MaxHold, c.Visibility)
	}
	if c.AdmitTimeout <= 0 || c.AdmitTimeout >= c.MaxHold {
		bad("AdmitTimeout", "admit timeout %v: want positive and below max hold %v", c.AdmitTimeout, c.MaxHold)
	}
	if c.InferenceTimeout <= 0 || c.InferenceTimeout >= c.MaxHold {
		bad("InferenceTimeout", "inference timeout %v: want positive and below max hold %v", c.InferenceTimeout, c.MaxHold)
	}
	if c.RetryDelay < 0 {
		bad("RetryDelay", "retry delay %v: must not be negative", c.RetryDelay)
	}
	if c.CancelCheckTTL < 100*time.Millisecond || c.CancelCheckTTL > 10*time.Minute {
		bad("CancelCheckTTL", "cancel check TTL %v: want 100ms to 10m", c.CancelCheckTTL)
	}
	if c.ShutdownGrace < 0 {
		bad("ShutdownGrace", "shutdown grace %v: must not be negative", c.ShutdownGrace)
	}
	if c.MaxMessageBytes < job.MinMessageBytes || c.MaxMessageBytes > job.MaxMessageBytes {
		bad("MaxMessageBytes", "max message bytes %d: want 1 KiB to 1 MiB", c.MaxMessageBytes)
	}
	if c.MaxResultBytes < 1 || c.MaxResultBytes > job.MaxResultBytes {
		bad("MaxResultBytes", "max result bytes %d: want 1 to %d", c.MaxResultBytes, job.MaxResultBytes)
	}
	if c.TaskProtectionExpiry < time.Minute || c.TaskProtectionExpiry > MaxTaskProtection {
		bad("TaskProtectionExpiry", "task protection expiry %v: want 1m to 48h", c.TaskProtectionExpiry)
	}
	for _, name := range c.Tenants {
		if !tenant.Valid(name) {
			bad("Tenants", "tenant %q: want 1 to %d ASCII letters, digits or punctuation", name, tenant.MaxLen)
		}
	}
	if c.TaskProtectionMaxHold < time.Minute || c.TaskProtectionMaxHold > MaxTaskProtection {
		bad("TaskProtectionMaxHold", "task protection max hold %v: want 1m to 48h", c.TaskProtectionMaxHold)
	}
	return problems.Err()
}
