// Package strategies is `bench strategies`: every admission strategy of the
// subscriber on one workload and one kind of simulated device, measured
// against the offline bound. Package sweep runs the same scenarios over many
// workload shapes.
package strategies

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/harness/cmd/bench/report"
	"github.com/vramq/vramq/harness/cmd/bench/sqsenv"
	"github.com/vramq/vramq/harness/cmd/bench/stats"
	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/bert"
	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

// strategy is one way to run the subscriber on the workload.
type strategy struct {
	Name     string
	Settings string
	config   subscriber.Config
}

// Outcome is what one strategy measured.
type Outcome struct {
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
	// RetriedReceives are receives the SDK retried (see Client).
	RetriedReceives int64    `json:"retried_receives"`
	Samples         []sample `json:"-"`
	// AllRuns are the throughputs of every run, in order; the figures are
	// those of the median run.
	AllRuns []float64 `json:"all_runs_messages_per_second"`
	// Completed and LargeCompleted are the messages, and the large ones
	// (true cost at least a quarter of the budget), each subscriber deleted.
	Completed      []int64 `json:"completed_by_subscriber"`
	LargeCompleted []int64 `json:"large_completed_by_subscriber"`
}

type sample struct {
	T        float64 // seconds since the subscriber started
	Used     int64   // device working memory allocated
	Admitted int64   // estimated working memory of the messages admitted
}

// Run is `bench strategies`: every strategy on one workload and one kind of
// simulated device, against the offline bound.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench strategies", flag.ContinueOnError)
	fs.SetOutput(stderr)
	p, sf := Flags(fs)
	repeat := fs.Int("repeat", 3, "runs of each strategy; the run of median throughput is reported")
	out := fs.String("out", "bench", "folder for results.md, results.json and the plots (empty: none)")
	verbose := fs.Bool("v", false, "subscriber logs to stderr")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if err := sf.Apply(p); err != nil {
		return err
	}
	client, retries, err := Client(ctx)
	if err != nil {
		return err
	}
	sc, err := Prepare(*p, *sf.Shuffle)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "bench: %d messages (%s), budget %s x %d subscriber(s), launch %v, throughput %s/s, estimate error %s; "+
		"offline bound %.1f messages/s (%s)\n",
		p.Messages, p.Shape, bytesize.Format(p.Budget), p.Subscribers, p.Launch, bytesize.Format(int64(p.Throughput)),
		p.EstimateError, sc.Bound.MessagesPerS, sc.Bound.Binding)
	rep := strategyReport{Params: sc.p, Bound: sc.Bound, Command: "bin/bench strategies " + strings.Join(args, " "),
		Date: time.Now().UTC().Format("2006-01-02"), Machine: report.Machine()}
	rep.Results, err = sc.Measure(ctx, client, retries, *repeat, *verbose, stderr)
	if err != nil {
		return err
	}
	writeStrategyTable(stdout, rep)
	if *out == "" {
		return nil
	}
	return writeStrategyReport(*out, rep)
}

// Client is the SQS client of the strategy runs, with the SDK's
// retried receives counted, not printed: a retried receive whose first
// answer the emulator had already sent strands up to ten messages until
// their visibility timeout, which shows as a stall in a run.
func Client(ctx context.Context) (*sqs.Client, *atomic.Int64, error) {
	retries := new(atomic.Int64)
	cfg, err := awsconfig.Load(ctx, slog.New(sqsenv.RetryCounter{Handler: slog.DiscardHandler, N: retries}))
	if err != nil {
		return nil, nil, err
	}
	return sqs.NewFromConfig(cfg), retries, nil
}

// Scenario is one workload on one kind of device, ready to run every
// strategy on.
type Scenario struct {
	p      Params
	works  []job.Work
	costs  []int64 // true costs, what the device allocates
	large  map[job.Key]bool
	Bound  Bound
	ecfg   refembed.Config
	timing timed.Timing
	// newModel loads the timed model onto a device: the reference
	// model's memory, or the BERT's (-bert).
	newModel   func(gpu.Allocator) (*timed.Model, error)
	est        EstimateError
	strategies []strategy
}

// Params is the run's parameters, completed by Prepare.
func (sc Scenario) Params() Params { return sc.p }

// Works are the workload's messages, in the order they are sent.
func (sc Scenario) Works() []job.Work { return sc.works }

