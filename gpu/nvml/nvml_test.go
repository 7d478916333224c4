package nvml

import (
	"errors"
	"testing"

	"github.com/vramq/vramq/gpu"
)

// TestOpenNVML passes on both kinds of machine: without a driver (or in a
// CGO_ENABLED=0 build) it checks the error, with a GPU it checks the memory.
func TestOpenNVML(t *testing.T) {
	d, err := OpenIndex(0)
	if err != nil {
		if !errors.Is(err, gpu.ErrNoDevice) {
			t.Fatalf("OpenIndex(0) = %v, want an error wrapping gpu.ErrNoDevice", err)
		}
		t.Logf("no NVML device here: %v", err)
		return
	}
	t.Logf("opened %s", d.Name())
	if d.Simulated() {
		t.Error("an NVML device says it is simulated")
	}
	m, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memory: %+v", m)
	if m.Total <= 0 || m.Free < 0 || m.Free > m.Total || m.Process < 0 {
		t.Errorf("implausible gpu.MemInfo %+v", m)
	}
	if err := d.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := d.MemInfo(); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("gpu.MemInfo after Close: err = %v, want gpu.ErrClosed", err)
	}
}

func TestOpenNVMLBadIndex(t *testing.T) {
	if _, err := OpenIndex(-1); err == nil {
		t.Error("OpenIndex(-1): no error")
	}
	// No machine has this many GPUs; where NVML loads, the error must still
	// say "no device" so that callers can fall back.
	if _, err := OpenIndex(4096); !errors.Is(err, gpu.ErrNoDevice) {
		t.Errorf("OpenIndex(4096): err = %v, want gpu.ErrNoDevice", err)
	}
}
