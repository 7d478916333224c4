//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/vramq/vramq/gpu"
	"gorgonia.org/cu"
)

// The runtime's helpers for a model's forward pass on an Owner's goroutine.

// BufAlign is the alignment of each buffer inside a batch's one allocation:
// cuMemAlloc's own, so every buffer is as aligned as if allocated alone.
const BufAlign = 256

// Upload copies src to a new device buffer.
func Upload[T int32 | float32 | uint16](src []T) (cu.DevicePtr, error) {
	n := int64(len(src)) * int64(unsafe.Sizeof(src[0]))
	p, err := cu.MemAlloc(n)
	if err != nil {
		return 0, MapError(err)
	}
	if err := cu.MemcpyHtoD(p, unsafe.Pointer(&src[0]), n); err != nil {
		_ = cu.MemFree(p)
		return 0, err
	}
	return p, nil
}

// Launch starts fn on blocks blocks of threads threads, on the default
// stream. Every argument is 8 bytes, as cu passes them.
func Launch(fn cu.Function, blocks, threads int, args ...any) error {
	params := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		switch p := a.(type) {
		case *cu.DevicePtr:
			params[i] = unsafe.Pointer(p)
		case *int64:
			params[i] = unsafe.Pointer(p)
		case *float64:
			params[i] = unsafe.Pointer(p)
		default:
			panic(fmt.Sprintf("launch: argument %d is %T, want *cu.DevicePtr, *int64 or *float64", i, a))
		}
	}
	return fn.Launch(blocks, 1, 1, threads, 1, 1, 0, cu.Stream{}, params)
}

// Grid is how many blocks of 256 threads cover n elements, capped: the
// element-wise kernels loop over whatever a smaller grid leaves.
func Grid(n int64) int { return int(min((n+255)/256, 65535)) }

// Pow2 is the least power of two ≥ n, for kernels that reduce by halving.
func Pow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// MapError maps the driver's out-of-memory to gpu.ErrOutOfMemory, so
// callers never import cu to recognise it.
func MapError(err error) error {
	if errors.Is(err, cu.OutOfMemory) {
		return fmt.Errorf("%w: %w", gpu.ErrOutOfMemory, err)
	}
	return err
}

// stickyErrors are the CUDA errors after which the context is unusable:
// every later call in it fails the same way (the driver API's documentation
// of each says so), and only a new process can use the GPU again.
var stickyErrors = []error{cu.IllegalAddress, cu.LaunchFailed, cu.MisalignedAddress, cu.IllegalInstruction,
	cu.HardwareStackError, cu.InvalidAddressSpace, cu.InvalidPc, cu.Assert, cu.LaunchTimeout, cu.EccUncorrectable}

// Classify turns err, from a call on an Owner's goroutine, into
// gpu.ErrDeviceLost when the context is broken, and remembers it in lost,
// which keeps the first: later calls fail at once. what names the model and
// device. Whichever call reports a sticky error (a kernel's fault shows at
// the next synchronizing call, a cuBLAS call reports only its own status),
// the context itself answers with it, so it is asked.
func Classify(err error, what string, lost *atomic.Pointer[error]) error {
	cause := err
	if !IsSticky(err) {
		serr := cu.Synchronize()
		if !IsSticky(serr) {
			return err
		}
		cause = fmt.Errorf("%w (the context reports %w)", err, serr)
	}
	l := fmt.Errorf("%w: %s: %w", gpu.ErrDeviceLost, what, cause)
	lost.CompareAndSwap(nil, &l)
	return *lost.Load()
}

// IsSticky is whether err is one of the errors after which the context is
// unusable.
func IsSticky(err error) bool {
	for _, s := range stickyErrors {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
