package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/cli"
)

// The dispatcher refuses a missing or unknown subcommand as a usage error,
// and hands each known one its own arguments: -h reaches the subcommand's
// flag set, which prints that subcommand's usage.
func TestRunDispatches(t *testing.T) {
	for _, args := range [][]string{nil, {"bogus"}, {"-h"}} {
		if err := run(t.Context(), args, &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, cli.ErrUsage) {
			t.Errorf("run(%q) = %v, want a usage error", args, err)
		}
	}
	for _, sub := range []string{"strategies", "sweep", "overhead", "rss", "latency"} {
		var stderr bytes.Buffer
		err := run(t.Context(), []string{sub, "-h"}, &bytes.Buffer{}, &stderr)
		if !errors.Is(err, cli.ErrUsage) || !strings.HasPrefix(stderr.String(), "Usage of bench "+sub+":") {
			t.Errorf("bench %s -h: %v, usage %.40q; want that subcommand's usage", sub, err, stderr.String())
		}
	}
}
