package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/jobq"
	"github.com/vramq/vramq/internal/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/model/bert"
	"github.com/vramq/vramq/subscriber"
)

// strategyParams is one run of `bench strategies`: the workload, the device
// and its timing, shared by every strategy.
type strategyParams struct {
	Messages   int           `json:"messages"`
	LargeEvery int           `json:"large_every"`
	Budget     int64         `json:"budget_bytes"`
	Launch     time.Duration `json:"launch_ns"`
	Throughput float64       `json:"throughput_bytes_per_second"`
	MaxBatch   int           `json:"max_batch"`
	// MaxBatchBytes is vram's batch cap; 0 is the subscriber's default.
	MaxBatchBytes int64    `json:"max_batch_bytes,omitempty"`
	Shuffled      bool     `json:"shuffled"`
	SmallCost     int64    `json:"small_message_bytes"`
	LargeCost     int64    `json:"large_message_bytes"`
	Runs          []string `json:"strategies"`
	// Model is what the timed model costs like: the reference model, or
	// a BERT model directory's (-bert).
	Model string `json:"model,omitempty"`
}

// strategy is one way to run the subscriber on the workload.
type strategy struct {
	Name     string
	Settings string
	config   subscriber.Config
}

// outcome is what one strategy measured.
type outcome struct {
	Name         string  `json:"name"`
	Settings     string  `json:"settings"`
	Seconds      float64 `json:"seconds"`
	MessagesPerS float64 `json:"messages_per_second"`
	OfBound      float64 `json:"of_bound"` // throughput / the offline bound's
	// DeviceOOMs are the allocations the simulated device refused;
	// OOMRetries the batches the subscriber split or ran alone for it.
	DeviceOOMs   int64   `json:"device_ooms"`
	OOMRetries   float64 `json:"oom_retries"`
	Redeliveries int     `json:"redeliveries"` // receives of a message already received
	DeadLettered int     `json:"dead_lettered"`
	Duplicates   int     `json:"duplicate_results"`
	// Latency is from a message's first receipt by the subscriber to its
	// result being read off the results queue.
	P50 float64 `json:"latency_p50_seconds"`
	P99 float64 `json:"latency_p99_seconds"`
	// Requests are the subscriber's SQS requests by action.
	Requests     map[string]float64 `json:"requests"`
	RequestsPerM float64            `json:"requests_per_message"`
	// WorkPerM counts only the work queue's requests (receive, delete,
	// visibility), not results sent.
	WorkPerM    float64 `json:"work_queue_requests_per_message"`
	PeakUsed    int64   `json:"peak_device_bytes"`
	MeanUse     float64 `json:"mean_budget_use"` // mean device working memory / budget
	Utilisation float64 `json:"device_utilisation"`
	Ledger      string  `json:"ledger"`
	// RetriedReceives are receives the SDK retried (see receiveRetryCounter).
	RetriedReceives int64    `json:"retried_receives"`
	Samples         []sample `json:"-"`
	// AllRuns are the throughputs of every run, in order; the figures are
	// those of the median run.
	AllRuns []float64 `json:"all_runs_messages_per_second"`
}

type sample struct {
	T        float64 // seconds since the subscriber started
	Used     int64   // device working memory allocated
	Admitted int64   // estimated working memory of the messages admitted
}

type strategyReport struct {
	Params  strategyParams `json:"params"`
	Bound   bound          `json:"bound"`
	Results []outcome      `json:"results"`
	Command string         `json:"command"`
	Date    string         `json:"date"`
	Machine string         `json:"machine"`
}

