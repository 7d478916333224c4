package testenv

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// The binaries that ship link nothing of the harness, nor package testing
// (lambdart and sqstest take a testing.TB), nor vek (model/bert's matrix
// products are its own FMA kernel or gonum's).
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
		if strings.HasPrefix(p, "github.com/vramq/vramq/internal/testenv") || p == "testing" ||
			strings.HasPrefix(p, "github.com/viterin/vek") {
			t.Errorf("a shipped binary links %s", p)
		}
	}
}

// The harness's own dependencies (plots, the progress bar, the providers' SDKs
// its sdkclients tests run, issue 32) stay in harness/go.mod: the product's
// go.mod, whose requirements a library user inherits, names none of them.
// (go list -m all still shows a gonum/plot: gonum's go.mod requires one.)
func TestHarnessModulesOutOfProduct(t *testing.T) {
	out, err := exec.Command("go", "mod", "edit", "-json").Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct{ Require []struct{ Path string } }
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	if len(mod.Require) < 10 {
		t.Fatalf("go.mod requires %d modules: %s", len(mod.Require), out)
	}
	for _, r := range mod.Require {
		switch r.Path {
		case "gonum.org/v1/plot", "github.com/schollz/progressbar/v3", "golang.org/x/term",
			"github.com/openai/openai-go/v3", "github.com/anthropics/anthropic-sdk-go/v2":
			t.Errorf("the product's go.mod requires %s, which only the harness uses", r.Path)
		case "github.com/hashicorp/hcl/v2", "github.com/zclconf/go-cty":
			t.Errorf("the product's go.mod requires %s, which only infra's tests use (infra/go.mod)", r.Path)
		}
	}
}