// shapeWorks makes the messages of a workload shape and says what it is.
func shapeWorks(shape string, messages int) ([]job.Work, string, error) {
	switch shape {
	case "heavy":
		spec := workload.HeavyTailed("bench", messages)
		return spec.Works(), spec.String(), nil
	case "sentences":
		spec := workload.Sentences("bench", messages)
		return spec.Works(), spec.String() + " (`internal/testenv/workload.Sentences`)", nil
	}
	n, err := strconv.Atoi(strings.TrimPrefix(shape, "1-in-"))
	if !strings.HasPrefix(shape, "1-in-") || err != nil || n < 1 {
		return nil, "", fmt.Errorf("%w: workload shape %q: want 1-in-N (N >= 1), heavy or sentences", cli.ErrUsage, shape)
	}
	spec := workload.Mixed("bench", messages)
	spec.LargeEvery = n
	return spec.Works(), fmt.Sprintf("the bimodal mix (`internal/testenv/workload.Mixed`): one message in %d large (32 items of 600 "+
		"words), the others small (8 items of 24 words)", n), nil
}

// Prepare makes the workload of p, in a seeded random order when shuffle is
// set, and the strategies p names, and works out their offline bound.
func Prepare(p Params, shuffle bool) (Scenario, error) {
	sc := Scenario{ecfg: refembed.DefaultConfig(), timing: timed.Timing{Launch: p.Launch, Throughput: p.Throughput}}
	works, desc, err := shapeWorks(p.Shape, p.Messages)
	if err != nil {
		return sc, err
	}
	p.ShapeDesc = desc
	if shuffle {
		// Mixed puts a large message every LargeEvery-th, so any ten in a
		// row hold exactly two: a consumer taking ten at once would never
		// see three. Real traffic is not so regular; the same messages in
		// a seeded random order are.
		rng := rand.New(rand.NewPCG(1, 2))
		rng.Shuffle(len(works), func(i, j int) { works[i], works[j] = works[j], works[i] })
	}
	sc.newModel = func(mem gpu.Allocator) (*timed.Model, error) { return timed.New(sc.ecfg, sc.timing, mem) }
	p.Model = "the reference model"
	if p.BERTDir != "" {
		e, err := bert.Open(p.BERTDir, nil)
		if err != nil {
			return sc, fmt.Errorf("%w: -bert: %v", cli.ErrUsage, err)
		}
		sc.newModel = func(mem gpu.Allocator) (*timed.Model, error) {
			return timed.NewFor(e, e.Model().Dim(), sc.timing, mem)
		}
		p.Model = e.Name()
	}
	probe, err := sc.newModel(nil)
	if err != nil {
		return sc, err
	}
	sc.costs = make([]int64, len(works))
	sc.large = map[job.Key]bool{}
	p.SmallCost, p.LargeCost = math.MaxInt64, 0
	for i, w := range works {
		c := probe.Cost(w.Items)
		sc.costs[i] = c
		p.SmallCost, p.LargeCost = min(p.SmallCost, c), max(p.LargeCost, c)
		if c >= p.Budget/4 {
			sc.large[job.Key{JobID: w.JobID, Chunk: w.Chunk}] = true
		}
		if c > p.Budget {
			return sc, fmt.Errorf("%w: message %d needs %s, more than the budget %s", cli.ErrUsage, i, bytesize.Format(c),
				bytesize.Format(p.Budget))
		}
	}
	sc.works = works
	sc.est, _ = ParseEstimateError(p.EstimateError) // apply checked it
	sc.Bound = offlineBoundN(sc.costs, sc.timing, p.Budget, p.Subscribers)
	sc.strategies, err = strategiesFor(p, sc.costs)
	sc.p = p
	return sc, err
}

