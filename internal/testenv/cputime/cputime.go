// Package cputime reads the CPU time this process has used, for benchmarks
// that report work per CPU second: on a machine shared with other jobs that
// moves far less than work per wall second. It is the kernel's count
// (getrusage), not the Go scheduler's: the runtime's /cpu/classes metrics
// count a processor as busy while its thread waits for a core, which on a
// loaded machine charges the waiting to the benchmark.
package cputime

import "time"

// Process is this process's user and system CPU time so far, all threads;
// 0 where the system does not say (then benchmarks report no CPU time).
func Process() time.Duration { return process() }
