package overhead

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"time"

	"github.com/vramq/vramq/harness/cmd/bench/report"
	"github.com/vramq/vramq/harness/cmd/bench/sqsenv"
	"github.com/vramq/vramq/harness/cmd/bench/stats"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/localstack"
)

// overheadReport is what `bench overhead` measured; -json writes it.
type overheadReport struct {
	Command  string      `json:"command"`
	Date     string      `json:"date"`
	Host     string      `json:"host"`
	Trials   int         `json:"trials"`
	Consume  *trialSet   `json:"subscriber,omitempty"`
	Messages int         `json:"subscriber_messages_per_run,omitempty"`
	Publish  []*trialSet `json:"publisher,omitempty"`
	Jobs     int         `json:"publisher_jobs_per_run,omitempty"`
	JobItems int         `json:"publisher_items_per_job,omitempty"`
	Chunks   int         `json:"publisher_messages_per_run,omitempty"`
}

// Run is `bench overhead`: it measures what vramq costs over the bare SDK against the same
// endpoint in the same run: the subscriber with a no-op model against bare
// receive/delete loops over the same pre-loaded messages, and the
// publisher's HTTP path against bare SendMessageBatch loops sending the same
// chunks. Each trial runs every variant once, in a rotating order, on fresh
// queues; the figures are medians over the trials.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	load := report.LoadAverage()
	fs := flag.NewFlagSet("bench overhead", flag.ContinueOnError)
	fs.SetOutput(stderr)
	trials := fs.Int("trials", 7, "trials; each runs every variant once, in a rotating order")
	messages := fs.Int("messages", 5000, "subscriber comparison: pre-loaded messages per run (one item of 4 words each)")
	jobs := fs.Int("jobs", 200, "publisher comparison: jobs per run")
	jobItems := fs.Int("job-items", 400, "publisher comparison: items per job (4 words each)")
	chunkItems := fs.Int("chunk-items", 10, "publisher comparison: items per message (the jobs' chunk_items)")
	var cc consumeConfig
	fs.IntVar(&cc.Prefetch, "prefetch", 20, "subscriber comparison: the subscriber's prefetch")
	fs.IntVar(&cc.MaxInflight, "max-inflight", 100,
		"subscriber comparison: the subscriber's max in-flight, and ten times the batches the pipelined bare loops settle at once")
	fs.IntVar(&cc.MaxBatch, "max-batch", 10, "subscriber comparison: the subscriber's max batch")
	clients := fs.String("clients", "1,4", "publisher comparison: clients posting jobs at once; a comparison for each number in the list")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memProfile := fs.String("memprofile", "",
		"write a profile of the whole run's allocations to this file (go tool pprof -sample_index=alloc_space)")
	traceOut := fs.String("trace", "", "write a Go execution trace of the whole run to this file (go tool trace)")
	timelineOut := fs.String("timeline", "",
		"subscriber comparison: record every SQS call of every run, with the process's and the machine's CPU over it, "+
			"as JSON to this file, and log a summary of each run (calls in flight, latencies, time with no receive in flight)")
	serverPID := fs.Int("server-pid", 0,
		"with -timeline: the endpoint's process id (the emulator's, in .run/emulator*.pid), whose CPU over each run is reported too")
	consumerKeys := fs.String("consumers", allConsumers,
		"subscriber comparison: the consumers to run, in a comma-separated list; one alone, with -cpuprofile or -memprofile, "+
			"profiles it alone")
	only := fs.String("only", "subscriber,publisher", "comparisons to run")
	runTimeout := fs.Duration("run-timeout", 3*time.Minute, "longest one variant may take")
	md := fs.String("md", "", "also write the figures into this markdown file's overhead section (e.g. bench/overhead.md)")
	jsonOut := fs.String("json", "", "also write the figures as JSON to this file")
	latency := fs.Duration("latency", 0, "add this much latency to every SQS call, both sides alike, through a proxy in this process "+
		"(internal/testenv/faultproxy): the emulator answers in about a millisecond, SQS in a region in several")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if *trials < 1 || *messages < 1 || *jobs < 1 || *jobItems < 1 || *chunkItems < 1 ||
		cc.Prefetch < 1 || cc.MaxInflight < 1 || cc.MaxBatch < 1 {
		return fmt.Errorf("%w: -trials, -messages, -jobs, -job-items, -chunk-items, -prefetch, -max-inflight and -max-batch "+
			"must be at least 1", cli.ErrUsage)
	}
	cs, err := cc.consumers(*consumerKeys)
	if err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	var pcs []publishConfig
	for _, c := range strings.Split(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			return fmt.Errorf("%w: -clients=%q: want a list of numbers of at least 1", cli.ErrUsage, *clients)
		}
		pcs = append(pcs, publishConfig{Clients: n})
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		// Every allocation is recorded, not one per 512 KiB: the
		// subscriber's are small and many.
		runtime.MemProfileRate = 1
		defer func() {
			if err := writeAllocs(*memProfile); err != nil {
				fmt.Fprintf(stderr, "bench overhead: %v\n", err)
			}
		}()
	}
	if *traceOut != "" {
		f, err := os.Create(*traceOut)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return err
		}
		defer trace.Stop()
	}
	var tl *timeline
	if *timelineOut != "" {
		tl = &timeline{serverPID: *serverPID}
		defer func() {
			if err := tl.write(*timelineOut); err != nil {
				fmt.Fprintf(stderr, "bench overhead: writing the timeline: %v\n", err)
			}
		}()
	}
	e, err := newBenchEnv(ctx, stderr, tl, *latency)
	if err != nil {
		return err
	}
	rep := overheadReport{Command: "bin/bench overhead " + strings.Join(args, " "), Date: time.Now().UTC().Format("2006-01-02"),
		Host: report.HostLine(), Trials: *trials}
	var out bytes.Buffer
	via := ""
	if *latency > 0 {
		via = fmt.Sprintf(", every call delayed %v by a proxy", *latency)
	}
	fmt.Fprintf(&out, "Measured %s on %s, against the emulator at %s%s (load average %s at the start). Command:\n\n```sh\n%s\n```\n",
		rep.Date, rep.Host, sqsenv.Endpoint(), via, load, strings.TrimSpace(rep.Command))

	if strings.Contains(*only, "subscriber") {
		rep.Messages = *messages
		set := &trialSet{Rates: make([][]float64, len(cs))}
		for _, c := range cs {
			set.Names = append(set.Names, c.name)
		}
		for t := range *trials {
			for _, i := range stats.Rotation(len(cs), t) {
				c := cs[i]
				e.run.variant, e.run.trial = c.name, t+1
				rate, note, err := e.timed(ctx, *runTimeout, func(ctx context.Context, urls localstack.URLs) (time.Duration,
					string, error) {
					if err := e.Preload(ctx, urls.Work, sqsenv.TinyWorks("overhead", *messages)); err != nil {
						return 0, "", fmt.Errorf("pre-loading: %w", err)
					}
					return c.run(ctx, e, urls, *messages)
				}, *messages)
				if err != nil {
					return fmt.Errorf("trial %d, %s: %w", t+1, c.name, err)
				}
				set.Rates[i] = append(set.Rates[i], rate)
				fmt.Fprintf(stderr, "bench overhead: trial %d/%d %-50s %7.0f messages/s %s\n", t+1, *trials, c.name, rate, note)
				if tl != nil {
					fmt.Fprintf(stderr, "bench overhead:   timeline: %s\n", e.run.summary)
				}
				if note != "" && c.key == "subscriber" {
					set.Notes = append(set.Notes, fmt.Sprintf("trial %d: the subscriber's %s", t+1, note))
				}
			}
		}
		rep.Consume = set
		fmt.Fprintf(&out, "\n### Subscriber against bare receive/delete loops\n\n%d pre-loaded messages per run, fresh queues "+
			"per run, %d trials. %s.\n\n",
			*messages, *trials, cc.settings())
		set.markdown(&out, cs[0].key)
		writeNotes(&out, set.Notes)
	}

	if strings.Contains(*only, "publisher") {
		load, err := preparePublishLoad(*jobs, *jobItems, *chunkItems, 4)
		if err != nil {
			return err
		}
		rep.Jobs, rep.JobItems, rep.Chunks = *jobs, *jobItems, load.messages
		fmt.Fprintf(&out, "\n### Publisher against bare SendMessageBatch loops\n\n%d jobs of %d items (4 words each) per run, "+
			"%d items per message: %d messages per run, fresh queues per run, %d trials. %s.\n",
			*jobs, *jobItems, *chunkItems, load.messages, *trials, publishSettings)
		for _, pc := range pcs {
			ps := pc.producers()
			set := &trialSet{Rates: make([][]float64, len(ps)), Clients: pc.Clients}
			for _, p := range ps {
				set.Names = append(set.Names, p.name)
			}
			for t := range *trials {
				for _, i := range stats.Rotation(len(ps), t) {
					p := ps[i]
					rate, note, err := e.timed(ctx, *runTimeout, func(ctx context.Context, urls localstack.URLs) (time.Duration,
						string, error) {
						took, err := p.run(ctx, e, urls, load)
						return took, "", err
					}, load.messages)
					if err != nil {
						return fmt.Errorf("trial %d, %d clients, %s: %w", t+1, pc.Clients, p.name, err)
					}
					set.Rates[i] = append(set.Rates[i], rate)
					fmt.Fprintf(stderr, "bench overhead: trial %d/%d %d client(s) %-45s %7.0f messages/s %s\n", t+1, *trials,
						pc.Clients, p.name, rate, note)
				}
			}
			rep.Publish = append(rep.Publish, set)
			fmt.Fprintf(&out, "\n#### %s\n\n", pc.heading())
			set.markdown(&out, "publisher")
		}
	}
	if n := e.ReceiveRetries.Load(); n > 0 {
		fmt.Fprintf(&out, "\nThe SDK retried %d ReceiveMessage calls (a known emulator fault under load: an answer that fails to read); "+
			"%d run(s) during which it happened were thrown away and run again, as each may leave up to ten messages invisible "+
			"for the whole visibility timeout.\n",
			n, e.discarded)
	}

	return report.Publish(stdout, out.String(), *md, "overhead", *jsonOut, rep)
}

