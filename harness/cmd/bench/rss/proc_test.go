package rss

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/procfs"
)

// A status file as Linux writes it (trimmed): sizes in kB, which readMem
// must turn into bytes, and VmRSS told apart from VmHWM and the other Vm
// lines around them.
const statusFixture = `Name:	bench
Umask:	0022
State:	S (sleeping)
Tgid:	4242
Pid:	4242
PPid:	1
VmPeak:	 1300000 kB
VmSize:	 1250000 kB
VmLck:	       0 kB
VmHWM:	   30100 kB
VmRSS:	   29000 kB
RssAnon:	   12000 kB
RssFile:	   17000 kB
VmData:	   90000 kB
Threads:	9
`

func TestReadMem(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "4242"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "4242", "status"), []byte(statusFixture), 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := procfs.NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	got, err := readMem(fs, 4242)
	if want := (memSample{RSS: 29000 * 1024, HWM: 30100 * 1024}); err != nil || got != want {
		t.Errorf("readMem = %+v, %v; want %+v", got, err, want)
	}
	if _, err := readMem(fs, 4243); err == nil {
		t.Error("readMem of a process that is not there: no error")
	}
}

// The test's own process: its status is there and says something sane.
func TestReadMemOfALiveProcess(t *testing.T) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	got, err := readMem(fs, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got.RSS < 1<<20 || got.HWM < got.RSS {
		t.Errorf("own memory %+v: want at least 1 MiB resident and the high-water mark at or above it", got)
	}
}

func TestMemPeakKeepsTheHighest(t *testing.T) {
	var m memPeak
	for _, s := range []memSample{{RSS: 10, HWM: 12}, {RSS: 30, HWM: 31}, {RSS: 20, HWM: 31}} {
		m.add(s)
	}
	if want := (memPeak{MaxRSS: 30, HWM: 31, Samples: 3}); m != want {
		t.Errorf("memPeak = %+v, want %+v", m, want)
	}
}
