package rss

import (
	"github.com/prometheus/procfs"
)

// memSample is a process's memory as /proc/<pid>/status reports it, in
// bytes: VmRSS, resident now, and VmHWM, the most it has been resident.
type memSample struct {
	RSS, HWM uint64
}

// readMem reads process pid's memory from the proc file system fs.
func readMem(fs procfs.FS, pid int) (memSample, error) {
	p, err := fs.Proc(pid)
	if err != nil {
		return memSample{}, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return memSample{}, err
	}
	return memSample{RSS: st.VmRSS, HWM: st.VmHWM}, nil
}

// memPeak follows samples of one process: the highest VmRSS sampled, and
// its VmHWM, which also catches a peak between two samples.
type memPeak struct {
	MaxRSS  uint64 `json:"max_rss_sampled_bytes"`
	HWM     uint64 `json:"vm_hwm_bytes"`
	Samples int    `json:"samples"`
}

func (m *memPeak) add(s memSample) {
	m.MaxRSS = max(m.MaxRSS, s.RSS)
	m.HWM = max(m.HWM, s.HWM)
	m.Samples++
}
