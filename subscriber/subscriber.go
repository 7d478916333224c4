// Package subscriber consumes an SQS work queue onto a GPU without running it
// out of memory: it long-polls in batches, holds a lease on every message it
// has (extending visibility while the message waits or runs), admits messages
// by their estimated working memory against the device's VRAM budget, packs
// admitted messages into batches, splits a batch that still runs out of
// memory, and deletes or releases every message it took.
//
// A message passes through one stage per file:
//
//	receive.go  receives, checks a job's cancel, fetches claim-checked items, decodes and estimates
//	lease.go    holds the leases: extends visibility, batches the deletes, releases and hand-backs
//	admit.go    cuts a message too large to run whole into parts, admits by estimated memory
//	            against the budget (budget.go keeps the budget)
//	batch.go    packs admitted messages into device batches
//	run.go      runs a batch on the model, splitting it on out-of-memory; pause.go holds what waits
//	            for the model, answers.go keeps what it answered
//	send.go     stores results in the bucket and sends them in shared SendMessageBatch calls
//	message.go  a received message, which ends itself once (Ack, Release, HandBack, DeadLetter,
//	            Cancel), and Subscriber.end, which turns a stage's outcome into one of those ends
//
// protector.go keeps the ECS task protected from scale-in while messages are held
// (taskprotect). message.go times each message's way through the stages above
// (vramq_subscriber_stage_seconds).
package subscriber

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber/queue"
)

// Subscriber is one consumer. Create it with New, start it with Run.
//
// It wires the stages a message passes (docs/architecture.md), each a
// goroutine or a pool of them joined by channels, and holds each stage's
// state in a struct of its own: receiving, admitting, running, sending.
type Subscriber struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	started atomic.Bool

	receiving
	admitting
	running
	sending
}

// receiving is the receive stage's state (receive.go, lease.go): it
// receives no more than there is room for, holds a lease on each message
// (lease.go), decodes and estimates it, and sends it on to admission
// through buffer.
type receiving struct {
	queue   queue.Queue
	keeper  *keeper
	protect *protector // nil without task protection
	// cancels answers whether a job is cancelled; nil without a bucket.
	cancels  *cancels
	buffer   chan *task    // received, decoded, waiting for admission
	waiting  atomic.Int64  // received and not started: fetching, buffer, admission, batcher
	roomKick chan struct{} // poked when waiting or held messages go down
	// prefetch and maxInflight bound waiting and held (Config), and
	// flow, decayed over the admit timeout, what waiting keeps to
	// (prefetchNow).
	prefetch, maxInflight int
	flow                  startFlow
	waitingGauge          prometheus.Gauge // vramq_subscriber_messages_waiting
	prefetchGauge         prometheus.Gauge // vramq_subscriber_prefetch
	fetches               sync.WaitGroup   // claim-check fetches started by the poller
	// fetchSlots bounds claim-check fetches in flight, across messages.
	fetchSlots   *semaphore.Weighted
	received     atomic.Int64
	pollErrSince atomic.Int64 // unix nanos of the first of consecutive receive errors; 0 when fine
}

// admitting is the admit stage's state (admit.go): what admission
// weighs a message by, and what it holds.
type admitting struct {
	adm *admission
	mem backend.Memory // what the budget is read from (memoryOf)
	// startBudget is the budget New read, kept for Budget under count and
	// none, which do not admit by it.
	startBudget int64
	corr        *correction  // see correction.go
	inflight    atomic.Int64 // estimated bytes admitted and not given back
	peak        atomic.Int64 // highest inflight seen
	// launcher is the model's two-phase form, nil when it has none: a
	// message waiting for admission is then launched while it waits (see
	// admit).
	launcher gpu.Launcher
}

// running is the state of the batch and run stages (batch.go,
// run.go, pause.go, answers.go): how large a batch may be, which messages run alone, and
// whether the model or the device lets anything run.
type running struct {
	state *learned // see learned.go
	// suspects are messages that were in a batch that failed for a reason
	// that may pass (a timeout, a model error). Which message caused the
	// failure is unknown, and batch-mates share a receive count and so a
	// retry delay: released together, they would come back together, be
	// batched together again, and all reach the redrive policy's
	// maxReceiveCount with the one message that hangs. So a suspect runs in a
	// batch of its own until it succeeds, and the culprit takes no other
	// message with it.
	suspects *idSet
	// classer is the model's length classes, nil when it has none: the
	// batcher then keeps one pending batch (see batcher).
	classer gpu.LengthClasser
	// batchCoster is the model's per-batch part of a cost, nil when it
	// has none: the batcher then charges it once per batch (batchShare).
	batchCoster gpu.BatchCoster
	runners     sync.WaitGroup
	loss        deviceLoss // see devicelost.go
	pause       *pause     // see pause.go
	// stopping is closed when Run's context ends: what waits for the model
	// is handed back at once rather than after the grace.
	stopping chan struct{}
}