// timed runs f on fresh queues under a time limit and returns n messages
// over the time f reports, with f's note. A run during which the SDK retried
// a ReceiveMessage is thrown away and run again (up to retriedRuns times):
// the emulator sometimes loses a receive's answer, and the up to ten
// messages it had handed out stay invisible for the whole visibility
// timeout, which turns a one-second run into a thirty-second one. That is
// the emulator's doing, not the consumer's; the report says how many runs
// were thrown away.
func (e *benchEnv) timed(ctx context.Context, limit time.Duration, f func(context.Context, localstack.URLs) (time.Duration,
	string, error), n int) (float64, string, error) {
	for attempt := 1; ; attempt++ {
		retries := e.ReceiveRetries.Load()
		took, note, err := e.once(ctx, limit, f)
		if err != nil {
			return 0, "", err
		}
		if e.ReceiveRetries.Load() == retries || attempt == retriedRuns+1 {
			if attempt > 1 {
				note = strings.TrimSpace(fmt.Sprintf("%s (after %d run(s) thrown away for a retried receive)", note, attempt-1))
			}
			return float64(n) / took.Seconds(), note, nil
		}
		e.discarded++
		e.tl.discardLast()
	}
}

// retriedRuns is how many times a run with a retried receive is repeated.
const retriedRuns = 3

func (e *benchEnv) once(ctx context.Context, limit time.Duration, f func(context.Context, localstack.URLs) (time.Duration,
	string, error)) (time.Duration, string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	urls, drop, err := e.FreshQueues(ctx)
	if err != nil {
		return 0, "", err
	}
	defer drop()
	return f(ctx, urls)
}

// writeNotes lists notes of the form "trial N: text", each text once with
// the trials that had it.
func writeNotes(w io.Writer, notes []string) {
	var texts []string
	trials := map[string][]string{}
	for _, n := range notes {
		trial, text, _ := strings.Cut(n, ": ")
		if _, seen := trials[text]; !seen {
			texts = append(texts, text)
		}
		trials[text] = append(trials[text], strings.TrimPrefix(trial, "trial "))
	}
	if len(texts) > 0 {
		fmt.Fprintln(w)
	}
	for _, text := range texts {
		which := "trials " + strings.Join(trials[text], ", ")
		if len(trials[text]) == 1 {
			which = "trial " + trials[text][0]
		}
		fmt.Fprintf(w, "- %s: %s\n", which, text)
	}
}

// writeAllocs writes the allocation profile of the run so far to path.
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
