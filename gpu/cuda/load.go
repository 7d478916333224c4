//go:build cuda

package cuda

import (
	"fmt"

	"gorgonia.org/cu"

	"github.com/vramq/vramq/gpu"
)

// int vramq_cu_status(const char **msg);
import "C"

// cudaDriverError is why the CUDA driver cannot be used, wrapping
// gpu.ErrNoDevice; nil when it can. libcuda.so.1 is loaded, and cuInit called, as
// the program starts (cudaload.c): a failure there is kept for here, so that
// the binary still starts without a driver.
func DriverError() error {
	var msg *C.char
	st := int(C.vramq_cu_status(&msg))
	switch {
	case st == 0:
		return nil
	case C.GoString(msg) != "":
		return fmt.Errorf("%w: the NVIDIA driver could not be loaded: %s", gpu.ErrNoDevice, C.GoString(msg))
	case st == -1:
		return fmt.Errorf("%w: the NVIDIA driver was loaded but cuInit never ran", gpu.ErrNoDevice)
	default:
		return fmt.Errorf("%w: the NVIDIA driver's cuInit failed: CUresult %d%s", gpu.ErrNoDevice, st, cuInitErrors[st])
	}
}

// CheckDevice reports, wrapping gpu.ErrNoDevice, why CUDA device index
// cannot be used: no driver, or no such device. Every model's constructor
// asks it before it creates a context.
func CheckDevice(index int) error {
	if err := DriverError(); err != nil {
		return err
	}
	n, err := cu.NumDevices()
	if err != nil {
		return fmt.Errorf("%w: cuda: counting devices: %v", gpu.ErrNoDevice, err)
	}
	if index < 0 || index >= n {
		return fmt.Errorf("%w: cuda: no device %d (%d found)", gpu.ErrNoDevice, index, n)
	}
	return nil
}

// cuInitErrors are cuda.h's names of what cuInit fails with, for messages.
var cuInitErrors = map[int]string{
	1: " (CUDA_ERROR_INVALID_VALUE)", 2: " (CUDA_ERROR_OUT_OF_MEMORY)", 3: " (CUDA_ERROR_NOT_INITIALIZED)",
	34:  " (CUDA_ERROR_STUB_LIBRARY: the toolkit's stub, not the driver, is on the library path)",
	100: " (CUDA_ERROR_NO_DEVICE)", 101: " (CUDA_ERROR_INVALID_DEVICE)", 999: " (CUDA_ERROR_UNKNOWN)",
	803: " (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)", 804: " (CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)",
}
