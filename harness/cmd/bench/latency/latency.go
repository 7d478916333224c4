// Package latency is `bench latency`: the subscriber's latency at light
// load against the transport's alone, and against a batch's own time
// (issue 21's target: light-load p50 within 1.5× of it). The same paced
// load (load.go) drives a bare SDK echo loop, which sends each work body
// straight back to the results queue, and the real subscriber; the report
// gives both latencies, the subscriber's stage histograms' medians
// (vramq_subscriber_stage_seconds) and the time its batches took.
package latency

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/vramq/vramq/harness/cmd/bench/report"
	"github.com/vramq/vramq/harness/cmd/bench/sqsenv"
	"github.com/vramq/vramq/harness/cmd/bench/stats"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber"
)

// stages are the subscriber's stages in the order a message passes them
// (subscriber/message.go).
var stages = []string{"admit", "batch", "run", "encode", "send", "delete"}

// run is one variant's run: end-to-end latencies in milliseconds and, for
// the subscriber, its batches' own times and its stage medians.
type run struct {
	Variant   string             `json:"variant"`
	Repeat    int                `json:"repeat"`
	P50       float64            `json:"p50_ms"`
	P90       float64            `json:"p90_ms"`
	P99       float64            `json:"p99_ms"`
	Max       float64            `json:"max_ms"`
	SendP50   float64            `json:"send_p50_ms,omitempty"` // the echo's SendMessageBatch calls
	BatchP50  float64            `json:"batch_p50_ms,omitempty"`
	BatchP90  float64            `json:"batch_p90_ms,omitempty"`
	Batches   int                `json:"batches,omitempty"`
	Stages    map[string]float64 `json:"stage_median_ms,omitempty"`
	InSubP50  float64            `json:"message_seconds_median_ms,omitempty"`
	Redeliver float64            `json:"redelivered,omitempty"`
}

type latencyReport struct {
	Command  string  `json:"command"`
	Date     string  `json:"date"`
	Host     string  `json:"host"`
	Rate     float64 `json:"rate_per_second"`
	Messages int     `json:"messages_per_run"`
	Runs     []run   `json:"runs"`
}

// The variants: the transport twice, a bare SDK loop that sends back the
// work's own body or the subscriber's result for it (the same bytes the
// subscriber sends: a result is far larger than a small work message), and
// the subscriber.
const (
	echoVariant   = "echo: the work body"
	resultVariant = "echo: the result's bytes"
	// pipelinedVariant sends the result alongside and receives again at
	// once, as the subscriber's poller does, so that a long poll is waiting
	// while the result goes.
	pipelinedVariant = "echo: the result's bytes, pipelined"
	subVariant       = "subscriber"
)

