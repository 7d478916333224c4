package testenv

import (
	"os/exec"
	"strings"
	"testing"
)

// The binaries that ship link nothing of the harness, nor package testing
// (lambdart and sqstest take a testing.TB).
func TestNotShipped(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/vramq/vramq/cmd/publisher", "github.com/vramq/vramq/cmd/subscriber").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list named %d packages: %q", len(deps), deps)
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "github.com/vramq/vramq/internal/testenv") || p == "testing" {
			t.Errorf("a shipped binary links %s", p)
		}
	}
}