// Measure runs every strategy repeat times, the strategies taking turns
// (the emulator stalls now and then, see RetriedReceives), and returns the
// run of median throughput of each, with every run's throughput.
func (sc Scenario) Measure(ctx context.Context, client *sqs.Client, retries *atomic.Int64, repeat int, verbose bool,
	stderr io.Writer) ([]Outcome, error) {
	runs := make([][]Outcome, len(sc.strategies))
	for r := range repeat {
		for i, s := range sc.strategies {
			before := retries.Load()
			o, err := runStrategy(ctx, client, s, sc, verbose, stderr)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.Name, err)
			}
			o.RetriedReceives = retries.Load() - before
			o.OfBound = o.MessagesPerS / sc.Bound.MessagesPerS
			runs[i] = append(runs[i], o)
			fmt.Fprintf(stderr, "bench: %s run %d/%d %-10s %6.1f messages/s (%.0f%% of bound), %d device OOMs, %d redeliveries, "+
				"%d DLQ, p50 %.2fs p99 %.2fs, %.3f SQS requests/message, large completed %v\n",
				sc.p.Shape, r+1, repeat, o.Name, o.MessagesPerS, 100*o.OfBound, o.DeviceOOMs, o.Redeliveries, o.DeadLettered,
				o.P50, o.P99, o.RequestsPerM, o.LargeCompleted)
		}
	}
	var out []Outcome
	for _, rs := range runs {
		all := make([]float64, len(rs))
		for i, o := range rs {
			all[i] = o.MessagesPerS
		}
		slices.SortFunc(rs, func(a, b Outcome) int { return cmp.Compare(a.MessagesPerS, b.MessagesPerS) })
		med := rs[len(rs)/2]
		med.AllRuns = all
		out = append(out, med)
	}
	return out, nil
}

// strategiesFor returns the strategies named in p.Runs, configured as the
// issue that asked for them describes: none with a prefetch of 10 and no
// limit; count with N=1 (the "prefetch = 1" fix); count with N tuned for the
// average message of the workload; and vram.
func strategiesFor(p Params, costs []int64) ([]strategy, error) {
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
			settings = fmt.Sprintf("admission=count, N=%d (budget %s / average message %s)", nAvg, bytesize.Format(p.Budget),
				bytesize.Format(avg))
		case "vram-plain":
			// The byte cap off, and with it launch-ahead (only a message
			// that fills a batch on its own launches ahead): vram batching
			// as count and none batch, so that the only difference from
			// them is admission.
			c.Admission, c.MaxBatchBytes = subscriber.AdmitVRAM, math.MaxInt64
			settings = fmt.Sprintf("admission=vram, budget %s, no batch byte cap, no launch-ahead (batching as count and none)",
				bytesize.Format(p.Budget))
		case "vram":
			c.Admission, c.MaxBatchBytes = subscriber.AdmitVRAM, p.MaxBatchBytes
			settings = fmt.Sprintf("admission=vram, budget %s, batch byte cap %s, launch-ahead", bytesize.Format(p.Budget),
				bytesize.Format(p.MaxBatchBytes))
			if p.MaxBatchBytes == 0 {
				settings = fmt.Sprintf("admission=vram, budget %s, batch byte cap a quarter of the budget (%s, the default), "+
					"launch-ahead", bytesize.Format(p.Budget), bytesize.Format(p.Budget/4))
			}
		default:
			return nil, fmt.Errorf("%w: unknown strategy %q: want none, count-1, count-avg, vram-plain or vram", cli.ErrUsage, name)
		}
		out = append(out, strategy{Name: name, Settings: settings, config: c})
	}
	return out, nil
}