func runStrategies(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench strategies", flag.ContinueOnError)
	fs.SetOutput(stderr)
	p := strategyParams{}
	budget := gpu.Bytes(40 << 20)
	throughput := gpu.Bytes(gpu.DefaultTiming().Throughput)
	fs.IntVar(&p.Messages, "messages", 1000, "work messages in the workload (the bimodal mix)")
	fs.IntVar(&p.LargeEvery, "large-every", 5, "every Nth message is a large one")
	fs.Var(&budget, "budget", "device memory for work (the vram budget; the device holds this plus the weights)")
	fs.DurationVar(&p.Launch, "launch", gpu.DefaultTiming().Launch, "timing model: fixed time per batch")
	fs.Var(&throughput, "throughput", "timing model: device throughput, bytes of working memory per second")
	fs.IntVar(&p.MaxBatch, "max-batch", 8, "most messages per batch, every strategy")
	maxBatchBytes := gpu.Bytes(0)
	fs.Var(&maxBatchBytes, "max-batch-bytes", "vram: the subscriber's -max-batch-bytes (0: its default)")
	shuffle := fs.Bool("shuffle", true, "send the workload in a seeded random order rather than a large message every -large-every-th")
	repeat := fs.Int("repeat", 3, "runs of each strategy; the run of median throughput is reported")
	only := fs.String("only", "none,count-1,count-avg,vram", "strategies to run, in order")
	out := fs.String("out", "bench", "folder for results.md, results.json and the plots (empty: none)")
	verbose := fs.Bool("v", false, "subscriber logs to stderr")
	bertDir := fs.String("bert", "", "cost like the BERT model in `DIR` (bin/genweights -bert DIR makes one), length² attention included, rather than the reference model; set -budget to fit its large messages")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	p.Budget, p.Throughput, p.MaxBatchBytes = int64(budget), float64(throughput), int64(maxBatchBytes)
	p.Runs = strings.Split(*only, ",")
	p.Shuffled = *shuffle
	timing := gpu.Timing{Launch: p.Launch, Throughput: p.Throughput}
	if err := timing.Validate(); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}

	// The SDK's retries are counted, not printed: a retried receive whose
	// first answer the emulator had already sent strands up to ten messages
	// until their visibility timeout, which shows as a stall in a run.
	var retries atomic.Int64
	cfg, err := awsconfig.Load(ctx, slog.New(retryCounter{slog.DiscardHandler, &retries}))
	if err != nil {
		return err
	}
	client := sqs.NewFromConfig(cfg)
	ecfg := gpu.DefaultEmbedConfig()
	spec := workload.Mixed("bench", p.Messages)
	spec.LargeEvery = p.LargeEvery
	works := spec.Works()
	if *shuffle {
		// Mixed puts a large message every LargeEvery-th, so any ten in a
		// row hold exactly two: a consumer taking ten at once would never
		// see three. Real traffic is not so regular; the same messages in
		// a seeded random order are.
		rng := rand.New(rand.NewPCG(1, 2))
		rng.Shuffle(len(works), func(i, j int) { works[i], works[j] = works[j], works[i] })
	}
	// newModel loads the timed model onto a device: the reference model's
	// memory, or the BERT's.
	newModel := func(mem gpu.Allocator) (*gpu.TimedModel, error) { return gpu.NewTimedModel(ecfg, timing, mem) }
	p.Model = "the reference model"
	if *bertDir != "" {
		e, err := bert.Open(*bertDir, nil)
		if err != nil {
			return fmt.Errorf("%w: -bert: %v", cli.ErrUsage, err)
		}
		newModel = func(mem gpu.Allocator) (*gpu.TimedModel, error) {
			return gpu.NewTimedModelFor(e, e.Model().Dim(), timing, mem)
		}
		p.Model = e.Name()
	}
	probe, err := newModel(nil)
	if err != nil {
		return err
	}
	costs := make([]int64, len(works))
	for i, w := range works {
		costs[i] = probe.Cost(w.Items)
	}
	for i, w := range works {
		if spec.Large(w.Chunk) {
			p.LargeCost = costs[i]
		} else {
			p.SmallCost = costs[i]
		}
	}
	b := offlineBound(costs, timing, p.Budget)
	fmt.Fprintf(stderr, "bench: %d messages, budget %s, launch %v, throughput %s/s; offline bound %.1f messages/s (%s)\n",
		p.Messages, gpu.FormatBytes(p.Budget), p.Launch, gpu.FormatBytes(int64(p.Throughput)), b.MessagesPerS, b.Binding)

	strategies, err := strategiesFor(p, costs)
	if err != nil {
		return err
	}
	rep := strategyReport{Params: p, Bound: b, Command: "bin/bench strategies " + strings.Join(args, " "),
		Date: time.Now().UTC().Format("2006-01-02"), Machine: machine()}
	// The emulator stalls now and then (see RetriedReceives), so each
	// strategy runs -repeat times, the strategies taking turns, and the run
	// of median throughput is reported, with the range.
	runs := make([][]outcome, len(strategies))
	for r := range *repeat {
		for i, s := range strategies {
			before := retries.Load()
			o, err := runStrategy(ctx, client, s, works, newModel, p, *verbose, stderr)
			if err != nil {
				return fmt.Errorf("%s: %w", s.Name, err)
			}
			o.RetriedReceives = retries.Load() - before
			o.OfBound = o.MessagesPerS / b.MessagesPerS
			runs[i] = append(runs[i], o)
			fmt.Fprintf(stderr, "bench: run %d/%d %-9s %6.1f messages/s (%.0f%% of bound), %d device OOMs, %d redeliveries, p50 %.2fs p99 %.2fs, %.3f SQS requests/message\n",
				r+1, *repeat, o.Name, o.MessagesPerS, 100*o.OfBound, o.DeviceOOMs, o.Redeliveries, o.P50, o.P99, o.RequestsPerM)
		}
	}
	for _, rs := range runs {
		all := make([]float64, len(rs))
		for i, o := range rs {
			all[i] = o.MessagesPerS
		}
		slices.SortFunc(rs, func(a, b outcome) int { return cmp.Compare(a.MessagesPerS, b.MessagesPerS) })
		med := rs[len(rs)/2]
		med.AllRuns = all
		rep.Results = append(rep.Results, med)
	}
	writeStrategyTable(stdout, rep)
	if *out == "" {
		return nil
	}
	return writeStrategyReport(*out, rep)
}

