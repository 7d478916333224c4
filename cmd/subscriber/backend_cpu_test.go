//go:build !cuda

package main

import (
	"strings"
	"testing"
)

// Without CUDA the binary runs the model on the CPU over the simulated
// device: the specs of gpu.Spec that name a GPU are refused, cuda:N with a
// pointer to the CUDA build, and an NVML index as any unknown form.
func TestCheckDeviceWithoutCUDA(t *testing.T) {
	for spec, want := range map[string]string{
		"sim": "", "auto": "",
		"cuda:0": "built without CUDA", "cuda:7": "built without CUDA",
		"nvml:0": "want sim, auto or cuda:N", "tpu": "want sim, auto or cuda:N",
		"cuda:x": "want sim, auto or cuda:N", "": "want sim, auto or cuda:N",
	} {
		err := checkDevice(spec)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("checkDevice(%q) = %v, want %q", spec, err, want)
		}
	}
}
