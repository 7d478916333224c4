//go:build !unix

package bert

import "time"

// processCPU is not measured here; benchmarks report 0 CPU time.
func processCPU() time.Duration { return 0 }