// strategiesFor returns the strategies named in p.Runs, configured as the
// issue that asked for them describes: none with a prefetch of 10 and no
// limit; count with N=1 (the "prefetch = 1" fix); count with N tuned for the
// average message of the workload; and vram.
func strategiesFor(p strategyParams, costs []int64) ([]strategy, error) {
	var sum int64
	for _, c := range costs {
		sum += c
	}
	avg := sum / int64(len(costs))
	nAvg := max(1, int(p.Budget/avg))
	var out []strategy
	for _, name := range p.Runs {
		c := subscriber.Config{MaxBatch: p.MaxBatch}
		var settings string
		switch name {
		case "none":
			c.Admission, c.Prefetch, c.MaxInflight = subscriber.AdmitNone, 10, 10
			settings = "admission=none, prefetch 10, max in flight 10"
		case "count-1":
			c.Admission, c.Count = subscriber.AdmitCount, 1
			settings = "admission=count, N=1"
		case "count-avg":
			c.Admission, c.Count = subscriber.AdmitCount, nAvg
			settings = fmt.Sprintf("admission=count, N=%d (budget %s / average message %s)", nAvg, gpu.FormatBytes(p.Budget), gpu.FormatBytes(avg))
		case "vram":
			c.Admission, c.MaxBatchBytes = subscriber.AdmitVRAM, p.MaxBatchBytes
			settings = fmt.Sprintf("admission=vram, budget %s", gpu.FormatBytes(p.Budget))
			if p.MaxBatchBytes > 0 {
				settings += fmt.Sprintf(", max batch bytes %s", gpu.FormatBytes(p.MaxBatchBytes))
			}
		default:
			return nil, fmt.Errorf("%w: unknown strategy %q: want none, count-1, count-avg or vram", cli.ErrUsage, name)
		}
		out = append(out, strategy{Name: name, Settings: settings, config: c})
	}
	return out, nil
}

