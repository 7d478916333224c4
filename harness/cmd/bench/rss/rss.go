// Package rss is `bench rss`: the subscriber's peak memory (VmHWM) with a
// large backlog waiting on its queue, against a small one, each in a child
// process of its own (the bench binary re-executed) so that the figure is the
// subscriber's alone.
package rss

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"github.com/vramq/vramq/harness/cmd/bench/report"
	"github.com/vramq/vramq/harness/cmd/bench/sqsenv"
	"github.com/vramq/vramq/harness/cmd/bench/stats"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/testenv/jobq"
)

// rssRun is one subscriber process consuming one backlog.
type rssRun struct {
	Backlog  int     `json:"backlog"`
	Consumed int     `json:"consumed"`
	Seconds  float64 `json:"seconds"`
	Drained  bool    `json:"drained"` // the queue emptied within the time limit
	memPeak
}

type rssReport struct {
	Command  string     `json:"command"`
	Date     string     `json:"date"`
	Host     string     `json:"host"`
	Backlogs []int      `json:"backlogs"`
	Runs     [][]rssRun `json:"runs"` // [backlog][trial]
}

// Run is `bench rss`, or, with the hidden first argument rssChild, the
// subscriber child it measures.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	load := report.LoadAverage()
	if len(args) > 0 && args[0] == rssChild {
		return runRSSChild(ctx, args[1:], stderr)
	}
	fs := flag.NewFlagSet("bench rss", flag.ContinueOnError)
	fs.SetOutput(stderr)
	backlog := fs.Int("backlog", 100_000, "messages waiting on the queue when the subscriber starts")
	baseline := fs.Int("baseline", 1_000, "the small backlog measured alongside, as the baseline")
	trials := fs.Int("trials", 3, "trials; each measures both backlogs, in a rotating order")
	maxTime := fs.Duration("max-time", 3*time.Minute, "stop a subscriber after this long even if its queue is not empty")
	every := fs.Duration("every", 100*time.Millisecond, "how often the subscriber's /proc/<pid>/status is read")
	md := fs.String("md", "", "also write the figures into this markdown file's rss section (e.g. bench/overhead.md)")
	jsonOut := fs.String("json", "", "also write the figures as JSON to this file")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if *backlog < 1 || *baseline < 1 || *trials < 1 || *maxTime <= 0 || *every <= 0 {
		return fmt.Errorf("%w: -backlog, -baseline and -trials must be at least 1, -max-time and -every positive", cli.ErrUsage)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	proc, err := procfs.NewDefaultFS()
	if err != nil {
		return fmt.Errorf("reading process memory needs /proc: %w", err)
	}
	e, err := sqsenv.New(ctx, stderr, nil, 0)
	if err != nil {
		return err
	}
	rep := rssReport{Command: "bin/bench rss " + strings.Join(args, " "), Date: time.Now().UTC().Format("2006-01-02"),
		Host: report.HostLine(), Backlogs: []int{*baseline, *backlog}, Runs: make([][]rssRun, 2)}
	for t := range *trials {
		for _, i := range stats.Rotation(2, t) {
			r, err := measureRSS(ctx, e, exe, proc, rep.Backlogs[i], *maxTime, *every, stderr)
			if err != nil {
				return fmt.Errorf("trial %d, backlog %d: %w", t+1, rep.Backlogs[i], err)
			}
			rep.Runs[i] = append(rep.Runs[i], r)
			fmt.Fprintf(stderr, "bench rss: trial %d/%d backlog %7d: consumed %7d in %5.1fs; VmHWM %s, highest VmRSS sampled %s "+
				"(%d samples)\n",
				t+1, *trials, r.Backlog, r.Consumed, r.Seconds, bytesize.Format(int64(r.HWM)), bytesize.Format(int64(r.MaxRSS)), r.Samples)
		}
	}

	var out bytes.Buffer
	fmt.Fprintf(&out, "Measured %s on %s, against the emulator at %s (load average %s at the start). Command:\n\n```sh\n%s\n```\n\n",
		rep.Date, rep.Host, sqsenv.Endpoint(), load, strings.TrimSpace(rep.Command))
	fmt.Fprintf(&out, "The subscriber runs in a child process (the bench binary re-executed), with the no-op model and the "+
		"subscriber's defaults "+
		"(prefetch 20, max-inflight 100, max-batch 8; wait-time 1s), on a queue loaded with the backlog before it starts; "+
		"its /proc/<pid>/status is read every %v until the queue is empty or %v have passed. %d trials, alternating the two "+
		"backlogs.\n\n", *every, *maxTime, *trials)
	writeRSSTable(&out, rep)
	return report.Publish(stdout, out.String(), *md, "rss", *jsonOut, rep)
}

