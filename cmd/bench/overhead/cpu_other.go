//go:build !unix

package overhead

import "time"

// processCPU is 0 where getrusage is not available: the timeline then
// reports no CPU for the process.
func processCPU() time.Duration { return 0 }
