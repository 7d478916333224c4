// Package nvml reads a real GPU's memory through NVML, the NVIDIA driver's
// management library (go-nvml, cgo). NVML is loaded from the driver at run
// time, so this builds and runs on machines without one, where opening a
// device fails with gpu.ErrNoDevice; a build without cgo always fails so.
package nvml

import (
	"errors"
	"fmt"

	"github.com/vramq/vramq/gpu"
)

// Open opens the device a spec names (see gpu.Spec):
//
//   - "sim": gpu.NewSim(simCapacity);
//   - "nvml:N": OpenIndex(N), the memory of GPU N as NVML numbers it;
//   - "auto": NVML device 0 if there is one, else gpu.NewSim(simCapacity).
//
// "cuda:N" is refused: it is GPU N in CUDA's numbering, which only the CUDA
// backend (cuda.OpenDevice) can map to its NVML device.
//
// A device only reports memory; it does not place the model there. The
// default build runs the CPU reference model, whose memory is not on any GPU,
// so it should run on "sim" with the Sim as its Allocator.
func Open(spec string, simCapacity int64) (gpu.Device, error) {
	s, err := gpu.ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	openSim := func() (gpu.Device, error) {
		if simCapacity <= 0 {
			return nil, fmt.Errorf("gpu: device %q: the simulated device needs a positive capacity, got %d", spec, simCapacity)
		}
		return gpu.NewSim(simCapacity), nil
	}
	switch s.Kind {
	case "sim":
		return openSim()
	case "auto":
		d, err := OpenIndex(0)
		if errors.Is(err, gpu.ErrNoDevice) {
			return openSim()
		}
		return d, err
	case "nvml":
		return OpenIndex(s.Index)
	}
	return nil, fmt.Errorf("nvml: device %q is GPU %d in CUDA's numbering, which NVML does not know: "+
		"open it with the CUDA backend (cuda.OpenDevice), or name it nvml:%d, NVML's numbering, if that is the same GPU",
		spec, s.Index, s.Index)
}
