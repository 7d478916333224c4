//go:build cuda

package cuda

import (
	"errors"
	"fmt"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/nvml"
	"github.com/vramq/vramq/internal/bytesize"

	"gorgonia.org/cu"
)

// Model is a model OpenDevice loads onto a GPU.
type Model interface {
	Device() string
	Product() string
	Weights() int64
	MemGetInfo() (free, total int64, err error)
	Close() error
}

// OpenDevice opens the memory reports of CUDA device index and loads a
// model onto it with load. NVML and CUDA may number GPUs differently, so
// the NVML device is found by the UUID CUDA gives; without NVML the
// device's memory is the CUDA driver's, read through the model's context.
// It returns the device, the model's footprint (NVML's free memory before
// load less after: the CUDA context and cuBLAS's workspace as well as the
// weights; 0 without NVML) and a line comparing NVML's free memory with the
// driver's. On error nothing is left open.
func OpenDevice(index int, load func() (Model, error)) (dev gpu.Device, footprint int64, crossCheck string, err error) {
	if err := DriverError(); err != nil {
		return nil, 0, "", err
	}
	var nv gpu.Device
	// NVML first, so that its free memory before and after the model loads
	// gives the model's whole footprint: the CUDA context and cuBLAS's
	// workspace as well as the weights.
	var nvmlErr error
	if id, err := cu.Device(index).UUID(); err != nil {
		nvmlErr = fmt.Errorf("%w: cuda: device %d: uuid: %v", gpu.ErrNoDevice, index, err)
	} else {
		nv, nvmlErr = nvml.OpenUUID("GPU-" + id.String())
	}
	if nvmlErr != nil && !errors.Is(nvmlErr, gpu.ErrNoDevice) {
		return nil, 0, "", nvmlErr
	}
	var before gpu.MemInfo
	if nv != nil {
		var err error
		if before, err = nv.MemInfo(); err != nil {
			nv.Close()
			return nil, 0, "", err
		}
	}
	model, err := load()
	if err != nil {
		if nv != nil {
			nv.Close()
		}
		return nil, 0, "", err
	}
	if nv == nil {
		return &driverDevice{m: model}, 0,
			fmt.Sprintf("NVML unavailable (%v): memory from the CUDA driver, per-process usage unknown", nvmlErr), nil
	}
	closeAll := func() { _ = errors.Join(model.Close(), nv.Close()) }
	after, err := nv.MemInfo()
	if err != nil {
		closeAll()
		return nil, 0, "", err
	}
	footprint = before.Free - after.Free
	free, _, err := model.MemGetInfo()
	if err != nil {
		closeAll()
		return nil, 0, "", err
	}
	crossCheck = fmt.Sprintf("free memory: NVML %s, CUDA driver %s (difference %s); the model holds %s (weights %s)",
		bytesize.Format(after.Free), bytesize.Format(free), bytesize.Format(abs(after.Free-free)),
		bytesize.Format(max(footprint, model.Weights())), bytesize.Format(model.Weights()))
	return nv, footprint, crossCheck, nil
}

func abs(x int64) int64 { return max(x, -x) }

// driverDevice reports memory through the CUDA driver, for machines where
// NVML does not answer (it ships with the driver, so rarely).
type driverDevice struct{ m Model }

var _ gpu.ProductNamer = (*driverDevice)(nil)

func (d *driverDevice) Name() string    { return d.m.Device() }
func (d *driverDevice) Product() string { return d.m.Product() }
func (d *driverDevice) Simulated() bool { return false }
func (d *driverDevice) Close() error    { return nil }

func (d *driverDevice) MemInfo() (gpu.MemInfo, error) {
	free, total, err := d.m.MemGetInfo()
	if err != nil {
		return gpu.MemInfo{}, err
	}
	return gpu.MemInfo{Total: total, Free: free, Used: total - free}, nil
}
