package gpu

import (
	"fmt"
	"strconv"
	"strings"
)

// DeviceSpecs lists the forms ParseSpec accepts, for its error messages.
// Each opener takes only some of them (see Spec).
const DeviceSpecs = `"sim", "auto", "cuda:N" or "nvml:N" (N a device index, 0 first)`

// Spec names a device. Kind is one of:
//
//   - "sim": the simulated device (Sim), whose memory vramq accounts;
//   - "cuda": GPU Index in CUDA's numbering, the one CUDA_VISIBLE_DEVICES
//     and CUDA_DEVICE_ORDER govern: the GPU a CUDA backend (package cuda)
//     loads a model onto, whose memory it reads from NVML's view of the
//     same GPU, found by UUID;
//   - "nvml": GPU Index in NVML's numbering (PCI bus order, as nvidia-smi
//     lists them), whose memory package nvml reads without loading
//     anything onto it;
//   - "auto": nvml.Open's NVML device 0, else the simulator; cuda:0 in the
//     subscriber's CUDA build, the simulator in its CPU build.
//
// The two numberings agree only under CUDA_DEVICE_ORDER=PCI_BUS_ID without
// CUDA_VISIBLE_DEVICES (a container given one GPU sees it as 0 in both), so
// no opener reads one as the other: nvml.Open refuses "cuda:N", and the
// subscriber's -device (either build) "nvml:N".
type Spec struct {
	Kind  string // "sim", "auto", "cuda" or "nvml"
	Index int    // for "cuda" and "nvml"
}

// ParseSpec parses a device spec; see Spec.
func ParseSpec(s string) (Spec, error) {
	switch s {
	case "sim", "auto":
		return Spec{Kind: s}, nil
	}
	kind, index, ok := strings.Cut(s, ":")
	if ok && (kind == "cuda" || kind == "nvml") {
		n, err := strconv.Atoi(index)
		if err != nil || n < 0 || strings.HasPrefix(index, "+") {
			return Spec{}, fmt.Errorf("gpu: device %q: index %q is not a device number; want %s", s, index, DeviceSpecs)
		}
		return Spec{Kind: kind, Index: n}, nil
	}
	return Spec{}, fmt.Errorf("gpu: unknown device %q; want %s", s, DeviceSpecs)
}
