//go:build cgo

package nvml

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vramq/vramq/gpu"
)

// nvmlDevice reads a real GPU's memory through NVML. NVML is loaded from the
// driver's libnvidia-ml.so.1 at run time, so this builds and runs on machines
// without a driver, where OpenIndex fails with gpu.ErrNoDevice.
type nvmlDevice struct {
	name    string
	product string // the GPU's product name, e.g. "NVIDIA H100 80GB HBM3"

	// mu keeps MemInfo from calling NVML after Close has shut it down.
	mu     sync.RWMutex
	dev    gonvml.Device
	closed bool
}

var _ gpu.ProductNamer = (*nvmlDevice)(nil)

// OpenIndex opens GPU index (NVML's numbering, PCI bus order) to read its
// memory. It fails with an error wrapping gpu.ErrNoDevice when NVML cannot be
// loaded or initialised (no driver) or there is no GPU at index. Each open
// device holds an NVML initialisation until Close; NVML counts them, so
// several may be open at once.
func OpenIndex(index int) (gpu.Device, error) {
	if index < 0 {
		return nil, fmt.Errorf("nvml: device index %d is negative", index)
	}
	if ret := gonvml.Init(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvml: init: %v (is the NVIDIA driver installed and its library on the loader path?)", gpu.ErrNoDevice, ret)
	}
	dev, ret := gonvml.DeviceGetHandleByIndex(index)
	switch ret {
	case gonvml.SUCCESS:
	case gonvml.ERROR_INVALID_ARGUMENT, gonvml.ERROR_NOT_FOUND:
		count, _ := gonvml.DeviceGetCount()
		gonvml.Shutdown()
		return nil, fmt.Errorf("%w: nvml: no device %d (%d found): %v", gpu.ErrNoDevice, index, count, ret)
	default:
		gonvml.Shutdown()
		return nil, fmt.Errorf("nvml: device %d: %v", index, ret)
	}
	d, err := describeNVMLDevice(dev, strconv.Itoa(index))
	if err != nil {
		gonvml.Shutdown()
		return nil, err
	}
	return d, nil
}

// OpenUUID opens the GPU whose UUID is uuid ("GPU-" and 36 hex digits
// and dashes, as nvidia-smi -L and the CUDA driver give it). It is how a
// CUDA device finds its NVML counterpart: the two number GPUs differently
// unless CUDA_DEVICE_ORDER=PCI_BUS_ID. Errors are as OpenIndex's.
func OpenUUID(uuid string) (gpu.Device, error) {
	if ret := gonvml.Init(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvml: init: %v (is the NVIDIA driver installed and its library on the loader path?)", gpu.ErrNoDevice, ret)
	}
	dev, ret := gonvml.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		gonvml.Shutdown()
		if ret == gonvml.ERROR_NOT_FOUND || ret == gonvml.ERROR_INVALID_ARGUMENT {
			return nil, fmt.Errorf("%w: nvml: no device %s: %v", gpu.ErrNoDevice, uuid, ret)
		}
		return nil, fmt.Errorf("nvml: device %s: %v", uuid, ret)
	}
	d, err := describeNVMLDevice(dev, uuid)
	if err != nil {
		gonvml.Shutdown()
		return nil, err
	}
	return d, nil
}

// describeNVMLDevice names dev (id is its index or UUID, for messages).
func describeNVMLDevice(dev gonvml.Device, id string) (*nvmlDevice, error) {
	name, ret := dev.GetName()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("nvml: device %s: name: %v", id, ret)
	}
	// Read memory once now so that a device that cannot report it fails
	// here, at startup, rather than at the first admission decision.
	if _, ret := dev.GetMemoryInfo(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("nvml: device %s (%s): memory info: %v", id, name, ret)
	}
	return &nvmlDevice{name: fmt.Sprintf("%s (%s)", name, id), product: name, dev: dev}, nil
}

func (d *nvmlDevice) Name() string { return d.name }

// Product is the GPU's product name, shared by every GPU of its kind.
func (d *nvmlDevice) Product() string { return d.product }

func (d *nvmlDevice) Simulated() bool { return false }

// MemInfo reads the device's memory. Process is this process's share as
// NVML's list of compute processes reports it, and 0 when NVML cannot say:
// the query is unsupported, not permitted, or, inside a container with its
// own PID namespace, lists host PIDs that never match ours.
func (d *nvmlDevice) MemInfo() (gpu.MemInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return gpu.MemInfo{}, fmt.Errorf("nvml: %s: %w", d.name, gpu.ErrClosed)
	}
	mem, ret := d.dev.GetMemoryInfo()
	if ret != gonvml.SUCCESS {
		return gpu.MemInfo{}, fmt.Errorf("nvml: %s: memory info: %v", d.name, ret)
	}
	return gpu.MemInfo{
		Total:   int64(mem.Total),
		Free:    int64(mem.Free),
		Used:    int64(mem.Used),
		Process: d.processMemory(),
	}, nil
}

func (d *nvmlDevice) processMemory() int64 {
	procs, ret := d.dev.GetComputeRunningProcesses()
	if ret != gonvml.SUCCESS {
		return 0
	}
	pid := uint32(os.Getpid())
	var n int64
	for _, p := range procs {
		// NVML reports NVML_VALUE_NOT_AVAILABLE (all ones) where it cannot
		// measure, e.g. under Windows WDDM; adding it would go negative.
		if p.Pid == pid && p.UsedGpuMemory != math.MaxUint64 {
			n += int64(p.UsedGpuMemory)
		}
	}
	return n
}

// Close releases this device's NVML initialisation. Later calls do nothing.
func (d *nvmlDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if ret := gonvml.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml: %s: shutdown: %v", d.name, ret)
	}
	return nil
}
