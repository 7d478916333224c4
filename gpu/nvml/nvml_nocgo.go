//go:build !cgo

package nvml

import (
	"fmt"

	"github.com/vramq/vramq/gpu"
)

// OpenIndex always fails in this build: go-nvml binds NVML through cgo, and
// this binary was built with CGO_ENABLED=0. The error wraps gpu.ErrNoDevice so
// that "auto" still falls back to the simulator.
func OpenIndex(index int) (gpu.Device, error) {
	return nil, fmt.Errorf("%w: nvml: device %d: NVML needs a cgo build (this binary was built with CGO_ENABLED=0)", gpu.ErrNoDevice, index)
}

// OpenUUID always fails in this build, as OpenIndex does.
func OpenUUID(uuid string) (gpu.Device, error) {
	return nil, fmt.Errorf("%w: nvml: device %s: NVML needs a cgo build (this binary was built with CGO_ENABLED=0)", gpu.ErrNoDevice, uuid)
}
