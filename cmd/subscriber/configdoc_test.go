//go:build !cuda

// The CUDA build's -device has its own usage text (backend_cuda.go); the
// reference is generated from the default build's flags.

package main

import (
	"flag"
	"io"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/envflag"
)

var update = flag.Bool("update", false, "rewrite the flag tables of docs/configuration.md from the flag sets (make docs)")

// docs/configuration.md's tables of the subscriber's flags are what the flag
// sets say; make docs rewrites them.
func TestConfigurationDoc(t *testing.T) {
	const path = "../../docs/configuration.md"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := envflag.UpdateReferences(doc, newFlagSet(&options{}, io.Discard), newHealthcheckFlagSet(&healthcheckOptions{}, io.Discard))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if diff := cmp.Diff(string(want), string(doc)); diff != "" {
		t.Errorf("%s differs from the subscriber's flags; run make docs (-flags +doc):\n%s", path, diff)
	}
}
