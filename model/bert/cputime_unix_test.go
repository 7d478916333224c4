//go:build unix

package bert

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process has used, all threads, user and
// system: on a machine shared with other jobs, throughput per CPU second
// moves far less than per wall second.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
