package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/cli"
)

// The log writer counts the SDK's retried receives in whole lines, however
// the process's output is split into writes, and knows when the process has
// written its first line.
func TestLogWriter(t *testing.T) {
	f, err := os.Create(t.TempDir() + "/log")
	if err != nil {
		t.Fatal(err)
	}
	w := &logWriter{f: f}
	before := time.Now()
	if w.started() {
		t.Error("started before any line")
	}
	line := `time=x level=WARN msg="` + retryMark + `, attempt 2" component=aws-sdk` + "\n"
	other := "time=x level=WARN msg=\"retrying request SQS/SendMessageBatch, attempt 2\"\n"
	for _, part := range []string{line[:20], line[20:] + other[:5], other[5:] + line} {
		if _, err := w.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	if !w.started() {
		t.Error("not started after three lines")
	}
	if n := w.retriesSince(before); n != 2 {
		t.Errorf("%d retried receives counted, want 2", n)
	}
	if n := w.retriesSince(time.Now().Add(time.Second)); n != 0 {
		t.Errorf("%d retried receives after now", n)
	}
	w.close()
	b, _ := os.ReadFile(f.Name())
	if string(b) != line+other+line {
		t.Errorf("the file holds %q", b)
	}
}

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
