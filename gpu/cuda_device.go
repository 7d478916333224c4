//go:build cuda

package gpu

import (
	"errors"
	"fmt"

	"gorgonia.org/cu"
)

// CUDABackend is a GPU with the reference model loaded on it.
type CUDABackend struct {
	// Device reports the GPU's memory: NVML's view of the same GPU when
	// NVML answers (it also knows this process's share), else the CUDA
	// driver's.
	Device Device
	Model  *CUDAEmbedder
	// CrossCheck compares NVML's free memory with the driver's, read one
	// after the other at open; empty when NVML did not answer.
	CrossCheck string
}

// OpenCUDA loads the model shaped by cfg with weights w onto CUDA device
// index and opens that GPU's memory reports. NVML and CUDA may number GPUs
// differently, so the NVML device is found by the UUID CUDA gives.
func OpenCUDA(index int, w *EmbedWeights, cfg EmbedConfig) (*CUDABackend, error) {
	if err := cudaDriverError(); err != nil {
		return nil, err
	}
	b := &CUDABackend{}
	// NVML first, so that its free memory before and after the model loads
	// gives the model's whole footprint: the CUDA context and cuBLAS's
	// workspace as well as the weights.
	var nvmlErr error
	if id, err := cu.Device(index).UUID(); err != nil {
		nvmlErr = fmt.Errorf("%w: cuda: device %d: uuid: %v", ErrNoDevice, index, err)
	} else {
		b.Device, nvmlErr = OpenNVMLByUUID("GPU-" + id.String())
	}
	if nvmlErr != nil && !errors.Is(nvmlErr, ErrNoDevice) {
		return nil, nvmlErr
	}
	var before MemInfo
	if b.Device != nil {
		var err error
		if before, err = b.Device.MemInfo(); err != nil {
			b.Device.Close()
			return nil, err
		}
	}
	model, err := NewCUDAEmbedder(index, w, cfg)
	if err != nil {
		if b.Device != nil {
			b.Device.Close()
		}
		return nil, err
	}
	b.Model = model
	if b.Device == nil {
		b.Device = &driverDevice{m: model}
		b.CrossCheck = fmt.Sprintf("NVML unavailable (%v): memory from the CUDA driver, per-process usage unknown", nvmlErr)
		return b, nil
	}
	after, err := b.Device.MemInfo()
	if err != nil {
		b.Close()
		return nil, err
	}
	// Another process allocating meanwhile would inflate this; the
	// weights are the floor.
	model.resident = max(before.Free-after.Free, model.weights)
	free, _, err := model.MemGetInfo()
	if err != nil {
		b.Close()
		return nil, err
	}
	b.CrossCheck = fmt.Sprintf("free memory: NVML %s, CUDA driver %s (difference %s); the model holds %s (weights %s)",
		FormatBytes(after.Free), FormatBytes(free), FormatBytes(abs(after.Free-free)), FormatBytes(model.resident), FormatBytes(model.weights))
	return b, nil
}

// Close unloads the model and closes the device.
func (b *CUDABackend) Close() error {
	return errors.Join(b.Model.Close(), b.Device.Close())
}

func abs(x int64) int64 { return max(x, -x) }

// driverDevice reports memory through the CUDA driver, for machines where
// NVML does not answer (it ships with the driver, so rarely).
type driverDevice struct{ m *CUDAEmbedder }

func (d *driverDevice) Name() string    { return d.m.Device() }
func (d *driverDevice) Product() string { return d.m.product }
func (d *driverDevice) Simulated() bool { return false }
func (d *driverDevice) Close() error    { return nil }

func (d *driverDevice) MemInfo() (MemInfo, error) {
	free, total, err := d.m.MemGetInfo()
	if err != nil {
		return MemInfo{}, err
	}
	return MemInfo{Total: total, Free: free, Used: total - free}, nil
}
