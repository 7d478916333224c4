//go:build !cuda

package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/vramq/vramq/gpu"
)

const deviceHelp = "device: sim (simulated memory, the model on the CPU), auto (sim in this build),\nor cuda:N (needs the CUDA build, bin/subscriber-cuda from `make cuda`)"

// checkDevice accepts the specs this build can run: without CUDA the model
// runs on the CPU, so the only device whose memory means anything to it is
// the simulated one.
func checkDevice(spec string) error {
	switch {
	case spec == "sim" || spec == "auto":
		return nil
	case strings.HasPrefix(spec, "cuda:"):
		return fmt.Errorf("this binary is built without CUDA; run bin/subscriber-cuda (make cuda) on a GPU, or -device=sim")
	}
	return fmt.Errorf("want sim, auto or cuda:N")
}

func openBackend(o *options, log *slog.Logger) (gpu.Device, closingModel, error) {
	if o.device == "auto" {
		log.Info("-device=auto: this build has no CUDA backend, so the simulated device")
	}
	return openSim(o, log)
}