// sending is the send stage's state (send.go, events.go) and
// what a message needs to end (message.go).
type sending struct {
	results queue.Sender
	outbox  *outbox // result sends, shared across batches
	// payloads is the payload bucket, nil when none is configured.
	payloads Payloads
	// answers keeps items' answers until their chunk's result is out
	// (answers.go); nil without a bucket that lists and deletes.
	answers *answerStore
	// settle runs the completion-event checks (events.go); nil without
	// Events.
	settle *settler
	// ends is what every message needs to end itself (message.go).
	ends *ends
	aux  sync.WaitGroup // ends run off the poller and the runners (endAsync)
}

// launched is a batch being launched ahead (gpu.Launcher): done is closed
// once l or err is set.
type launched struct {
	done chan struct{}
	l    gpu.Launched
	err  error
}

// New checks cfg, reads the device's memory to size the budget, and returns a
// Subscriber ready to Run. The budget is what the device has free now (the
// model's weights are loaded, so they are already out of it) plus what the
// model's batches hold, less the reserve, capped by VRAMLimit: free memory,
// not total, because a GPU may be shared. Run keeps it up to date (see
// Config.BudgetRefresh).
func New(cfg Config) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("subscriber config: %w", err)
	}
	memory := memoryOf(cfg)
	unit := memory.Unit()
	mem, err := memory.Read()
	if err != nil {
		return nil, fmt.Errorf("subscriber: reading device memory: %w", err)
	}
	var working int64
	caps := capabilities(cfg.Backend)
	if ws, ok := caps.(gpu.WorkingSet); ok {
		working = ws.Working()
	}
	budget := budgetFrom(cfg, mem.Free, working)
	// The largest budget the device could ever give: all of it but the
	// weights and the reserve. Never below the budget now, in case the
	// model's Weights says more than it holds.
	largest := max(mem.Total-weights(cfg.Backend)-cfg.VRAMReserve, budget)
	if cfg.VRAMLimit > 0 {
		largest = min(largest, cfg.VRAMLimit)
	}
	if cfg.Admission == AdmitVRAM && budget <= 0 && largest > 0 {
		// Full now, not for good: another process holds the memory (a shared
		// GPU; a model server busy with others' requests, or with those of a
		// predecessor that crashed). Start with nothing admitted, as the
		// refresh may find it at any time, and let the refresh grow the
		// budget as memory frees: a process that exited here would be
		// restarted into the same moment.
		cfg.Logger.Warn("the device has no room for work now: starting with nothing admitted until memory frees",
			"device", memory.Name(), "free", unit.Format(mem.Free), "reserve", unit.Format(cfg.VRAMReserve),
			"budget_max", unit.Format(largest))
		budget = 0
	}
	m := newMetrics(cfg.Registerer, unit, cfg.Tenants...)
	adm, err := newResizableAdmission(cfg.Admission, budget, largest, cfg.Count)
	if err != nil {
		return nil, fmt.Errorf("subscriber: %w (device %s: %s free, reserve %s)", err, memory.Name(),
			unit.Format(mem.Free), unit.Format(cfg.VRAMReserve))
	}
	s := &Subscriber{
		cfg: cfg,
		log: cfg.Logger,
		m:   m,
		receiving: receiving{
			queue:    countedQueue{cfg.Queue, m},
			buffer:   make(chan *task, cfg.Prefetch),
			roomKick: make(chan struct{}, 1),
			prefetch: cfg.Prefetch, maxInflight: cfg.MaxInflight, waitingGauge: m.waiting, prefetchGauge: m.prefetch,
			flow:       startFlow{tau: cfg.AdmitTimeout},
			fetchSlots: semaphore.NewWeighted(maxFetches),
		},
		admitting: admitting{adm: adm, mem: memory, startBudget: budget},
		running:   running{suspects: newIDSet(), pause: newPause(), stopping: make(chan struct{})},
		sending:   sending{results: countedSender{cfg.Results, m}},
	}
	if cfg.Payloads != nil {
		s.payloads = countedPayloads{cfg.Payloads, m}
		s.answers = newAnswerStore(s.payloads, cfg.Payloads, s.log, m)
		s.cancels = newCancels(s.payloads.Read, cfg.CancelCheckTTL, s.log)
		if cfg.Events != nil {
			s.settle = newSettler(s)
		}
	}
	if cfg.Admission == AdmitVRAM {
		if err := adm.offer(cfg.Backend); err != nil {
			return nil, fmt.Errorf("subscriber: %w", err)
		}
	}
	s.keeper = newKeeper(s.queue, m, s.log, cfg.Visibility, cfg.MaxHold, s.fullCall())
	s.keeper.onRemove = s.pokeRoom
	s.ends = &ends{keeper: s.keeper, dlq: countedSender{cfg.DLQ, m}, payloads: s.payloads, m: m, log: s.log,
		retry: backoff.Policy{First: cfg.RetryDelay, Max: job.MaxDelay}, maxMessageBytes: cfg.MaxMessageBytes,
		settling: s.jobSettling, ended: newIDSet()}
	s.outbox = s.newOutbox()
	s.launcher, _ = caps.(gpu.Launcher)
	s.classer, _ = caps.(gpu.LengthClasser)
	s.batchCoster, _ = caps.(gpu.BatchCoster)
	if cfg.TaskProtection != nil {
		s.protect = newProtector(cfg.TaskProtection, cfg.TaskProtectionExpiry, cfg.TaskProtectionMaxHold, s.keeper.held.Load, m, s.log)
		s.keeper.onHold = s.protect.poke
		s.keeper.onRemove = func() { s.pokeRoom(); s.protect.poke() }
	}
	s.state = loadLearned(cfg.StateFile, cfg.Backend.Name(), memory.Name(), cfg.MaxBatch, cfg.BatchLimitProbeAfter, s.log)
	s.state.m = m
	s.corr = newCorrection(cfg.EstimateCorrectionMax, s.log, m.estimateCorrection)
	m.budget.Set(float64(budget))
	if cfg.Admission == AdmitVRAM {
		m.budgetMax.Set(float64(adm.size))
	}
	m.deviceTotal.Set(float64(mem.Total))
	m.deviceFree.Set(float64(mem.Free))
	m.deviceProcess.Set(float64(mem.Process))
	m.batchLimit.Set(float64(s.state.batchLimit()))
	s.log.Info("subscriber ready",
		"device", memory.Name(), "simulated", memory.Simulated(),
		"memory_total", s.amount(mem.Total), "memory_free", s.amount(mem.Free),
		"memory_process", s.amount(mem.Process),
		"weights", s.amount(weights(cfg.Backend)), "reserve", s.amount(cfg.VRAMReserve),
		"budget", s.amount(budget), "budget_max", s.amount(largest), "budget_refresh", cfg.BudgetRefresh,
		"admission", string(cfg.Admission), "model", cfg.Backend.Name(), "batch_limit", s.state.batchLimit())
	if _, ok := caps.(gpu.WorkingSet); !ok && cfg.Admission == AdmitVRAM && cfg.BudgetRefresh > 0 {
		s.log.Info("the model does not report its working set (gpu.WorkingSet): "+
			"the budget is read again only while none of its batches is admitted",
			"model", cfg.Backend.Name())
	}
	return s, nil
}

