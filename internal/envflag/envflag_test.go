package envflag

import (
	"bytes"
	"flag"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	url := fs.String("queue-url", "", "queue")
	wait := fs.Duration("wait-time", time.Second, "wait")
	n := fs.Int("max-batch", 8, "batch")
	env := map[string]string{"QUEUE_URL": "from-env", "VRAMQ_WAIT_TIME": "5s", "VRAMQ_MAX_BATCH": "4", "WAIT_TIME": "9s"}
	if err := Parse(fs, []string{"-max-batch=2"}, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *url != "from-env" || *wait != 5*time.Second || *n != 2 {
		t.Errorf("got %q %v %d; want the environment where no flag was given, the flag where it was", *url, *wait, *n)
	}

	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Duration("wait-time", time.Second, "wait")
	err := Parse(fs, nil, func(k string) string { return map[string]string{"VRAMQ_WAIT_TIME": "soon"}[k] })
	if err == nil || !strings.Contains(err.Error(), "VRAMQ_WAIT_TIME") || !strings.Contains(err.Error(), "-wait-time") {
		t.Errorf("bad environment value: %v; want an error naming the variable and the flag", err)
	}
}

func TestUsageListsVariables(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	fs.String("dlq-url", "", "the DLQ")
	if err := Parse(fs, []string{"-h"}, func(string) string { return "" }); err != flag.ErrHelp {
		t.Fatalf("-h: %v", err)
	}
	if !strings.Contains(out.String(), "-dlq-url") || !strings.Contains(out.String(), "$DLQ_URL") {
		t.Errorf("usage does not show the flag and its variable:\n%s", out.String())
	}
}

func TestList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{" , ,", nil},
		{"a", []string{"a"}},
		{" a, b ,,c ", []string{"a", "b", "c"}},
	} {
		if got := List(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
