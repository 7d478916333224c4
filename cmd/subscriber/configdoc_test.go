//go:build !cuda

// The CUDA build's -device has its own usage text (backend_cuda.go); the
// reference is generated from the default build's flags.

package main

import (
	"flag"
	"io"
	"testing"

	"github.com/vramq/vramq/internal/testenv/configdoc"
)

var update = flag.Bool("update", false, "rewrite the flag tables of docs/configuration.md from the flag sets (make docs)")

// docs/configuration.md's tables of the subscriber's flags are what the flag
// sets say; make docs rewrites them.
func TestConfigurationDoc(t *testing.T) {
	configdoc.Check(t, "../../docs/configuration.md", "subscriber", *update,
		newFlagSet(&options{}, io.Discard), newHealthcheckFlagSet(&healthcheckOptions{}, io.Discard))
}