// Budget is the working memory, in bytes, that admission works against now
// under the vram strategy: read from the device at New and, while Run runs,
// every BudgetRefresh. When it shrinks below what is in flight, nothing new
// is admitted until in-flight work is under it. Under count and none it is
// what the device offered at New, for information.
func (s *Subscriber) Budget() int64 {
	if s.adm.strategy == AdmitVRAM {
		return s.adm.budget()
	}
	return s.startBudget
}

// MaxBudget is the largest budget the device could give under the vram
// strategy: its total memory less the model's weights and the reserve,
// capped by VRAMLimit. A message whose estimate exceeds it can never run
// whole: it runs in parts that fit (admit.go), or is dead-lettered
// (too_large) when no item fits alone; one that only exceeds Budget waits,
// since the memory another process holds may come back.
func (s *Subscriber) MaxBudget() int64 {
	if s.adm.strategy == AdmitVRAM {
		return s.adm.size
	}
	return s.startBudget
}

// PeakBytes is the most estimated working memory admitted at once so far.
func (s *Subscriber) PeakBytes() int64 { return s.peak.Load() }

// Live returns an error when restarting the subscriber could help: it
// cannot reach its queue (every receive for the last minute has failed) or
// has lost its device (gpu.ErrDeviceLost). A model that needs an operator
// is not one: a new process would meet the same spent quota or refused key,
// receive a round of messages and hand them back, each receive counting
// towards the DLQ. A backoff (fault.ErrBackoff) is live too.
func (s *Subscriber) Live() error {
	if err := s.errDeviceLost(); err != nil {
		return err
	}
	if since := s.pollErrSince.Load(); since != 0 && time.Since(time.Unix(0, since)) > time.Minute {
		return fmt.Errorf("receives failing since %s", time.Unix(0, since).UTC().Format(time.RFC3339))
	}
	return nil
}

