package logscrape

import (
	"os"
	"testing"
	"time"
)

// The log writer counts the SDK's retried receives in whole lines, however
// the process's output is split into writes, and knows when the process has
// written its first line.
func TestLogWriter(t *testing.T) {
	f, err := os.Create(t.TempDir() + "/log")
	if err != nil {
		t.Fatal(err)
	}
	w := New(f)
	before := time.Now()
	if w.Started() {
		t.Error("started before any line")
	}
	line := `time=x level=WARN msg="` + RetryMark + `, attempt 2" component=aws-sdk` + "\n"
	other := "time=x level=WARN msg=\"retrying request SQS/SendMessageBatch, attempt 2\"\n"
	for _, part := range []string{line[:20], line[20:] + other[:5], other[5:] + line} {
		if _, err := w.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	if !w.Started() {
		t.Error("not started after three lines")
	}
	if n := w.RetriesSince(before); n != 2 {
		t.Errorf("%d retried receives counted, want 2", n)
	}
	if n := w.RetriesSince(time.Now().Add(time.Second)); n != 0 {
		t.Errorf("%d retried receives after now", n)
	}
	w.Close()
	b, _ := os.ReadFile(f.Name())
	if string(b) != line+other+line {
		t.Errorf("the file holds %q", b)
	}
}
