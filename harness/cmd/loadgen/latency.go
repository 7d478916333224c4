package main

import (
	"math"
	"slices"
	"time"
)

// Latency summarises end-to-end latencies, in seconds: from a message's send
// to its first result received.
type Latency struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// summarize returns the summary of ds, or nil when there are none. It sorts
// ds.
func summarize(ds []time.Duration) *Latency {
	if len(ds) == 0 {
		return nil
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return &Latency{
		Count: len(ds),
		Mean:  (sum / time.Duration(len(ds))).Seconds(),
		P50:   percentile(ds, 50).Seconds(),
		P90:   percentile(ds, 90).Seconds(),
		P99:   percentile(ds, 99).Seconds(),
		Max:   ds[len(ds)-1].Seconds(),
	}
}

// percentile is the nearest-rank p-th percentile of sorted, which must not
// be empty: the smallest value that at least p% of the values do not
// exceed. It is always a latency measured, never an interpolation.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}
