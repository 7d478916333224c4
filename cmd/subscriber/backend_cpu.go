//go:build !cuda

package main

import (
	"fmt"
	"log/slog"

	"github.com/vramq/vramq/gpu"
)

// cudaBuild is whether this binary runs models on a GPU (-gpu-precision).
const cudaBuild = false

const deviceHelp = "device: sim (simulated memory, the model on the CPU), auto (sim in this build),\n" +
	"or cuda:N (needs the CUDA build, bin/subscriber-cuda from make cuda)"

// checkDevice accepts the specs (gpu.Spec) this build can run: without CUDA
// the model runs on the CPU, so the only device whose memory means anything
// to it is the simulated one. An NVML index names a GPU whose memory the
// CPU model does not use, so it is refused as any other unknown form.
func checkDevice(spec string) error {
	s, err := gpu.ParseSpec(spec)
	switch {
	case err != nil || s.Kind == "nvml":
		return fmt.Errorf("want sim, auto or cuda:N")
	case s.Kind == "cuda":
		return fmt.Errorf("this binary is built without CUDA; run bin/subscriber-cuda (make cuda) on a GPU, or -device=sim")
	}
	return nil
}

func openBackend(o *options, log *slog.Logger) (gpu.Device, closingModel, error) {
	if o.device == "auto" {
		log.Info("-device=auto: this build has no CUDA backend, so the simulated device")
	}
	return openSim(o, log)
}
