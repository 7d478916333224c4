package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/cli"
)

// -bert names a model directory whose cost the timed model takes; one the
// loader refuses is a usage error with the loader's reason, before any
// queue is touched.
func TestStrategiesBERTFlag(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	err := runStrategies(t.Context(), []string{"-bert", t.TempDir(), "-out", ""}, &bytes.Buffer{}, &bytes.Buffer{})
	if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("-bert of an empty directory: %v, want a usage error naming config.json", err)
	}
}