// runStrategy sends the workload to fresh queues, runs a subscriber with s
// until every message has a result or is dead-lettered, and measures it.
func runStrategy(ctx context.Context, client *sqs.Client, s strategy, works []job.Work,
	newModel func(gpu.Allocator) (*gpu.TimedModel, error), p strategyParams, verbose bool, stderr io.Writer) (outcome, error) {
	o := outcome{Name: s.Name, Settings: s.Settings}
	prefix := fmt.Sprintf("bench-%s-%d-", s.Name, time.Now().UnixNano()%1e9)
	// A short visibility timeout bounds the stall when the emulator
	// strands a receive (see receiveRetryCounter); heartbeats keep longer batches.
	urls, err := localstack.Create(ctx, client, localstack.Options{Prefix: prefix, VisibilityTimeout: benchVisibility})
	if err != nil {
		return o, err
	}
	defer func() {
		if err := localstack.Delete(context.WithoutCancel(ctx), client, urls); err != nil {
			fmt.Fprintf(stderr, "bench: deleting queues %s*: %v\n", prefix, err)
		}
	}()
	if err := jobq.Send(ctx, client, urls.Work, works); err != nil {
		return o, err
	}

	// The device holds the weights and the budget, so the vram budget is
	// exactly p.Budget and the other strategies run on the same memory.
	weights, err := newModel(nil)
	if err != nil {
		return o, err
	}
	dev := gpu.NewSim(weights.Weights() + p.Budget + 1)
	model, err := newModel(dev)
	if err != nil {
		return o, err
	}
	defer model.Close()
	reg := prometheus.NewRegistry()
	rq := &recordingQueue{Queue: subscriber.NewSQSQueue(client, urls.Work), first: map[job.Key]time.Time{}}
	cfg := s.config
	cfg.Queue, cfg.Results, cfg.DLQ = rq, subscriber.NewSQSQueue(client, urls.Results), subscriber.NewSQSQueue(client, urls.DLQ)
	cfg.Model, cfg.Device, cfg.Registerer = model, dev, reg
	// Config takes a zero reserve for "the default", so the device has one
	// byte more than the budget and that byte is the reserve.
	cfg.VRAMReserve = 1
	cfg.WaitTime = 2 * time.Second
	cfg.Visibility = benchVisibility
	// The results queue takes 1 MiB messages (localstack/queues.json, as
	// infra/ makes it), so result batches may be that large.
	cfg.MaxMessageBytes = 1 << 20
	cfg.Logger = slog.New(slog.DiscardHandler)
	if verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	sub, err := subscriber.New(cfg)
	if err != nil {
		return o, err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- sub.Run(runCtx) }()

	// Device memory in use over time, every 10 ms.
	var samplesMu sync.Mutex
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			info, _ := dev.MemInfo()
			admitted := gathered(reg, "vramq_subscriber_inflight_bytes", "")["*"]
			samplesMu.Lock()
			o.Samples = append(o.Samples, sample{T: time.Since(start).Seconds(), Used: info.Used - model.Weights(), Admitted: int64(admitted)})
			samplesMu.Unlock()
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	done, finished, err := collect(ctx, client, urls, len(works), rq)
	elapsed := finished.Sub(start)
	stop()
	<-sampleDone
	if rerr := <-runErr; rerr != nil && !errors.Is(rerr, context.Canceled) {
		return o, fmt.Errorf("subscriber: %w", rerr)
	}
	if err != nil {
		return o, err
	}
	busy := model.Busy()

	o.Seconds = elapsed.Seconds()
	o.MessagesPerS = float64(len(done.results)) / o.Seconds
	o.DeviceOOMs = dev.OOMs()
	o.OOMRetries = gathered(reg, "vramq_subscriber_oom_retries_total", "")["*"]
	o.Redeliveries = int(gathered(reg, "vramq_subscriber_messages_redelivered_total", "")["*"])
	o.DeadLettered = done.dead
	o.Duplicates = done.duplicates
	lat := make([]float64, 0, len(done.results))
	for k, at := range done.results {
		if first, ok := rq.firstReceipt(k); ok {
			lat = append(lat, at.Sub(first).Seconds())
		}
	}
	o.P50, o.P99 = percentile(lat, 0.50), percentile(lat, 0.99)
	o.Requests = gathered(reg, "vramq_subscriber_sqs_requests_total", "action")
	var total, work float64
	for action, n := range o.Requests {
		total += n
		if action == "ReceiveMessage" || action == "DeleteMessageBatch" || action == "ChangeMessageVisibilityBatch" {
			work += n
		}
	}
	o.RequestsPerM, o.WorkPerM = total/float64(len(works)), work/float64(len(works))
	var sum float64
	for _, s := range o.Samples {
		o.PeakUsed = max(o.PeakUsed, s.Used)
		sum += float64(s.Used)
	}
	if len(o.Samples) > 0 {
		o.MeanUse = sum / float64(len(o.Samples)) / float64(p.Budget)
	}
	o.Utilisation = busy.Seconds() / o.Seconds
	l := sub.Ledger()
	o.Ledger = fmt.Sprintf("received %d = deleted %d + released %d + lost %d + abandoned %d", l.Received, l.Deleted, l.Released, l.Lost, l.Abandoned)
	return o, nil
}

