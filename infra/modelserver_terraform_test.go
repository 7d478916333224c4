package infra_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTheModelServerModesApply runs testdata/model_server.tftest.hcl with
// terraform test against a mocked AWS provider: real Terraform evaluates the
// sidecar, the external endpoint and neither (this package's evaluator is
// go-cty's functions, not Terraform's type unification), and refuses both at
// once at plan time. It needs terraform >= 1.7 (mock providers) and the
// plugin mirror, and skips without them.
func TestTheModelServerModesApply(t *testing.T) {
	w := terraformWorkspace(t)
	out, err := exec.Command(w.terraform, "version", "-json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Version string `json:"terraform_version"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	if compareVersions(v.Version, "1.7.0") < 0 {
		t.Skipf("terraform %s has no mock providers (1.7)", v.Version)
	}
	dir := filepath.Join(t.TempDir(), "infra")
	if err := copyModules(".", dir, w.version); err != nil {
		t.Fatal(err)
	}
	// As TestTerraformValidate allows (knownNewerThanMirror): a 5.x mirror's
	// aws_region has name, not region.
	if compareVersions(w.version, "6.0.0") < 0 {
		p := filepath.Join(dir, "main.tf")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte("data.aws_region.current.region"), []byte("data.aws_region.current.name")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hcl, err := os.ReadFile("testdata/model_server.tftest.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tests"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tests", "model_server.tftest.hcl"), hcl, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, w.terraform, append([]string{"-chdir=" + dir}, args...)...)
		cmd.Env = w.env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("terraform %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("init", "-backend=false", "-input=false", "-no-color")
	out2 := run("test", "-no-color")
	if !strings.Contains(out2, "7 passed, 0 failed") {
		t.Errorf("terraform test:\n%s", out2)
	}
}