// runStrategy sends the workload to fresh queues, runs sc.p.Subscribers
// subscribers with s, each on its own simulated device, until every message
// has a result or is dead-lettered, and measures them.
func runStrategy(ctx context.Context, client *sqs.Client, s strategy, sc Scenario, verbose bool, stderr io.Writer) (Outcome, error) {
	p, works := sc.p, sc.works
	o := Outcome{Name: s.Name, Settings: s.Settings}
	prefix := fmt.Sprintf("bench-%s-%d-", s.Name, time.Now().UnixNano()%1e9)
	// A short visibility timeout bounds the stall when the emulator
	// strands a receive (see Client); heartbeats keep longer batches.
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

	type worker struct {
		dev   *gpu.Sim
		model *timed.Model
		reg   *prometheus.Registry
		rq    *recordingQueue
		sub   *subscriber.Subscriber
	}
	rec := &receipts{first: map[job.Key]time.Time{}}
	ws := make([]worker, p.Subscribers)
	for i := range ws {
		w := &ws[i]
		// The device holds the weights and the budget, so the vram budget is
		// exactly p.Budget and the other strategies run on the same memory.
		weights, err := sc.newModel(nil)
		if err != nil {
			return o, err
		}
		w.dev = gpu.NewSim(weights.Weights() + p.Budget + 1)
		w.model, err = sc.newModel(w.dev)
		if err != nil {
			return o, err
		}
		defer w.model.Close()
		w.reg = prometheus.NewRegistry()
		w.rq = &recordingQueue{Queue: sqsqueue.New(client, urls.Work), rec: rec, large: sc.large, keys: map[string]job.Key{}}
		cfg := s.config
		cfg.Queue, cfg.Results, cfg.DLQ = w.rq, sqsqueue.New(client, urls.Results), sqsqueue.New(client, urls.DLQ)
		// Admission works with the estimate, wrong by -estimate-error; the
		// device allocates the true cost.
		cfg.Backend, cfg.Device, cfg.Registerer = backend.InProcess{Model: sc.est.model(w.model)}, w.dev, w.reg
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
			cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("subscriber", i+1)
		}
		w.sub, err = subscriber.New(cfg)
		if err != nil {
			return o, err
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	runErr := make(chan error, len(ws))
	for _, w := range ws {
		go func() { runErr <- w.sub.Run(runCtx) }()
	}

	// Device memory in use over time, every 10 ms: the mean over the
	// devices when there are several.
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			var used, admitted int64
			for _, w := range ws {
				info, _ := w.dev.MemInfo()
				used += info.Used - w.model.Weights()
				admitted += int64(gathered(w.reg, "vramq_subscriber_inflight_bytes", "")["*"])
			}
			n := int64(len(ws))
			o.Samples = append(o.Samples, sample{T: time.Since(start).Seconds(), Used: used / n, Admitted: admitted / n})
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	done, finished, err := collect(ctx, client, urls, len(works))
	elapsed := finished.Sub(start)
	stop()
	<-sampleDone
	for range ws {
		if rerr := <-runErr; rerr != nil && !errors.Is(rerr, context.Canceled) {
			return o, fmt.Errorf("subscriber: %w", rerr)
		}
	}
	if err != nil {
		return o, err
	}

	o.Seconds = elapsed.Seconds()
	o.MessagesPerS = float64(len(done.results)) / o.Seconds
	o.DeadLettered = done.dead
	o.Duplicates = done.duplicates
	lat := make([]float64, 0, len(done.results))
	for k, at := range done.results {
		if first, ok := rec.firstReceipt(k); ok {
			lat = append(lat, at.Sub(first).Seconds())
		}
	}
	o.P50, o.P99 = stats.Percentile(lat, 0.50), stats.Percentile(lat, 0.99)
	o.Requests = map[string]float64{}
	var busy time.Duration
	var ledgers []string
	for i, w := range ws {
		o.DeviceOOMs += w.dev.OOMs()
		o.OOMRetries += gathered(w.reg, "vramq_subscriber_oom_retries_total", "")["*"]
		o.Redeliveries += int(gathered(w.reg, "vramq_subscriber_messages_redelivered_total", "")["*"])
		for action, n := range gathered(w.reg, "vramq_subscriber_sqs_requests_total", "action") {
			o.Requests[action] += n
		}
		busy += w.model.Busy()
		l := w.sub.Ledger()
		ledger := fmt.Sprintf("received %d = deleted %d + released %d + lost %d + abandoned %d", l.Received, l.Deleted,
			l.Released, l.Lost, l.Abandoned)
		if len(ws) > 1 {
			ledger = fmt.Sprintf("subscriber %d: %s", i+1, ledger)
		}
		ledgers = append(ledgers, ledger)
		n, large := w.rq.completed()
		o.Completed, o.LargeCompleted = append(o.Completed, n), append(o.LargeCompleted, large)
	}
	o.Ledger = strings.Join(ledgers, "; ")
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
	o.Utilisation = busy.Seconds() / o.Seconds / float64(len(ws))
	return o, nil
}

type collected struct {
	results    map[job.Key]time.Time // when each chunk's first result was read
	dead       int
	duplicates int
}

// collect reads results (and the DLQ when results stall) until every one of
// n messages is accounted for, and returns when the last one was.
func collect(ctx context.Context, client *sqs.Client, urls localstack.URLs, n int) (collected, time.Time, error) {
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

const benchVisibility = 5 * time.Second
