//go:build cuda

package main

import "testing"

// The CUDA build loads the model by CUDA's numbering (gpu.Spec): cuda:N is
// device N, auto is 0, and an NVML index, whose GPU CUDA may number
// differently, is refused.
func TestCUDAIndex(t *testing.T) {
	for spec, want := range map[string]int{"auto": 0, "cuda:0": 0, "cuda:3": 3} {
		if got, err := cudaIndex(spec); err != nil || got != want {
			t.Errorf("cudaIndex(%q) = %d, %v; want %d", spec, got, err, want)
		}
	}
	for _, spec := range []string{"nvml:0", "sim", "tpu", "cuda:-1", "cuda:+1", ""} {
		if got, err := cudaIndex(spec); err == nil {
			t.Errorf("cudaIndex(%q) = %d, want an error", spec, got)
		}
	}
	if err := checkDevice("nvml:1"); err == nil {
		t.Error("checkDevice(nvml:1) accepted an NVML index")
	}
}
