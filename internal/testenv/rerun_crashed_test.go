package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// What make test's go test lines print, a package a block (the crash's
// shape as CI printed it at 65cb67d: the runtime's fatal-signal report,
// goroutines, registers).
const (
	passed  = "ok  \tgithub.com/vramq/vramq/job\t1.0s\n?   \tgithub.com/vramq/vramq/subscriber/queue\t[no test files]\n"
	crashed = "=== RUN   TestX\nSIGSEGV: segmentation violation\nPC=0x1bab950 m=7 sigcode=1 addr=0x7fe848b00000\n\n" +
		"goroutine 0 gp=0xc000602fc0 m=7 mp=0xc000580808 [idle]:\nrip    0x1bab950\nexit status 2\nFAIL\tgithub.com/vramq/vramq/subscriber\t1.497s\n"
	testFailed = "--- FAIL: TestY (0.01s)\n    y_test.go:9: wrong\nFAIL\nFAIL\tgithub.com/vramq/vramq/publisher\t2.0s\n"
	// A nil dereference in Go code is a panic, its own failure.
	goFault = "panic: runtime error: invalid memory address or nil pointer dereference\n" +
		"[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x4a1b2c]\n\ngoroutine 7 [running]:\nFAIL\tgithub.com/vramq/vramq/gpu\t0.5s\n"
	// The race runtime's own assertion, as CI printed it at b85a1b2.
	tsanCheck = "ThreadSanitizer: CHECK failed: tsan_rtl.cpp:346 \"((exiting || thr->fast_state.epoch() == kEpochLast)) != (0)\" (0x0, 0x0) (tid=17895)\n" +
		"FAIL\tgithub.com/vramq/vramq/subscriber\t6.470s\n"
	// A crash report after a failed test in the same binary: the failure stands.
	failedThenCrashed = "--- FAIL: TestZ (0.01s)\nSIGSEGV: segmentation violation\nPC=0x1 m=0 sigcode=1 addr=0x0\nFAIL\tgithub.com/vramq/vramq/model/bert\t3.0s\n"
)

func TestRerunCrashed(t *testing.T) {
	for _, c := range []struct {
		name, log string
		rerunOK   bool   // what the second run does
		wantRerun string // the packages run again ("" none)
		wantExit  int
	}{
		{"a crash outside Go code, passing again", passed + crashed, true, "github.com/vramq/vramq/subscriber", 0},
		{"a crash outside Go code, crashing again", crashed + passed, false, "github.com/vramq/vramq/subscriber", 1},
		{"the race runtime's assertion, passing again", passed + tsanCheck, true, "github.com/vramq/vramq/subscriber", 0},
		{"a failed test", passed + testFailed, true, "", 1},
		{"a fault in Go code", goFault, true, "", 1},
		{"a crash after a failed test", failedThenCrashed, true, "", 1},
		{"a crash beside a failed test", crashed + testFailed, true, "github.com/vramq/vramq/subscriber", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "go-test.log")
			if err := os.WriteFile(log, []byte(c.log), 0o644); err != nil {
				t.Fatal(err)
			}
			// The command run again records its arguments and passes or fails.
			args := filepath.Join(dir, "args")
			rerun := filepath.Join(dir, "rerun")
			exitWith := "1"
			if c.rerunOK {
				exitWith = "0"
			}
			script := "#!/bin/sh\necho \"$@\" >" + args + "\nexit " + exitWith + "\n"
			if err := os.WriteFile(rerun, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("./rerun-crashed.sh", log, rerun, "-race", "-count=1")
			out, err := cmd.CombinedOutput()
			exit := 0
			if err != nil {
				ee, ok := err.(*exec.ExitError)
				if !ok {
					t.Fatalf("rerun-crashed.sh: %v\n%s", err, out)
				}
				exit = ee.ExitCode()
			}
			if exit != c.wantExit {
				t.Errorf("exit status %d, want %d; output:\n%s", exit, c.wantExit, out)
			}
			got, err := os.ReadFile(args)
			if os.IsNotExist(err) {
				got, err = nil, nil
			}
			if err != nil {
				t.Fatal(err)
			}
			want := ""
			if c.wantRerun != "" {
				want = "-race -count=1 " + c.wantRerun
			}
			if strings.TrimSpace(string(got)) != want {
				t.Errorf("ran again %q, want %q", strings.TrimSpace(string(got)), want)
			}
		})
	}
	// make test prints the crash's head last, where CI's tail shows it.
	dir := t.TempDir()
	log := filepath.Join(dir, "go-test.log")
	if err := os.WriteFile(log, []byte(passed+crashed), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("./rerun-crashed.sh", "crash-heads", log, filepath.Join(dir, "absent.log")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PC=0x1bab950 m=7") {
		t.Errorf("crash-heads: %v, printed:\n%s\nwant the crash's PC line", err, out)
	}
}
