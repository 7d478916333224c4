package strategies

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/vramq/vramq/internal/bytesize"
)

func writeStrategyTable(w io.Writer, rep strategyReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tmsg/s\tof bound\tdevice OOMs\tOOM retries\tredeliveries\tDLQ\tp50 s\tp99 s\treq/msg\twork-queue "+
		"req/msg\tpeak use\t")
	for _, o := range rep.Results {
		fmt.Fprintf(tw, "%s\t%.1f\t%.0f%%\t%d\t%.0f\t%d\t%d\t%.2f\t%.2f\t%.3f\t%.3f\t%.0f%%\t\n",
			o.Name, o.MessagesPerS, 100*o.OfBound, o.DeviceOOMs, o.OOMRetries, o.Redeliveries, o.DeadLettered,
			o.P50, o.P99, o.RequestsPerM, o.WorkPerM, 100*float64(o.PeakUsed)/float64(rep.Params.Budget))
	}
	fmt.Fprintf(tw, "offline bound\t%.1f\t100%%\t\t\t\t\t\t\t\t\t\t\n", rep.Bound.MessagesPerS)
	tw.Flush()
}

func writeStrategyMarkdown(w io.Writer, rep strategyReport) {
	p := rep.Params
	fmt.Fprintf(w, "# Admission strategies, measured\n\n")
	fmt.Fprintf(w, "Written by `make bench` (`%s`) on %s; %s.\n", rep.Command, rep.Date, rep.Machine)
	fmt.Fprintf(w, "Do not edit: run it again. How to read it, and what limits each figure: [README.md](README.md).\n\n")
	order := ", in that order"
	if p.Shuffled {
		order = ", sent in a seeded random order (the same for every strategy)"
	}
	fmt.Fprintf(w, "- **Workload:** %d messages, shape `%s`: %s; working memory from %s to %s per message%s.\n",
		p.Messages, p.Shape, p.ShapeDesc, bytesize.Format(p.SmallCost), bytesize.Format(p.LargeCost), order)
	model := p.Model
	if model == "" {
		model = "the reference model" // reports from before -bert
	}
	fmt.Fprintf(w, "- **Device:** simulated (`gpu.Sim` + `timed.Model`, costing as %s): its weights plus %s for work; each "+
		"batch takes a %v launch plus its working memory over %s/s, shared by the batches working at once (`timed.Timing`).\n",
		model, bytesize.Format(p.Budget), p.Launch, bytesize.Format(int64(p.Throughput)))
	if p.Subscribers > 1 {
		fmt.Fprintf(w, "- **Subscribers:** %d on the one queue, each with its own simulated device as above; figures are summed "+
			"over them, memory use is the mean over the devices.\n", p.Subscribers)
	}
	if p.EstimateError != "" && p.EstimateError != "none" {
		fmt.Fprintf(w, "- **Estimate error:** `%s`: admission works with estimates that are wrong by this much; the device "+
			"allocates the true cost (`-estimate-error`).\n", p.EstimateError)
	}
	fmt.Fprintf(w, "- **Subscriber:** in process, against the SQS emulator, max batch %d, result messages up to 1 MiB (the "+
		"queues' size), a 5 s visibility timeout, everything else default; fresh queues per strategy, the whole workload queued "+
		"before it starts.\n", p.MaxBatch)
	fmt.Fprintln(w, "- **What differs besides admission:** `none` holds at most 10 messages (prefetch 10, max in flight 10: the "+
		"classic prefetch-10 consumer, whose only bound that is); the others hold the default 20 waiting and 100 in all. "+
		"`vram` also caps a batch's estimated memory (a quarter of the budget by default) and launches a message that fills a "+
		"batch on its own while it waits for memory (launch-ahead); the subscriber offers both only under vram admission "+
		"(`subscriber/batch.go`), "+
		"so `vram-plain` is vram admission with both off (`MaxBatchBytes` at its largest): batches form exactly as under "+
		"`count` and `none` (up to max batch, the batch delay, or admission full). "+
		"Compare `vram-plain` with the count strategies for admission alone, and `vram` with `vram-plain` for the two batching features.")
	fmt.Fprintf(w, "- **Offline bound:** %.1f messages/s (%.2f s): the larger of the work bound (%.2f s: all the work at full "+
		"throughput, plus one launch) and the memory bound (%.2f s: Σcost²/throughput/budget); %s binds.\n\n",
		rep.Bound.MessagesPerS, rep.Bound.Seconds, rep.Bound.WorkSeconds, rep.Bound.MemorySeconds, rep.Bound.Binding)

	fmt.Fprintln(w, "| strategy | settings | messages/s | of bound | device OOMs | OOM retries | redeliveries | DLQ | p50 "+
		"latency | p99 latency | SQS requests/message | work-queue requests/message | peak memory use | mean memory use | "+
		"device busy | SDK-retried receives |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, o := range rep.Results {
		fmt.Fprintf(w, "| `%s` | %s | %.1f | %.0f%% | %d | %.0f | %d | %d | %.2f s | %.2f s | %.3f | %.3f | %.0f%% | %.0f%% | "+
			"%.0f%% | %d |\n",
			o.Name, o.Settings, o.MessagesPerS, 100*o.OfBound, o.DeviceOOMs, o.OOMRetries, o.Redeliveries, o.DeadLettered,
			o.P50, o.P99, o.RequestsPerM, o.WorkPerM, 100*float64(o.PeakUsed)/float64(p.Budget), 100*o.MeanUse,
			100*o.Utilisation, o.RetriedReceives)
	}
	fmt.Fprintf(w, "| offline bound | | %.1f | 100%% | | | | | | | | | | | | |\n\n", rep.Bound.MessagesPerS)
	fmt.Fprintf(w, "Each strategy ran %d times, taking turns; the row is the run of median throughput. Every run's "+
		"messages/s:\n\n", len(rep.Results[0].AllRuns))
	for _, o := range rep.Results {
		runs := make([]string, len(o.AllRuns))
		for i, x := range o.AllRuns {
			runs[i] = fmt.Sprintf("%.1f", x)
		}
		fmt.Fprintf(w, "- `%s`: %s\n", o.Name, strings.Join(runs, ", "))
	}
	fmt.Fprintln(w)
	for _, name := range []string{"vram", "vram-plain"} {
		if v, ok := Find(rep.Results, name); ok {
			if one, ok := Find(rep.Results, "count-1"); ok && one.MessagesPerS > 0 {
				fmt.Fprintf(w, "`%s` runs %.2f× the throughput of `count-1`.\n", name, v.MessagesPerS/one.MessagesPerS)
			}
		}
	}
	if v, ok := Find(rep.Results, "vram"); ok {
		if plain, ok := Find(rep.Results, "vram-plain"); ok && plain.MessagesPerS > 0 {
			fmt.Fprintf(w, "`vram` runs %.2f× `vram-plain`: what the batch byte cap and launch-ahead add to vram admission.\n",
				v.MessagesPerS/plain.MessagesPerS)
		}
	}
	fmt.Fprintln(w)
	if rep.Params.Subscribers > 1 {
		fmt.Fprintln(w, "Messages each subscriber completed (deleted), and of them the large ones (true cost at least a quarter "+
			"of the budget):")
		fmt.Fprintln(w)
		for _, o := range rep.Results {
			fmt.Fprintf(w, "- `%s`: %v, large %v\n", o.Name, o.Completed, o.LargeCompleted)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "Latency is from a message's first receipt by the subscriber to its result read off the results queue. SQS "+
		"requests are the subscriber's, by action:")
	fmt.Fprintln(w)
	var actions []string
	for _, o := range rep.Results {
		for a := range maps.Keys(o.Requests) {
			if !slices.Contains(actions, a) {
				actions = append(actions, a)
			}
		}
	}
	slices.Sort(actions)
	fmt.Fprintf(w, "| strategy | %s |\n|---|%s\n", strings.Join(actions, " | "), strings.Repeat("--:|", len(actions)))
	for _, o := range rep.Results {
		fmt.Fprintf(w, "| `%s` |", o.Name)
		for _, a := range actions {
			fmt.Fprintf(w, " %.0f |", o.Requests[a])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Ledgers (each must balance: every message received was deleted or released):")
	fmt.Fprintln(w)
	for _, o := range rep.Results {
		fmt.Fprintf(w, "- `%s`: %s\n", o.Name, o.Ledger)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "![Device memory in use over time, per strategy](budget.png)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "![Throughput per strategy against the offline bound](throughput.png)")
}

func Find(os []Outcome, name string) (Outcome, bool) {
	for _, o := range os {
		if o.Name == name {
			return o, true
		}
	}
	return Outcome{}, false
}

type strategyReport struct {
	Params  Params    `json:"params"`
	Bound   Bound     `json:"bound"`
	Results []Outcome `json:"results"`
	Command string    `json:"command"`
	Date    string    `json:"date"`
	Machine string    `json:"machine"`
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
