//go:build !cgo

package gpu

import "fmt"

// OpenNVML always fails in this build: go-nvml binds NVML through cgo, and
// this binary was built with CGO_ENABLED=0. The error wraps ErrNoDevice so
// that "auto" still falls back to the simulator.
func OpenNVML(index int) (Device, error) {
	return nil, fmt.Errorf("%w: nvml: device %d: NVML needs a cgo build (this binary was built with CGO_ENABLED=0)", ErrNoDevice, index)
}

// OpenNVMLByUUID always fails in this build, as OpenNVML does.
func OpenNVMLByUUID(uuid string) (Device, error) {
	return nil, fmt.Errorf("%w: nvml: device %s: NVML needs a cgo build (this binary was built with CGO_ENABLED=0)", ErrNoDevice, uuid)
}
