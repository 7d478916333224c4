package main

import (
	"fmt"
	"log/slog"

	"github.com/vramq/vramq/gpu"
)

// closingModel is a model that holds device memory until closed.
type closingModel interface {
	gpu.Model
	Close() error
}

// openSim opens the simulated device of -vram bytes and loads the CPU
// reference model onto it: the backend of every build, and the only one of
// a build without CUDA.
func openSim(o *options, log *slog.Logger) (gpu.Device, closingModel, error) {
	dev := gpu.NewSim(int64(o.vram))
	log.Warn("the device is SIMULATED: memory is accounted by vramq, the model runs on the CPU", "capacity", gpu.FormatBytes(int64(o.vram)))
	mcfg := gpu.DefaultEmbedConfig()
	mcfg.Seed = o.modelSeed
	model, err := gpu.NewEmbedder(gpu.GenerateEmbedWeights(mcfg), mcfg, dev)
	if err != nil {
		return nil, nil, fmt.Errorf("loading the model: %w", err)
	}
	return dev, model, nil
}
