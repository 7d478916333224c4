package peakrss

import (
	"os"
	"os/exec"
	"testing"
)

// The sampler keeps the highest peak it was shown: the test's own process
// (a Go test binary, a few MiB) stays the peak after a small process
// (sleep) is noted, and a process that is gone (pid 0 never names one in
// /proc) leaves it as it was.
func TestSamplerKeepsThePeak(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	var s Sampler
	if s.Peak() != 0 {
		t.Fatalf("a new sampler's peak is %d", s.Peak())
	}
	s.Note(os.Getpid())
	own := s.Peak()
	if own < 1<<20 {
		t.Fatalf("own peak %d bytes: want at least 1 MiB", own)
	}
	small := exec.Command("sleep", "30")
	if err := small.Start(); err != nil {
		t.Skipf("no sleep to start: %v", err)
	}
	defer func() { _ = small.Process.Kill(); _ = small.Wait() }()
	s.Note(small.Process.Pid)
	s.Note(0)
	if s.Peak() != own {
		t.Errorf("noting a smaller process and a gone one moved the peak from %d to %d", own, s.Peak())
	}
}
