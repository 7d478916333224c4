package gpu

import (
	"errors"
	"strings"
	"testing"
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
	if _, nvmlErr := OpenNVML(0); (nvmlErr != nil) != d.Simulated() {
		t.Errorf("auto gave simulated=%v, but OpenNVML(0) err = %v", d.Simulated(), nvmlErr)
	}
}

func TestOpenNVMLSpecs(t *testing.T) {
	for _, spec := range []string{"cuda:0", "nvml:0"} {
		d, err := Open(spec, 0)
		if err != nil {
			if !errors.Is(err, ErrNoDevice) {
				t.Errorf("Open(%q) = %v, want a device or ErrNoDevice", spec, err)
			}
			continue
		}
		if d.Simulated() {
			t.Errorf("Open(%q) gave a simulated device", spec)
		}
		d.Close()
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
		if errors.Is(err, ErrNoDevice) {
			t.Errorf("Open(%q) = %v: a bad spec must not read as a missing device", spec, err)
		}
		if !strings.Contains(err.Error(), `"cuda:N"`) {
			t.Errorf("Open(%q) error %q does not list the valid forms", spec, err)
		}
	}
}

type productDevice struct{ *Sim }

func (productDevice) Name() string    { return "NVIDIA T4 (GPU-0f1e2d3c)" }
func (productDevice) Product() string { return "NVIDIA T4" }

func TestKindIsTheProductNotTheInstance(t *testing.T) {
	if k := Kind(NewSim(1)); k != "sim" {
		t.Errorf("Kind(sim) = %q, want sim", k)
	}
	if k := Kind(productDevice{NewSim(1)}); k != "NVIDIA T4" {
		t.Errorf("Kind of a GPU = %q, want its product name without the UUID", k)
	}
}