type collected struct {
	results    map[job.Key]time.Time // when each chunk's first result was read
	dead       int
	duplicates int
}

// collect reads results (and the DLQ when results stall) until every one of
// n messages is accounted for, and returns when the last one was.
func collect(ctx context.Context, client *sqs.Client, urls localstack.URLs, n int, rq *recordingQueue) (collected, time.Time, error) {
	c := jobq.NewCollector()
	c.Visibility = 2
	out := collected{results: map[job.Key]time.Time{}}
	last := time.Now()
	stalled := time.Now()
	deadline := time.Now().Add(10 * time.Minute)
	for len(out.results)+out.dead < n {
		if time.Now().After(deadline) {
			return out, last, fmt.Errorf("%d of %d messages accounted for after 10 minutes", len(out.results)+out.dead, n)
		}
		got, err := c.Poll(ctx, client, urls.Results, 1)
		if err != nil {
			return out, last, err
		}
		now := time.Now()
		if got > 0 {
			for k := range c.Results {
				if _, ok := out.results[k]; !ok {
					out.results[k] = now
					last = now
				}
			}
			stalled = now
			continue
		}
		if now.Sub(stalled) > time.Second {
			dead, err := jobq.DrainDLQ(ctx, client, urls.DLQ)
			if err != nil {
				return out, last, err
			}
			if len(dead) > 0 {
				out.dead += len(dead)
				last = now
			}
			stalled = now
		}
	}
	out.duplicates = c.Duplicates
	return out, last, nil
}

// recordingQueue notes when each message was first received.
type recordingQueue struct {
	subscriber.Queue
	mu    sync.Mutex
	first map[job.Key]time.Time
}

func (q *recordingQueue) Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]subscriber.Message, error) {
	msgs, err := q.Queue.Receive(ctx, max, wait, visibility)
	now := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range msgs {
		chunk, cerr := strconv.Atoi(m.Attributes[job.AttrChunk])
		k := job.Key{JobID: m.Attributes[job.AttrJobID], Chunk: chunk}
		if _, seen := q.first[k]; !seen && cerr == nil {
			q.first[k] = now
		}
	}
	return msgs, err
}

func (q *recordingQueue) firstReceipt(k job.Key) (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	t, ok := q.first[k]
	return t, ok
}

// gathered sums a counter or gauge from reg by the value of label ("*" for
// all when label is empty).
func gathered(reg *prometheus.Registry, name, label string) map[string]float64 {
	out := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := "*"
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					key = lp.GetValue()
				}
			}
			out[key] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// percentile is the q-quantile of xs by the nearest-rank method; 0 for none.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func writeStrategyReport(dir string, rep strategyReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := plotBudget(filepath.Join(dir, "budget.png"), rep); err != nil {
		return err
	}
	if err := plotThroughput(filepath.Join(dir, "throughput.png"), rep); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "results.md"))
	if err != nil {
		return err
	}
	writeStrategyMarkdown(f, rep)
	return f.Close()
}

const benchVisibility = 5 * time.Second
