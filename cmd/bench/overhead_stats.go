package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
)

// medianOf is the median of xs (the mean of the middle two for an even
// count); NaN for none. xs is not changed.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// pairedRatios divides a[i] by b[i]: figures from the same trial, measured
// minutes apart at most, so a drift in the machine's load over the run
// cancels out of each.
func pairedRatios(a, b []float64) []float64 {
	out := make([]float64, min(len(a), len(b)))
	for i := range out {
		out[i] = a[i] / b[i]
	}
	return out
}

// rotation is the order of n variants in trial t: each trial starts one
// further along, so no variant always runs first (on a cold connection
// pool) or right after the same neighbour.
func rotation(n, t int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = (i + t) % n
	}
	return order
}

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
	ours := medianOf(t.Rates[0])
	for i, name := range t.Names {
		r := t.Rates[i]
		rows[i] = ratioRow{Name: name, Median: medianOf(r), Min: slices.Min(r), Max: slices.Max(r)}
		rows[i].Ratio = ours / rows[i].Median
		rows[i].PairedRatio = medianOf(pairedRatios(t.Rates[0], r))
	}
	return rows
}

// markdown writes the comparison as a table.
func (t trialSet) markdown(w io.Writer, ours string) {
	fmt.Fprintf(w, "| | messages/s, median of %d | min–max | %s ÷ this: ratio of medians | median of per-trial ratios |\n", len(t.Rates[0]), ours)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	for i, r := range t.rows() {
		if i == 0 {
			fmt.Fprintf(w, "| **%s** | **%.0f** | %.0f–%.0f | | |\n", r.Name, r.Median, r.Min, r.Max)
			continue
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f–%.0f | **%.2f** | %.2f |\n", r.Name, r.Median, r.Min, r.Max, r.Ratio, r.PairedRatio)
	}
}

// Sections of a markdown file that a command rewrites keep to their
// markers; the prose around them is left alone.
func sectionMarkers(name string) (begin, end string) {
	return "<!-- bench " + name + ": begin (written by the command; edits here are overwritten) -->",
		"<!-- bench " + name + ": end -->"
}

// replaceSection puts body between name's markers in doc, or appends the
// markers and body when doc has none.
func replaceSection(doc, name, body string) (string, error) {
	begin, end := sectionMarkers(name)
	body = strings.TrimRight(body, "\n") + "\n"
	i := strings.Index(doc, begin)
	j := strings.Index(doc, end)
	switch {
	case i < 0 && j < 0:
		if doc != "" && !strings.HasSuffix(doc, "\n") {
			doc += "\n"
		}
		if doc != "" {
			doc += "\n"
		}
		return doc + begin + "\n" + body + end + "\n", nil
	case i < 0 || j < i:
		return "", fmt.Errorf("the %q markers are out of order or one is missing", name)
	}
	return doc[:i+len(begin)] + "\n" + body + doc[j:], nil
}

// updateSection rewrites section name of the markdown file at path.
func updateSection(path, name, body string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	doc, err := replaceSection(string(old), name, body)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

// hostLine says what the figures were measured on.
func hostLine() string {
	cpu := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	return fmt.Sprintf("%d cores (%s), %s/%s, %s", runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH, runtime.Version())
}
