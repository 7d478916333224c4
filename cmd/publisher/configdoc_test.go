package main

import (
	"flag"
	"io"
	"testing"

	"github.com/vramq/vramq/internal/testenv/configdoc"
)

var update = flag.Bool("update", false, "rewrite the flag table of docs/configuration.md from the flag set (make docs)")

// docs/configuration.md's table of the publisher's flags is what the flag set
// says; make docs rewrites it.
func TestConfigurationDoc(t *testing.T) {
	configdoc.Check(t, "../../docs/configuration.md", "publisher", *update, newFlagSet(&options{}, io.Discard))
}
