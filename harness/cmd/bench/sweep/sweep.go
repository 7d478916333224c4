// Package sweep is `bench sweep`: the admission strategies of package
// strategies over a grid of workload shapes, estimate errors and numbers of
// subscribers, each row against its own offline bound.
package sweep

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vramq/vramq/harness/cmd/bench/report"
	"github.com/vramq/vramq/harness/cmd/bench/strategies"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/cli"
)

// sweepReport is what `bench sweep` measured: every strategy on every
// workload shape.
type sweepReport struct {
	Command string        `json:"command"`
	Date    string        `json:"date"`
	Machine string        `json:"machine"`
	Shapes  []sweepResult `json:"shapes"`
}

type sweepResult struct {
	// Label names the row: the shape, and the estimate error and the
	// number of subscribers where they vary.
	Label   string               `json:"label"`
	Params  strategies.Params    `json:"params"`
	Bound   strategies.Bound     `json:"bound"`
	Results []strategies.Outcome `json:"results"`
}

// Run is `bench sweep`: it runs every strategy over a list of workload
// shapes, with the settings of `bench strategies`, and reports throughput
// over each shape's offline bound.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench sweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	p, sf := strategies.Flags(fs)
	shapes := fs.String("shapes", "1-in-2,1-in-3,1-in-5,1-in-10,1-in-20,heavy",
		"workload shapes, in order (-shape and -large-every are ignored)")
	errs := fs.String("estimate-errors", "",
		"estimate errors to sweep, as -estimate-error takes them (none for exact); empty: -estimate-error alone")
	subs := fs.String("subscriber-counts", "", "numbers of subscribers to sweep; empty: -subscribers alone")
	repeat := fs.Int("repeat", 1, "runs of each strategy on each shape; the run of median throughput is reported")
	out := fs.String("out", "bench/sweep", "folder for sweep.md, sweep.json and sweep.png (empty: none)")
	name := fs.String("name", "sweep", "base name of the files in -out")
	verbose := fs.Bool("v", false, "subscriber logs to stderr")
	from := fs.String("from", "", "run nothing: write the Markdown and the plot again from this JSON of an earlier sweep")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if *from != "" {
		b, err := os.ReadFile(*from)
		if err != nil {
			return err
		}
		var rep sweepReport
		if err := json.Unmarshal(b, &rep); err != nil {
			return fmt.Errorf("%s: %w", *from, err)
		}
		for i := range rep.Shapes {
			if rep.Shapes[i].Label == "" { // written before rows had labels
				rep.Shapes[i].Label = rep.Shapes[i].Params.Shape
			}
		}
		return writeSweep(stdout, rep, *out, *name)
	}
	if *repeat < 1 {
		return fmt.Errorf("%w: -repeat must be at least 1", cli.ErrUsage)
	}
	if err := sf.Apply(p); err != nil {
		return err
	}
	client, retries, err := strategies.Client(ctx)
	if err != nil {
		return err
	}
	errList := []string{p.EstimateError}
	if *errs != "" {
		errList = strings.Split(*errs, ",")
	}
	subList := []int{p.Subscribers}
	if *subs != "" {
		subList = nil
		for _, f := range strings.Split(*subs, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 16 {
				return fmt.Errorf("%w: -subscriber-counts %q: want numbers from 1 to 16", cli.ErrUsage, *subs)
			}
			subList = append(subList, n)
		}
	}
	var scs []strategies.Scenario
	for _, shape := range strings.Split(*shapes, ",") {
		for _, e := range errList {
			for _, n := range subList {
				q := *p
				q.Shape, q.Subscribers = strings.TrimSpace(shape), n
				est, err := strategies.ParseEstimateError(strings.TrimSpace(e))
				if err != nil {
					return fmt.Errorf("%w: %v", cli.ErrUsage, err)
				}
				q.EstimateError = est.String()
				sc, err := strategies.Prepare(q, *sf.Shuffle)
				if err != nil {
					return err
				}
				scs = append(scs, sc)
			}
		}
	}
	label := func(q strategies.Params) string {
		l := q.Shape
		if len(errList) > 1 || q.EstimateError != "none" {
			l += " est " + q.EstimateError
		}
		if len(subList) > 1 || q.Subscribers > 1 {
			l += fmt.Sprintf(" x%d", q.Subscribers)
		}
		return l
	}
	rep := sweepReport{Command: "bin/bench sweep " + strings.Join(args, " "), Date: time.Now().UTC().Format("2006-01-02"),
		Machine: report.Machine()}
	for _, sc := range scs {
		fmt.Fprintf(stderr, "bench: shape %s: %d messages, %s to %s each, estimate error %s, %d subscriber(s); offline bound "+
			"%.1f messages/s (%s)\n",
			sc.Params().Shape, len(sc.Works()), bytesize.Format(sc.Params().SmallCost), bytesize.Format(sc.Params().LargeCost),
			sc.Params().EstimateError, sc.Params().Subscribers, sc.Bound.MessagesPerS, sc.Bound.Binding)
		res, err := sc.Measure(ctx, client, retries, *repeat, *verbose, stderr)
		if err != nil {
			return fmt.Errorf("shape %s: %w", sc.Params().Shape, err)
		}
		rep.Shapes = append(rep.Shapes, sweepResult{Label: label(sc.Params()), Params: sc.Params(), Bound: sc.Bound, Results: res})
	}
	return writeSweep(stdout, rep, *out, *name)
}