func writeRSSTable(w io.Writer, rep rssReport) {
	mib := func(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
	fmt.Fprintln(w, "| backlog | consumed, median | from start to empty, median | peak RSS (VmHWM), median | min–max | highest "+
		"VmRSS sampled, median |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
	hwm := make([][]float64, len(rep.Backlogs))
	for i, b := range rep.Backlogs {
		var consumed, secs, sampled []float64
		for _, r := range rep.Runs[i] {
			consumed = append(consumed, float64(r.Consumed))
			secs = append(secs, r.Seconds)
			hwm[i] = append(hwm[i], float64(r.HWM))
			sampled = append(sampled, float64(r.MaxRSS))
		}
		lo, hi := minMax(hwm[i])
		fmt.Fprintf(w, "| %s | %s | %.1f s | **%s** | %s–%s | %s |\n", thousands(b), thousands(int(stats.Median(consumed))),
			stats.Median(secs),
			mib(stats.Median(hwm[i])), mib(lo), mib(hi), mib(stats.Median(sampled)))
	}
	fmt.Fprintf(w, "\nPeak RSS with a %s-message backlog ÷ with %s: **%.2f** (ratio of medians; median of per-trial ratios %.2f).\n",
		thousands(rep.Backlogs[1]), thousands(rep.Backlogs[0]), stats.Median(hwm[1])/stats.Median(hwm[0]),
		stats.Median(stats.PairedRatios(hwm[1], hwm[0])))
	for i, b := range rep.Backlogs {
		for t, r := range rep.Runs[i] {
			if !r.Drained {
				fmt.Fprintf(w, "\nTrial %d with the %s backlog was stopped at the time limit with %s messages consumed.\n", t+1,
					thousands(b), thousands(r.Consumed))
			}
		}
	}
}

// thousands writes n with commas between groups of three digits.
func thousands(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func minMax(xs []float64) (float64, float64) {
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

// measureRSS loads backlog messages onto fresh queues, starts the
// subscriber child on them, samples its memory until the queue is empty or
// maxTime has passed, and stops it with SIGTERM.
func measureRSS(ctx context.Context, e *sqsenv.Env, exe string, proc procfs.FS, backlog int, maxTime, every time.Duration,
	stderr io.Writer) (rssRun, error) {
	r := rssRun{Backlog: backlog}
	urls, drop, err := e.FreshQueues(ctx)
	if err != nil {
		return r, err
	}
	defer drop()
	loadStart := time.Now()
	if err := e.Preload(ctx, urls.Work, sqsenv.TinyWorks("rss", backlog)); err != nil {
		return r, fmt.Errorf("loading the backlog: %w", err)
	}
	fmt.Fprintf(stderr, "bench rss: loaded %d messages in %.1fs\n", backlog, time.Since(loadStart).Seconds())

	cmd := exec.Command(exe, "rss", rssChild, "-queue-url", urls.Work, "-results-queue-url", urls.Results, "-dlq-url", urls.DLQ)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("the subscriber did not stop within a minute of SIGTERM")
		}
	}

	deadline := time.Now().Add(maxTime)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		s, err := readMem(proc, cmd.Process.Pid)
		if err != nil {
			_ = stop()
			return r, fmt.Errorf("reading the subscriber's memory: %w", err)
		}
		r.add(s)
		// The queue is read with every sample: the time to drain is known
		// to a sample's interval.
		visible, inflight, err := jobq.Counts(ctx, e.Client, urls.Work)
		if err != nil {
			_ = stop()
			return r, err
		}
		r.Consumed = backlog - visible - inflight
		if visible+inflight == 0 {
			r.Drained = true
			break
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case err := <-exited:
			return r, fmt.Errorf("the subscriber exited early: %v", err)
		case <-ctx.Done():
			_ = stop()
			return r, ctx.Err()
		case <-tick.C:
		}
	}
	r.Seconds = time.Since(start).Seconds()
	// VmHWM is the peak so far; one last read before the process goes.
	if s, err := readMem(proc, cmd.Process.Pid); err == nil {
		r.add(s)
	}
	if err := stop(); err != nil {
		return r, fmt.Errorf("subscriber: %w", err)
	}
	return r, nil
}