// Run is `bench latency`.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	load := report.LoadAverage()
	fs := flag.NewFlagSet("bench latency", flag.ContinueOnError)
	fs.SetOutput(stderr)
	perS := fs.Float64("rate", 2, "messages per second, one per SendMessageBatch, token-paced (light load: one at a time)")
	messages := fs.Int("messages", 120, "messages per run")
	words := fs.Int("words", 8, "words per item (fixed sizes, as loadgen -sizes=fixed)")
	chunkItems := fs.Int("chunk-items", 8, "items per message")
	repeat := fs.Int("repeat", 1, "runs of each variant, taking turns; the summary is their medians")
	vram := bytesize.Size(16 << 30)
	fs.Var(&vram, "vram", "the subscriber's simulated device memory (bin/subscriber -device=sim -vram)")
	delay := fs.Duration("max-batch-delay", subscriber.DefaultConfig().MaxBatchDelay, "the subscriber's -max-batch-delay")
	modelKind := fs.String("model", "cpu", "the subscriber's model: cpu (bin/subscriber -device=sim's reference model, "+
		"working on this machine's CPU) or timed (bench/timed: a GPU's time, the CPU left free)")
	latency := fs.Duration("latency", 0, "add this much latency to every SQS call, through a proxy in this process")
	runTimeout := fs.Duration("run-timeout", 5*time.Minute, "longest one run may take")
	md := fs.String("md", "", "also write the report into this markdown file's latency section")
	jsonOut := fs.String("json", "", "also write the figures as JSON to this file")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if *modelKind != "cpu" && *modelKind != "timed" {
		return fmt.Errorf("%w: -model=%q: want cpu or timed", cli.ErrUsage, *modelKind)
	}
	if *perS <= 0 || *messages < 1 || *words < 1 || *chunkItems < 1 || *repeat < 1 || *delay < 0 {
		return fmt.Errorf("%w: -rate must be above 0, -messages, -words, -chunk-items and -repeat at least 1, "+
			"-max-batch-delay not negative", cli.ErrUsage)
	}
	env, err := sqsenv.New(ctx, stderr, nil, *latency)
	if err != nil {
		return err
	}
	rep := latencyReport{Command: strings.TrimSpace("bin/bench latency " + strings.Join(args, " ")),
		Date: time.Now().UTC().Format("2006-01-02"), Host: report.HostLine(), Rate: *perS, Messages: *messages}
	variants := []string{echoVariant, resultVariant, pipelinedVariant, subVariant}
	for r := range *repeat {
		for _, i := range stats.Rotation(len(variants), r) {
			w := workload.Load{JobID: fmt.Sprintf("latency-%d-%d", r, i), Messages: *messages, ChunkItems: *chunkItems,
				Sizes: workload.Sizes{Kind: workload.Fixed, Words: *words}}.Works()
			res, err := once(ctx, env, *runTimeout, variants[i], w, *perS, *modelKind, int64(vram), *delay, stderr)
			if err != nil {
				return fmt.Errorf("run %d, %s: %w", r+1, variants[i], err)
			}
			res.Repeat = r + 1
			rep.Runs = append(rep.Runs, res)
			fmt.Fprintf(stderr, "bench latency: run %d/%d %-36s p50 %5.1f ms, p90 %5.1f, p99 %5.1f, max %5.1f%s\n", r+1, *repeat,
				res.Variant, res.P50, res.P90, res.P99, res.Max, res.detail())
		}
	}
	var out bytes.Buffer
	via := ""
	if *latency > 0 {
		via = fmt.Sprintf(", every call delayed %v by a proxy", *latency)
	}
	fmt.Fprintf(&out, "Measured %s on %s, against %s%s (load average %s at the start); %d messages of %d items of %d words "+
		"per run at %g/s, the subscriber with bin/subscriber -device=sim's defaults (-vram=%s, -max-batch-delay=%v), "+
		"the %s model, debug logs kept for the batch times. Command:\n\n```sh\n%s\n```\n\n",
		rep.Date, rep.Host, sqsenv.Endpoint(), via, load, *messages, *chunkItems, *words, *perS, vram, *delay, *modelKind, rep.Command)
	rep.markdown(&out)
	if n := env.ReceiveRetries.Load(); n > 0 {
		fmt.Fprintf(&out, "\nThe SDK retried %d ReceiveMessage calls (the emulator's dropped answers): a message such a receive "+
			"had taken waits out its visibility timeout, which shows in p99 and max.\n", n)
	}
	return report.Publish(stdout, out.String(), *md, "latency", *jsonOut, rep)
}

func (r run) detail() string {
	if r.Variant != subVariant {
		return fmt.Sprintf("; send p50 %.2f ms", r.SendP50)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "; batch p50 %.2f ms of %d; stage medians", r.BatchP50, r.Batches)
	for _, s := range stages {
		fmt.Fprintf(&b, " %s %.2f", s, r.Stages[s])
	}
	fmt.Fprintf(&b, ", receive to result sent %.2f", r.InSubP50)
	if r.Redeliver > 0 {
		fmt.Fprintf(&b, "; %g redelivered", r.Redeliver)
	}
	return b.String()
}

// once runs one variant on fresh queues: the consumer starts, the load
// runs to its last result, the consumer stops.
func once(ctx context.Context, env *sqsenv.Env, limit time.Duration, variant string, works []job.Work, perS float64,
	kind string, vram int64, delay time.Duration, stderr io.Writer) (run, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	urls, drop, err := env.FreshQueues(ctx)
	if err != nil {
		return run{}, err
	}
	defer drop()
	consumerCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	var sub *subscriberRun
	var sends []time.Duration
	wait := subscriber.DefaultConfig().WaitTime
	switch variant {
	case echoVariant:
		go func() { done <- echo(consumerCtx, env.Client, urls, wait, nil, false, &sends) }()
	case resultVariant, pipelinedVariant:
		bodies, err := resultBodies(ctx, works, kind, vram)
		if err != nil {
			return run{}, err
		}
		go func() { done <- echo(consumerCtx, env.Client, urls, wait, bodies, variant == pipelinedVariant, &sends) }()
	default:
		if sub, err = newSubscriber(env.Client, urls, kind, vram, delay, stderr); err != nil {
			return run{}, err
		}
		go func() { done <- sub.sub.Run(consumerCtx) }()
	}
	lat, err := drive(ctx, env.Client, urls, works, perS)
	stop()
	if cerr := <-done; err == nil && cerr != nil {
		err = fmt.Errorf("consumer: %w", cerr)
	}
	if err != nil {
		return run{}, err
	}
	res := summarize(variant, lat)
	if sub == nil {
		res.SendP50 = stats.Percentile(millis(sends), 0.5)
	}
	if sub != nil {
		if err := sub.fill(&res); err != nil {
			return run{}, err
		}
	}
	return res, nil
}

