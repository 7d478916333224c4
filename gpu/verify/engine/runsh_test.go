package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// run.sh parses, passes shellcheck where it is installed, and its engine
// lines, run with a stand-in engine, pass the flags (VRAMQ_ENGINE_FLAGS
// split into words), append the section to results.md, and fail the run
// when the engine fails.
func TestRunScriptEngineLines(t *testing.T) {
	script := filepath.Join("..", "run.sh")
	if out, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n run.sh: %v\n%s", err, out)
	}
	if sc, err := exec.LookPath("shellcheck"); err == nil {
		if out, err := exec.Command(sc, script).CombinedOutput(); err != nil {
			t.Errorf("shellcheck run.sh: %v\n%s", err, out)
		}
	} else {
		t.Log("shellcheck not installed: run.sh checked by bash -n only")
	}
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	i, j := strings.Index(src, "# The model-server path against a real engine"), strings.LastIndex(src, `cat "$res"`)
	if i < 0 || j < i {
		t.Fatal("run.sh: the engine lines are not where this test looks for them")
	}
	for _, c := range []struct {
		rc       string
		wantFail string
	}{{"0", "0"}, {"1", "1"}} {
		here, out := t.TempDir(), t.TempDir()
		engine := "#!/bin/sh\n{ echo '## stand-in section'; echo \"args: $*\"; } >\"$ENGINE_OUT\"\nexit " + c.rc + "\n"
		if err := os.WriteFile(filepath.Join(here, "engine"), []byte(engine), 0o755); err != nil {
			t.Fatal(err)
		}
		// wanted is run.sh's filter of the checks named on its command
		// line: none named here, so every step runs, the engine too.
		prelude := `set -uo pipefail; here=$1; out=$2; log=$out/log.txt; res=$out/results.md; python=python3; fail=0
wanted() { return 0; }
echo '# results' >"$res"
`
		cmd := exec.Command("bash", "-c", prelude+src[i:j]+"\necho \"fail=$fail\"\n", "bash", here, out)
		cmd.Env = append(os.Environ(), "ENGINE_OUT="+filepath.Join(out, "engine.md"), "VRAMQ_ENGINE_FLAGS=-seqs 32  -phase 10s")
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("engine lines: %v\n%s", err, got)
		}
		if want := "fail=" + c.wantFail; !strings.Contains(string(got), want) {
			t.Errorf("engine exit %s: %q, want %s", c.rc, got, want)
		}
		res, _ := os.ReadFile(filepath.Join(out, "results.md"))
		wantArgs := "args: -dir " + here + "/engine-run -out " + out + "/engine.md -python python3 -phase 25s -seqs 32 -phase 10s"
		if !strings.HasPrefix(string(res), "# results\n\n## stand-in section\n") || !strings.Contains(string(res), wantArgs) {
			t.Errorf("results.md:\n%s\nwant the section appended, with %q", res, wantArgs)
		}
	}
}
