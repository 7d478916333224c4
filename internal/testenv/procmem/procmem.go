// Package procmem reads a process's memory from /proc, for the soak and
// the tests that check a subscriber's memory stays bounded.
package procmem

import "github.com/prometheus/procfs"

// Peak is process pid's peak resident set size (VmHWM), in bytes.
func Peak(pid int) (int64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.NewStatus()
	return int64(st.VmHWM), err
}
