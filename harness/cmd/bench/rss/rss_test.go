package rss

import (
	"strings"
	"testing"
)

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 100000: "100,000", 1234567: "1,234,567", -4200: "-4,200"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// The table's ratio is of the big backlog's peak to the baseline's, so a
// subscriber whose memory grew with the backlog shows above 1.
func TestRSSTableRatio(t *testing.T) {
	mib := uint64(1 << 20)
	run := func(backlog int, hwm uint64, drained bool) rssRun {
		return rssRun{Backlog: backlog, Consumed: backlog, Seconds: 2, Drained: drained, memPeak: memPeak{MaxRSS: hwm - mib,
			HWM: hwm, Samples: 20}}
	}
	rep := rssReport{Backlogs: []int{1000, 100000}, Runs: [][]rssRun{
		{run(1000, 20*mib, true), run(1000, 22*mib, true), run(1000, 21*mib, true)},
		{run(100000, 42*mib, true), run(100000, 40*mib, false), run(100000, 44*mib, true)},
	}}
	var b strings.Builder
	writeRSSTable(&b, rep)
	for _, want := range []string{
		"| 1,000 | 1,000 | 2.0 s | **21.0 MiB** | 20.0 MiB–22.0 MiB | 20.0 MiB |",
		"| 100,000 | 100,000 | 2.0 s | **42.0 MiB** | 40.0 MiB–44.0 MiB | 41.0 MiB |",
		"÷ with 1,000: **2.00**",
		"Trial 2 with the 100,000 backlog was stopped at the time limit",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