func summarize(variant string, lat []time.Duration) run {
	ms := millis(lat)
	return run{Variant: variant, P50: stats.Percentile(ms, 0.5), P90: stats.Percentile(ms, 0.9), P99: stats.Percentile(ms, 0.99),
		Max: stats.Percentile(ms, 1)}
}

func millis(ds []time.Duration) []float64 {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d) / 1e6
	}
	return ms
}

// fill adds what the subscriber measured of itself to r.
func (s *subscriberRun) fill(r *run) error {
	ms := millis(s.batches.durations())
	r.Batches, r.BatchP50, r.BatchP90 = len(ms), stats.Percentile(ms, 0.5), stats.Percentile(ms, 0.9)
	mfs, err := s.reg.Gather()
	if err != nil {
		return err
	}
	r.Stages = map[string]float64{}
	for _, st := range stages {
		r.Stages[st] = 1e3 * histogramQuantile(mfs, "vramq_subscriber_stage_seconds", map[string]string{"stage": st}, 0.5)
	}
	r.InSubP50 = 1e3 * histogramQuantile(mfs, "vramq_subscriber_message_seconds", nil, 0.5)
	r.Redeliver = counterValue(mfs, "vramq_subscriber_messages_redelivered_total")
	return nil
}

func counterValue(mfs []*dto.MetricFamily, name string) float64 {
	for _, mf := range mfs {
		if mf.GetName() == name {
			var v float64
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
			return v
		}
	}
	return 0
}

// markdown writes every run, then the medians over the runs and what they
// say against the batch's own time.
func (rep latencyReport) markdown(w io.Writer) {
	fmt.Fprintln(w, "| run | consumer | p50 ms | p90 ms | p99 ms | max ms | batch p50 / p90 ms (batches) |")
	fmt.Fprintln(w, "|--:|---|--:|--:|--:|--:|--:|")
	for _, r := range rep.Runs {
		batch := ""
		if r.Variant == subVariant {
			batch = fmt.Sprintf("%.2f / %.2f (%d)", r.BatchP50, r.BatchP90, r.Batches)
		}
		fmt.Fprintf(w, "| %d | %s | %.1f | %.1f | %.1f | %.1f | %s |\n", r.Repeat, r.Variant, r.P50, r.P90, r.P99, r.Max, batch)
	}
	med := func(variant string, f func(run) float64) float64 {
		var xs []float64
		for _, r := range rep.Runs {
			if r.Variant == variant {
				xs = append(xs, f(r))
			}
		}
		return stats.Median(xs)
	}
	batch := med(subVariant, func(r run) float64 { return r.BatchP50 })
	fmt.Fprintf(w, "\nMedians over the runs (p50 / p90 / p99, ms), and the batch's own time, p50 %.2f ms:\n\n", batch)
	sp50 := med(subVariant, func(r run) float64 { return r.P50 })
	for _, v := range []string{echoVariant, resultVariant, pipelinedVariant, subVariant} {
		fmt.Fprintf(w, "- %s: %.2f / %.2f / %.2f", v, med(v, func(r run) float64 { return r.P50 }),
			med(v, func(r run) float64 { return r.P90 }), med(v, func(r run) float64 { return r.P99 }))
		if v == subVariant {
			fmt.Fprintf(w, ": p50 **%.2f×** the batch end to end\n", sp50/batch)
			continue
		}
		tp50 := med(v, func(r run) float64 { return r.P50 })
		fmt.Fprintf(w, "; the subscriber's p50 net of it %.2f ms, **%.2f×** the batch\n", sp50-tp50, (sp50-tp50)/batch)
	}
	fmt.Fprintf(w, "- receive to result accepted, inside the subscriber (`message_seconds` median): %.2f ms, %.2f× the batch\n\n",
		med(subVariant, func(r run) float64 { return r.InSubP50 }), med(subVariant, func(r run) float64 { return r.InSubP50 })/batch)
	fmt.Fprintln(w, "Stage medians (`vramq_subscriber_stage_seconds`, interpolated within √2-wide buckets), ms:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| "+strings.Join(stages, " | ")+" |")
	fmt.Fprintln(w, "|"+strings.Repeat("--:|", len(stages)))
	var cells []string
	for _, st := range stages {
		v := med(subVariant, func(r run) float64 { return r.Stages[st] })
		cells = append(cells, strings.TrimSuffix(fmt.Sprintf("%.2f", v), "NaN"))
	}
	fmt.Fprintln(w, "| "+strings.Join(cells, " | ")+" |")
	if math.IsNaN(batch) {
		fmt.Fprintln(w, "\nNo batch line was logged: the batch times are missing.")
	}
}
