package main

import (
	"strconv"
	"strings"
)

// The runtime's memory limit (debug.SetMemoryLimit) makes the garbage
// collector work harder as the heap nears it, instead of letting a burst of
// requests grow the heap past the container's memory and get the task
// OOM-killed. It is soft: what bounds the requests' memory is the publisher's
// budget of bodies in flight (-max-inflight-body-bytes); the limit makes the
// garbage of finished requests go before it counts. We choose it here, not
// through GOMEMLIMIT in the task definition, so that it follows the
// container's real size wherever the binary runs, in this order:
//
//  1. -memory-limit (VRAMQ_MEMORY_LIMIT), when set;
//  2. GOMEMLIMIT, when set: the runtime has applied it already, and an
//     operator who set it meant it;
//  3. under Lambda, the function's memory (AWS_LAMBDA_FUNCTION_MEMORY_SIZE);
//  4. the cgroup's memory limit (v2 memory.max, else v1
//     memory.limit_in_bytes), which is the task's memory on ECS and Fargate;
//
// each of 3 and 4 less a tenth, for what the Go runtime does not count (the
// binary, C libraries, kernel buffers). With none of them there is no limit,
// as before.
const memoryHeadroom = 10 // per cent of the container's memory left out

// cgroupMemoryFiles are where Linux states the memory limit of this
// process's cgroup, for cgroup v2 and v1; tests replace them.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// memoryLimit is the limit to set and where it comes from; 0 means leave
// the runtime's as it is.
func memoryLimit(flagged int64, getenv func(string) string, readFile func(string) ([]byte, error)) (int64, string) {
	switch {
	case flagged > 0:
		return flagged, "-memory-limit"
	case getenv("GOMEMLIMIT") != "":
		return 0, "GOMEMLIMIT"
	}
	less := func(n int64) int64 { return n - n*memoryHeadroom/100 }
	if mb, err := strconv.ParseInt(getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"), 10, 64); err == nil && mb > 0 {
		return less(mb << 20), "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"
	}
	for _, f := range cgroupMemoryFiles {
		b, err := readFile(f)
		if err != nil {
			continue
		}
		// "max" (v2) or a huge number (v1) when there is no limit.
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil && n > 0 && n < 1<<60 {
			return less(n), f
		}
		return 0, ""
	}
	return 0, ""
}