// writeSweep prints the sweep's Markdown and, with out set, writes it with
// the JSON and the plot into out.
func writeSweep(stdout io.Writer, rep sweepReport, out, name string) error {
	writeSweepMarkdown(stdout, rep, name)
	if out == "" {
		return nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, name+".json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := plotSweep(filepath.Join(out, name+".png"), rep); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(out, name+".md"))
	if err != nil {
		return err
	}
	writeSweepMarkdown(f, rep, name)
	return f.Close()
}

func writeSweepMarkdown(w io.Writer, rep sweepReport, name string) {
	if len(rep.Shapes) == 0 {
		return
	}
	p := rep.Shapes[0].Params
	fmt.Fprintf(w, "# Admission strategies over workload shapes\n\n")
	fmt.Fprintf(w, "Written by `%s` on %s; %s. Do not edit: run it again.\n\n", rep.Command, rep.Date, rep.Machine)
	fmt.Fprintf(w, "%d messages per row, budget %s per device, %d subscriber(s), estimate error `%s` (unless the row says "+
		"otherwise: `est` is -estimate-error, `xN` N subscribers on the one queue, each with its own device), max batch %d, "+
		"launch %v, throughput %s/s; "+
		"each strategy ran %d time(s) per shape (the median run). Settings and what differs between strategies besides "+
		"admission: as in [results.md](../results.md) (`vram-plain` is vram admission without the batch byte cap and "+
		"launch-ahead).\n\n",
		p.Messages, bytesize.Format(p.Budget), p.Subscribers, p.EstimateError, p.MaxBatch, p.Launch,
		bytesize.Format(int64(p.Throughput)), len(rep.Shapes[0].Results[0].AllRuns))
	fmt.Fprintln(w, "Throughput as a share of the row's offline bound (messages/s in brackets; device OOMs, redeliveries and "+
		"dead-lettered messages after the slash when any; the bound for N subscribers is N devices' worth):")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| row | bound msg/s |")
	for _, o := range rep.Shapes[0].Results {
		fmt.Fprintf(w, " `%s` |", o.Name)
	}
	fmt.Fprintf(w, "\n|---|--:|%s\n", strings.Repeat("--:|", len(rep.Shapes[0].Results)))
	for _, s := range rep.Shapes {
		fmt.Fprintf(w, "| `%s` | %.1f |", s.Label, s.Bound.MessagesPerS)
		for _, o := range s.Results {
			fmt.Fprintf(w, " %.0f%% (%.1f)", 100*o.OfBound, o.MessagesPerS)
			if o.DeviceOOMs > 0 || o.Redeliveries > 0 || o.DeadLettered > 0 {
				fmt.Fprintf(w, " / %d OOM, %d redel., %d DLQ", o.DeviceOOMs, o.Redeliveries, o.DeadLettered)
			}
			fmt.Fprint(w, " |")
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Ratios in the same run:")
	fmt.Fprintln(w)
	for _, s := range rep.Shapes {
		var parts []string
		one, ok1 := strategies.Find(s.Results, "count-1")
		for _, n := range []string{"vram", "vram-plain"} {
			if v, ok := strategies.Find(s.Results, n); ok && ok1 && one.MessagesPerS > 0 {
				parts = append(parts, fmt.Sprintf("`%s` %.2f× `count-1`", n, v.MessagesPerS/one.MessagesPerS))
			}
		}
		if v, ok := strategies.Find(s.Results, "vram"); ok {
			for _, base := range []string{"count-avg", "vram-plain"} {
				if b, ok := strategies.Find(s.Results, base); ok && b.MessagesPerS > 0 {
					parts = append(parts, fmt.Sprintf("`vram` %.2f× `%s`", v.MessagesPerS/b.MessagesPerS, base))
				}
			}
		}
		if len(parts) == 0 {
			continue
		}
		fmt.Fprintf(w, "- `%s` (%s to %s per message): %s\n", s.Label, bytesize.Format(s.Params.SmallCost),
			bytesize.Format(s.Params.LargeCost), strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)
	var many bool
	for _, s := range rep.Shapes {
		many = many || s.Params.Subscribers > 1
	}
	if many {
		fmt.Fprintln(w, "Requests per message (all subscribers' SQS calls) and the messages, and large ones (at least a quarter "+
			"of the budget), each subscriber completed:")
		fmt.Fprintln(w)
		for _, s := range rep.Shapes {
			for _, o := range s.Results {
				fmt.Fprintf(w, "- `%s` `%s`: %.3f requests/message, %d redeliveries; completed %v, large %v\n", s.Label, o.Name,
					o.RequestsPerM, o.Redeliveries, o.Completed, o.LargeCompleted)
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "A run ends only when every message has a result or is in the DLQ (its DLQ count is in the table); the "+
		"subscribers' ledgers are in the JSON.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Shapes:")
	fmt.Fprintln(w)
	seen := map[string]bool{}
	for _, s := range rep.Shapes {
		if !seen[s.Params.Shape] {
			seen[s.Params.Shape] = true
			fmt.Fprintf(w, "- `%s`: %s.\n", s.Params.Shape, s.Params.ShapeDesc)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "![Throughput over the offline bound per strategy and shape](%s.png)\n", name)
}
