package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/cli"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-messages=0"}, "-messages"},
		{[]string{"-fault-interval=0s"}, "-fault-interval"},
		{[]string{"-subscriber-bin=/nonexistent/subscriber"}, "-subscriber-bin"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		err := run(context.Background(), tc.args, func(string) string { return "" }, &bytes.Buffer{}, &bytes.Buffer{})
		if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v; want a usage error naming %s", tc.args, err, tc.want)
		}
	}
}

func TestPrintSummary(t *testing.T) {
	var b bytes.Buffer
	printSummary(&b, &Summary{Workload: "w", Messages: 10, Results: 9, DLQReasons: map[string]int{"poison": 1},
		Faults: map[string]int64{"throttle": 3, "down": 1}, Restarts: map[string]int{"SIGKILL": 2}, Lost: 0, PeakRSSBytes: 3 << 20,
		WallSeconds: 61, Violations: "x"})
	for _, want := range []string{"messages       10", "DLQ            0 {poison=1}", "lost           0", "{down=1 throttle=3}",
		"{SIGKILL=2}", "peak RSS       3.0 MiB", "wall time      1m1s", "VIOLATIONS     x"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
}
