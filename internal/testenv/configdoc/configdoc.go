// Package configdoc checks the generated flag tables of
// docs/configuration.md against a command's flag sets, for the commands'
// TestConfigurationDoc, and rewrites them under -update (make docs).
package configdoc

import (
	"flag"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Check fails t where the tables in the file at path differ from what sets
// say, naming who (the command) in the message; with update it writes the
// file instead.
func Check(t testing.TB, path, who string, update bool, sets ...*flag.FlagSet) {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := UpdateReferences(doc, sets...)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if diff := cmp.Diff(string(want), string(doc)); diff != "" {
		t.Errorf("%s differs from the %s's flags; run make docs (-flags +doc):\n%s", path, who, diff)
	}
}
