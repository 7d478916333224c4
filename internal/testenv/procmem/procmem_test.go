package procmem

import (
	"os"
	"runtime"
	"testing"
)

// The test's own peak is at least what it has just touched.
func TestPeakOfThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	buf := make([]byte, 32<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	peak, err := Peak(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if peak < int64(len(buf)) {
		t.Errorf("peak RSS %d bytes after touching %d", peak, len(buf))
	}
	runtime.KeepAlive(buf)
}