// Healthy is readiness: Live's errors, and an error while its model needs
// an operator (fault.ErrNeedsOperator, pause.go), when it takes no work until
// someone acts. A backoff (fault.ErrBackoff) is healthy: waiting is the
// subscriber doing its job.
func (s *Subscriber) Healthy() error {
	if err := s.errDeviceLost(); err != nil {
		return err
	}
	if err := s.pause.cause(); err != nil {
		return fmt.Errorf("subscriber: stopped until an operator acts: %w", err)
	}
	return s.Live()
}

// Run consumes until ctx ends, then shuts down: it stops receiving, hands
// unstarted messages back at once, lets running batches finish within the
// shutdown grace, releases what is still running after it, and waits for
// every delete and release to be sent. It returns nil after a clean shutdown.
// A model reporting gpu.ErrDeviceLost shuts it down the same way, and Run
// then returns an error wrapping it. Run may be called once.
func (s *Subscriber) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("subscriber: Run called twice")
	}
	// A lost device ends Run as ctx ending does (devicelost.go).
	ctx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	s.loss.arm(stopRun)
	// Work, SQS calls to end messages, and leases outlive ctx: shutdown
	// cancels them itself, in order.
	base := context.WithoutCancel(ctx)
	keeperCtx, stopKeeper := context.WithCancel(base)
	keeperDone := make(chan struct{})
	go func() {
		defer close(keeperDone)
		s.keeper.run(keeperCtx)
	}()
	// Protection follows held messages through the shutdown too: it is
	// cleared only after the last of them has ended.
	protectCtx, stopProtect := context.WithCancel(base)
	protectDone := make(chan struct{})
	go func() {
		defer close(protectDone)
		if s.protect != nil {
			s.protect.run(protectCtx)
		}
	}()
	workCtx, cancelWork := context.WithCancel(base)
	defer cancelWork()

	var stages sync.WaitGroup
	b := s.newBatcher(workCtx)
	stages.Go(func() { s.poll(ctx, workCtx) })
	stages.Go(func() { s.admit(ctx, b) })
	stages.Go(func() { b.run(ctx) })
	stages.Go(func() { s.refreshBudget(ctx) })

	<-ctx.Done()
	close(s.stopping)
	s.log.Info("shutting down: no more receives; releasing unstarted messages", "running_grace", s.cfg.ShutdownGrace)
	grace := time.AfterFunc(s.cfg.ShutdownGrace, func() {
		s.log.Warn("shutdown grace over: cancelling running batches; their messages are released")
		cancelWork()
	})
	stages.Wait()
	s.runners.Wait()
	s.aux.Wait()
	// Results still waiting for company go now, before the keeper drains
	// the deletes they lead to.
	s.outbox.close()
	s.answers.wait() // the deletes of the answers of the results just sent
	if s.settle != nil {
		// After everything that stores a result or a marker: their checks
		// run to the end, a check in a backoff tries once more at once.
		s.settle.close()
	}
	grace.Stop()
	// The refresh has stopped with the stages; a shrink still waiting
	// could only wait for work that is gone.
	s.adm.close()

	stopKeeper()
	<-keeperDone
	closeCtx, cancel := context.WithTimeout(base, 30*time.Second)
	defer cancel()
	closeErr := s.keeper.close(closeCtx)
	stopProtect()
	<-protectDone
	if s.protect != nil {
		// Even after a failed close: what is left comes back to the queue
		// on its own, and ECS should be free to stop the task.
		s.protect.clear(base)
	}
	if closeErr != nil {
		return errors.Join(s.errDeviceLost(), fmt.Errorf("subscriber shutdown: %w", closeErr))
	}
	l := s.Ledger()
	s.log.Info("subscriber stopped", "received", l.Received, "deleted", l.Deleted, "released", l.Released,
		"lost", l.Lost, "abandoned", l.Abandoned)
	return s.errDeviceLost()
}

// Ledger accounts for every message received: once Run has returned,
// Received = Deleted + Released + Lost + Abandoned.
type Ledger struct {
	Received  int64 // messages received from the work queue
	Deleted   int64 // deleted after their result or DLQ copy was sent
	Released  int64 // handed back to the queue (visibility changed)
	Lost      int64 // whose lease was gone when deleted or released: SQS redelivers them
	Abandoned int64 // whose delete or release kept failing: they come back after their timeout
}

func (s *Subscriber) Ledger() Ledger {
	k := s.keeper
	return Ledger{Received: s.received.Load(), Deleted: k.deleted.Load(), Released: k.released.Load(),
		Lost: k.lost.Load(), Abandoned: k.abandoned.Load()}
}

// isStopping reports whether Run's context has ended.
func (r *running) isStopping() bool {
	select {
	case <-r.stopping:
		return true
	default:
		return false
	}
}
