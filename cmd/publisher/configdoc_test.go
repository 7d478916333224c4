package main

import (
	"flag"
	"io"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/envflag"
)

var update = flag.Bool("update", false, "rewrite the flag table of docs/configuration.md from the flag set (make docs)")

// docs/configuration.md's table of the publisher's flags is what the flag set
// says; make docs rewrites it.
func TestConfigurationDoc(t *testing.T) {
	const path = "../../docs/configuration.md"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := envflag.UpdateReferences(doc, newFlagSet(&options{}, io.Discard))
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
		t.Errorf("%s differs from the publisher's flags; run make docs (-flags +doc):\n%s", path, diff)
	}
}
