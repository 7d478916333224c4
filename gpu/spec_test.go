package gpu

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParseSpec(t *testing.T) {
	for in, want := range map[string]Spec{
		"sim": {Kind: "sim"}, "auto": {Kind: "auto"}, "cuda:0": {Kind: "cuda"}, "cuda:3": {Kind: "cuda", Index: 3},
		"nvml:12": {Kind: "nvml", Index: 12},
	} {
		got, err := ParseSpec(in)
		if err != nil || got != want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if got.String() != in {
			t.Errorf("ParseSpec(%q).String() = %q", in, got.String())
		}
	}
}

func TestParseSpecBad(t *testing.T) {
	for _, spec := range []string{"", "gpu", "SIM", "cuda", "cuda:", "cuda:-1", "cuda:+1", "cuda:x", "nvml:1.5", "rocm:0", " sim"} {
		_, err := ParseSpec(spec)
		if err == nil {
			t.Errorf("ParseSpec(%q): no error", spec)
			continue
		}
		if errors.Is(err, ErrNoDevice) {
			t.Errorf("ParseSpec(%q) = %v: a bad spec must not read as a missing device", spec, err)
		}
		if !strings.Contains(err.Error(), `"cuda:N"`) {
			t.Errorf("ParseSpec(%q) error %q does not list the valid forms", spec, err)
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

// String is the spec as ParseSpec reads it: only tests print a Spec.
func (s Spec) String() string {
	if s.Kind == "cuda" || s.Kind == "nvml" {
		return s.Kind + ":" + strconv.Itoa(s.Index)
	}
	return s.Kind
}
