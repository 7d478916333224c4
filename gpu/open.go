package gpu

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

var (
	// ErrNoDevice is wrapped by the errors that mean there is no usable
	// device here at all: no driver, no NVML library, no device at that
	// index, or a build without NVML support. "auto" falls back to the
	// simulator on it and on nothing else.
	ErrNoDevice = errors.New("gpu: no device")
	// ErrClosed is returned by a device or model used after Close.
	ErrClosed = errors.New("gpu: closed")
)

// DeviceSpecs lists the specs Open accepts, for flag help and error messages.
const DeviceSpecs = `"sim", "auto", "cuda:N" or "nvml:N" (N a device index, 0 first)`

// Open opens the device a spec names:
//
//   - "sim": NewSim(simCapacity);
//   - "cuda:N" or "nvml:N": OpenNVML(N), the memory of GPU N as NVML reports it;
//   - "auto": NVML device 0 if there is one, else NewSim(simCapacity).
//
// "cuda:N" is NVML's index N, which is CUDA's only under
// CUDA_DEVICE_ORDER=PCI_BUS_ID and without CUDA_VISIBLE_DEVICES; a container
// given one GPU sees it as 0 in both.
//
// A device only reports memory; it does not place the model there. The
// default build runs the CPU reference model, whose memory is not on any GPU,
// so it should run on "sim" with the Sim as its Allocator.
func Open(spec string, simCapacity int64) (Device, error) {
	openSim := func() (Device, error) {
		if simCapacity <= 0 {
			return nil, fmt.Errorf("gpu: device %q: the simulated device needs a positive capacity, got %d", spec, simCapacity)
		}
		return NewSim(simCapacity), nil
	}
	switch spec {
	case "sim":
		return openSim()
	case "auto":
		d, err := OpenNVML(0)
		if errors.Is(err, ErrNoDevice) {
			return openSim()
		}
		return d, err
	}
	kind, index, ok := strings.Cut(spec, ":")
	if ok && (kind == "cuda" || kind == "nvml") {
		n, err := strconv.Atoi(index)
		if err != nil || n < 0 || strings.HasPrefix(index, "+") {
			return nil, fmt.Errorf("gpu: device %q: index %q is not a device number; want %s", spec, index, DeviceSpecs)
		}
		return OpenNVML(n)
	}
	return nil, fmt.Errorf("gpu: unknown device %q; want %s", spec, DeviceSpecs)
}
