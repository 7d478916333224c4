package overhead

import (
	"fmt"
	"io"
	"slices"

	"github.com/vramq/vramq/harness/cmd/bench/stats"
)

// trialSet is what one comparison measured: messages/s per variant, one
// figure per trial, the first variant being the one compared (ours).
type trialSet struct {
	Names []string    `json:"variants"`
	Rates [][]float64 `json:"messages_per_second"` // [variant][trial]
	Notes []string    `json:"notes,omitempty"`
	// Clients is the publisher comparison's clients; 0 for the subscriber's.
	Clients int `json:"clients,omitempty"`
}

// ratioRow is one line of a comparison's table.
type ratioRow struct {
	Name        string  `json:"name"`
	Median      float64 `json:"median_messages_per_second"`
	Min, Max    float64 `json:"-"`
	Ratio       float64 `json:"ours_over_this"`        // median of ours / median of this
	PairedRatio float64 `json:"ours_over_this_paired"` // median over trials of ours/this
}

func (t trialSet) rows() []ratioRow {
	rows := make([]ratioRow, len(t.Names))
	ours := stats.Median(t.Rates[0])
	for i, name := range t.Names {
		r := t.Rates[i]
		rows[i] = ratioRow{Name: name, Median: stats.Median(r), Min: slices.Min(r), Max: slices.Max(r)}
		rows[i].Ratio = ours / rows[i].Median
		rows[i].PairedRatio = stats.Median(stats.PairedRatios(t.Rates[0], r))
	}
	return rows
}

// markdown writes the comparison as a table.
func (t trialSet) markdown(w io.Writer, ours string) {
	fmt.Fprintf(w, "| | messages/s, median of %d | min–max | %s ÷ this: ratio of medians | median of per-trial ratios |\n",
		len(t.Rates[0]), ours)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	for i, r := range t.rows() {
		if i == 0 {
			fmt.Fprintf(w, "| **%s** | **%.0f** | %.0f–%.0f | | |\n", r.Name, r.Median, r.Min, r.Max)
			continue
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f–%.0f | **%.2f** | %.2f |\n", r.Name, r.Median, r.Min, r.Max, r.Ratio, r.PairedRatio)
	}
}
