package nvml

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramq/vramq/gpu"
)

func TestOpenSim(t *testing.T) {
	d, err := Open("sim", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	m, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if !d.Simulated() || m.Total != 1<<30 || m.Free != 1<<30 {
		t.Errorf("Open(sim): simulated %v, %+v", d.Simulated(), m)
	}
	if _, err := Open("sim", 0); err == nil {
		t.Error("Open(sim, 0): no error")
	}
}

func TestOpenAuto(t *testing.T) {
	d, err := Open("auto", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t.Logf("auto opened %s (simulated %v)", d.Name(), d.Simulated())
	if _, nvmlErr := OpenIndex(0); (nvmlErr != nil) != d.Simulated() {
		t.Errorf("auto gave simulated=%v, but OpenIndex(0) err = %v", d.Simulated(), nvmlErr)
	}
}

func TestOpenNVMLSpecs(t *testing.T) {
	d, err := Open("nvml:0", 0)
	if err != nil {
		if !errors.Is(err, gpu.ErrNoDevice) {
			t.Errorf("Open(nvml:0) = %v, want a device or ErrNoDevice", err)
		}
	} else {
		if d.Simulated() {
			t.Errorf("Open(nvml:0) gave a simulated device")
		}
		d.Close()
	}
	// cuda:N is CUDA's numbering (gpu.Spec), which NVML cannot give: it
	// is refused, and not as a missing device, so "auto" never hides it.
	if d, err := Open("cuda:0", 0); err == nil {
		d.Close()
		t.Error("Open(cuda:0): no error; NVML cannot number GPUs CUDA's way")
	} else if errors.Is(err, gpu.ErrNoDevice) || !strings.Contains(err.Error(), "nvml:0") {
		t.Errorf("Open(cuda:0) = %v, want an error that is not ErrNoDevice and points at nvml:0", err)
	}
}

func TestOpenBadSpecs(t *testing.T) {
	for _, spec := range []string{"", "gpu", "SIM", "cuda", "cuda:", "cuda:-1", "cuda:+1", "cuda:x", "nvml:1.5", "rocm:0", " sim"} {
		d, err := Open(spec, 1<<30)
		if err == nil {
			d.Close()
			t.Errorf("Open(%q): no error", spec)
			continue
		}
		if errors.Is(err, gpu.ErrNoDevice) {
			t.Errorf("Open(%q) = %v: a bad spec must not read as a missing device", spec, err)
		}
		if !strings.Contains(err.Error(), `"cuda:N"`) {
			t.Errorf("Open(%q) error %q does not list the valid forms", spec, err)
		}
	}
}
